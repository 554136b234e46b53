"""Checkpoints: what they hold, the sidecar (a damaged one counts as none, and the step is read from
the checkpoint itself; one whose ``checkpoint.pt`` is missing names none), a damaged checkpoint found from the ends of its files (``ablate plan``)
and as a run finds it before training (``load_damage``), refusal of another configuration, and that a checkpoint in the layout written before
``TrainState`` existed (a plain ``"state"`` dict) still resumes."""

from __future__ import annotations

import errno
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from test_untrusted import Payload

from ablate.data import BatchSampler, DataConfig
from ablate.errors import DamagedCheckpointError
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train
from ablate.train.checkpoint import (
    CHECKPOINT,
    checkpoint_info,
    checkpoint_missing,
    checkpoint_step,
    load_checkpoint,
    load_file,
    move_aside,
    save_checkpoint,
)
from ablate.train.config import config_hash
from ablate.train.damage import checkpoint_damage, load_damage
from ablate.train.result import EvalPoint
from ablate.train.state import TrainState

FAST = TrainConfig(
    steps=8, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=2, eval_every=4, eval_batches=1
)
KEYS = ["config_hash", "state", "model", "optimizer", "sampler", "rng_cpu", "rng_cuda"]
STATE_KEYS = [
    "step",
    "tokens",
    "train_time",
    "evals",
    "ema",
    "best_ema",
    "status",
    "reason",
    "diverged_at",
]


def _cfg(path) -> RunConfig:
    return RunConfig(train=FAST, data=DataConfig(val_tokens=4096), checkpoint_dir=str(path))


def _parts(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, BatchSampler]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sampler = BatchSampler(torch.arange(1000), 8, 2, data_seed=0)
    for _ in range(seed + 1):  # a different data position per seed
        sampler.next()
    return model, opt, sampler


def test_checkpoint_info_reads_the_sidecar(tmp_path):
    assert checkpoint_info(tmp_path / "missing") is None
    (tmp_path / "checkpoint.json").write_text("{not json")
    assert checkpoint_info(tmp_path) is None
    model, opt, sampler = _parts()
    state = TrainState(step=3, tokens=48, status="finished")
    save_checkpoint(
        tmp_path / "ck", config_hash="abc", state=state, model=model, optimizer=opt, sampler=sampler
    )
    assert checkpoint_info(tmp_path / "ck") == {
        "step": 3,
        "status": "finished",
        "config_hash": "abc",
    }
    assert checkpoint_info(str(tmp_path / "ck")) == checkpoint_info(tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["checkpoint.json", CHECKPOINT]


def test_save_then_load_restores_everything(tmp_path):
    model, opt, sampler = _parts(0)
    state = TrainState(
        step=5, tokens=80, evals=[EvalPoint(step=4, tokens=64, val_loss=2.0)], ema=1.5
    )
    torch.manual_seed(123)
    save_checkpoint(
        tmp_path, config_hash="h", state=state, model=model, optimizer=opt, sampler=sampler
    )
    expected_draw = torch.rand(3)
    ck = torch.load(tmp_path / CHECKPOINT, weights_only=False)
    assert list(ck) == KEYS and list(ck["state"]) == STATE_KEYS and ck["state"] == state.to_dict()

    m2, o2, s2 = _parts(1)
    loaded = load_checkpoint(tmp_path, config_hash="h", model=m2, optimizer=o2, sampler=s2)
    assert loaded == state
    assert torch.equal(torch.rand(3), expected_draw)  # the CPU RNG continues where it was saved
    for k, v in model.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    assert s2.state_dict() == sampler.state_dict()
    assert torch.equal(
        o2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )
    assert (
        load_checkpoint(
            tmp_path / "none",
            config_hash="h",
            model=m2,
            optimizer=o2,
            sampler=s2,
        )
        is None
    )


def test_another_configuration_is_refused_with_the_paths_and_hashes(tmp_path):
    model, opt, sampler = _parts()
    save_checkpoint(
        tmp_path, config_hash="aaa", state=TrainState(), model=model, optimizer=opt, sampler=sampler
    )
    msg = (
        f"checkpoint_dir: {tmp_path / CHECKPOINT} was written by a different configuration "
        "(aaa != bbb); use a new checkpoint_dir for a new config"
    )
    with pytest.raises(ValueError) as e:
        load_checkpoint(
            tmp_path,
            config_hash="bbb",
            model=model,
            optimizer=opt,
            sampler=sampler,
        )
    assert str(e.value) == msg


def test_a_checkpoint_in_the_old_layout_resumes_bit_exactly(tmp_path):
    whole = MemoryLogger()
    res_a = train(_cfg(tmp_path / "a"), whole)

    cfg = _cfg(tmp_path / "b")
    parts = MemoryLogger()
    train(cfg, parts, stop_after=5)
    path = tmp_path / "b" / CHECKPOINT
    new = torch.load(path, weights_only=False)
    assert list(new) == KEYS and list(new["state"]) == STATE_KEYS
    # rewrite it by hand as the trainer wrote it before TrainState: a plain dict, no sidecar
    st = new["state"]
    old = {
        "config_hash": config_hash(cfg),
        "state": {
            "step": 5,
            "tokens": 5 * FAST.tokens_per_step,
            "train_time": st["train_time"],
            "evals": [
                {"step": 0, "tokens": 0, "val_loss": st["evals"][0]["val_loss"]},
                {
                    "step": 4,
                    "tokens": 4 * FAST.tokens_per_step,
                    "val_loss": st["evals"][1]["val_loss"],
                },
            ],
            "ema": st["ema"],
            "best_ema": st["best_ema"],
            "status": None,
            "reason": "",
            "diverged_at": None,
        },
        "model": new["model"],
        "optimizer": new["optimizer"],
        "sampler": new["sampler"],
        "rng_cpu": new["rng_cpu"],
        "rng_cuda": None,
    }
    torch.save(old, path)
    (tmp_path / "b" / "checkpoint.json").unlink()

    res_b = train(cfg, parts)
    assert res_b.status == "finished" and res_b.steps == FAST.steps
    assert [s for s, m in parts.metrics if "val_ppl_by_tokens" not in m] == list(
        range(FAST.steps + 1)
    )
    assert parts.series("train_loss") == whole.series("train_loss")
    assert [e.val_loss for e in res_b.evals] == [e.val_loss for e in res_a.evals]
    wa = torch.load(tmp_path / "a" / CHECKPOINT, weights_only=False)["model"]
    wb = torch.load(path, weights_only=False)["model"]
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert json.loads((tmp_path / "b" / "checkpoint.json").read_text())["status"] == "finished"


SHARDED_INFO = {
    "step": 3, "status": None, "config_hash": "abc", "format": "sharded",
    "path": "sharded/step-000000003-0a1b2c3d", "world": 2, "parallel": "ddp",
}  # fmt: skip


@pytest.mark.parametrize(
    "sidecar",
    [
        [],
        "x",
        3,
        None,
        {},
        {"step": "3", "status": None, "config_hash": "abc"},
        {"step": True, "status": None, "config_hash": "abc"},
        {"step": -1, "status": None, "config_hash": "abc"},
        {"step": 3.0, "status": None, "config_hash": "abc"},
        {"step": 3, "status": 1, "config_hash": "abc"},
        {"step": 3, "status": None, "config_hash": ["abc"]},
        {"step": 3, "status": None},
        {"step": 3, "status": None, "config_hash": "abc", "format": "other"},
        SHARDED_INFO | {"path": "/etc"},
        SHARDED_INFO | {"path": "sharded/../../elsewhere"},
        SHARDED_INFO | {"path": "sharded/.."},
        SHARDED_INFO | {"path": 7},
        SHARDED_INFO | {"world": "2"},
        SHARDED_INFO | {"world": 0},
        SHARDED_INFO | {"parallel": None},
    ],
)
def test_a_sidecar_that_is_json_but_not_a_sidecar_counts_as_none(tmp_path, sidecar):
    (tmp_path / "checkpoint.json").write_text(json.dumps(sidecar))
    assert checkpoint_info(tmp_path) is None
    (tmp_path / "checkpoint.json").write_text(json.dumps(SHARDED_INFO))
    assert checkpoint_info(tmp_path) == SHARDED_INFO


def test_without_a_usable_sidecar_the_step_is_read_from_the_checkpoint(tmp_path):
    assert checkpoint_step(tmp_path) is None
    model, opt, sampler = _parts()
    state = TrainState(step=3, tokens=48)
    save_checkpoint(
        tmp_path, config_hash="abc", state=state, model=model, optimizer=opt, sampler=sampler
    )
    assert checkpoint_step(tmp_path) == 3
    (tmp_path / "checkpoint.json").write_text('{"step": "abc"}')
    assert checkpoint_step(tmp_path) == 3  # as load_checkpoint resumes: from the file's step
    (tmp_path / "checkpoint.json").unlink()
    assert checkpoint_step(tmp_path) == 3
    raw = (tmp_path / CHECKPOINT).read_bytes()
    (tmp_path / CHECKPOINT).write_bytes(raw[: len(raw) // 2])
    assert checkpoint_step(tmp_path) is None


def test_a_sidecar_whose_checkpoint_is_missing_names_no_step_to_resume_from(tmp_path):
    """As ``load_checkpoint`` finds none there, the run trains from step 0; ``plan`` says why from
    the step the sidecar names. A sharded one's missing files are damage (set aside) instead."""
    model, opt, sampler = _parts()
    save_checkpoint(
        tmp_path, config_hash="abc", state=TrainState(step=3), model=model, optimizer=opt,
        sampler=sampler,
    )  # fmt: skip
    assert (checkpoint_step(tmp_path), checkpoint_missing(tmp_path)) == (3, None)
    (tmp_path / CHECKPOINT).unlink()
    assert checkpoint_info(tmp_path) is not None  # the sidecar is sound
    assert (checkpoint_step(tmp_path), checkpoint_missing(tmp_path)) == (None, 3)
    assert (
        load_checkpoint(tmp_path, config_hash="abc", model=model, optimizer=opt, sampler=sampler)
        is None
    )
    (tmp_path / "checkpoint.json").write_text(json.dumps(SHARDED_INFO))
    assert (checkpoint_step(tmp_path), checkpoint_missing(tmp_path)) == (3, None)
    assert checkpoint_damage(tmp_path) is not None
    assert checkpoint_missing(tmp_path / "none") is None


def test_a_damaged_checkpoint_is_found_from_the_ends_of_its_files_unread(tmp_path):
    """What ``ablate plan`` tells of a checkpoint behind a sound sidecar, reading its zip directory
    alone: the damage a run then finds, and no damage in a sound file, nor in a poisoned one (it
    is not unpickled: the run refuses it)."""
    assert checkpoint_damage(tmp_path / "none") is None
    model, opt, sampler = _parts()
    state = TrainState(step=3, tokens=48)
    save_checkpoint(
        tmp_path, config_hash="abc", state=state, model=model, optimizer=opt, sampler=sampler
    )
    path = tmp_path / CHECKPOINT
    raw = path.read_bytes()
    assert checkpoint_damage(tmp_path) is None
    for bad in (raw[:-1], raw[: len(raw) // 2], raw[:100], b"", bytes(range(256)) * 20):
        path.write_bytes(bad)
        assert checkpoint_info(tmp_path) is not None  # the sidecar is sound
        assert checkpoint_damage(tmp_path) == f"{path}: damaged or not a checkpoint file " + (
            "(BadZipFile: File is not a zip file)"
        )
        with pytest.raises(DamagedCheckpointError):  # as the run finds it
            load_file(path)
    with zipfile.ZipFile(path, "w") as z:  # a zip, not torch's
        z.writestr("notes.txt", "hello")
    assert checkpoint_damage(tmp_path) == f"{path}: not a checkpoint file (no data.pkl in it)"
    marker = tmp_path / "ran"
    torch.save({"state": state.to_dict(), "x": Payload(marker)}, path)
    assert checkpoint_damage(tmp_path) is None and not marker.exists()


def test_a_damaged_checkpoint_is_found_as_the_run_finds_it(tmp_path):
    """What a worker logs as the step its attempt starts from: damage that only a load finds (a
    pickle garbled behind a sound zip directory) too; none in a sound file, nor in a poisoned one
    (refused: the run fails on it), whose payload is not run."""
    assert load_damage(tmp_path / "none") is None
    model, opt, sampler = _parts()
    save_checkpoint(
        tmp_path, config_hash="abc", state=TrainState(step=3), model=model, optimizer=opt,
        sampler=sampler,
    )  # fmt: skip
    path, sound = tmp_path / CHECKPOINT, tmp_path / "sound.pt"
    assert load_damage(tmp_path) is None
    path.rename(sound)
    with zipfile.ZipFile(sound) as src, zipfile.ZipFile(path, "w") as dst:
        for i in src.infolist():
            data = src.read(i)
            dst.writestr(i, b"\0" * len(data) if i.filename.endswith("/data.pkl") else data)
    assert checkpoint_damage(tmp_path) is None  # the ends of its files are sound
    assert str(load_damage(tmp_path)).startswith(f"{path}: damaged or not a checkpoint file")
    path.write_bytes(sound.read_bytes()[:100])
    assert str(load_damage(tmp_path)).startswith(f"{path}: damaged or not a checkpoint file")
    marker = tmp_path / "ran"
    torch.save({**load_file(sound), "x": Payload(marker)}, path)
    assert load_damage(tmp_path) is None and not marker.exists()


def unreadable(path: Path, how: str) -> int:
    """Make the file ``path`` fail to read as a file system fails a read, not as damage does, and
    return the errno a read gets: ``eio``, a link to ``/proc/self/mem``, whose first page (address
    0, never mapped) reads with EIO, as a failing disk or a lost NFS server does; ``eacces``, its
    permissions taken away (which do not bind root: skipped there)."""
    if how == "eacces":
        if os.geteuid() == 0:
            pytest.skip("root reads a file whatever its permissions")
        path.chmod(0)
        return errno.EACCES
    if not Path("/proc/self/mem").exists():
        pytest.skip("no /proc/self/mem here")
    path.unlink()
    path.symlink_to("/proc/self/mem")
    return errno.EIO


@pytest.mark.parametrize("how", ["eio", "eacces"])
def test_a_checkpoint_the_file_system_fails_to_read_is_not_set_aside(tmp_path, how):
    """A read that fails for the file system's reasons is no damage: the attempt fails on it (and
    is retried, reading the file again), its checkpoint left where it is, not set aside."""
    ck = tmp_path / "ck"
    model, opt, sampler = _parts()
    kw = dict(model=model, optimizer=opt, sampler=sampler)
    save_checkpoint(ck, config_hash="abc", state=TrainState(step=3), **kw)
    code = unreadable(ck / CHECKPOINT, how)
    with pytest.raises(OSError) as e:
        load_checkpoint(ck, config_hash="abc", set_aside_damaged=True, **kw)
    assert e.value.errno == code
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # nothing set aside
    assert load_damage(ck) is None  # as its worker logs it: the step the sidecar names
    (ck / "checkpoint.json").unlink()
    assert checkpoint_step(ck) is None  # what plan reads without a sidecar: none to resume


def test_a_folder_moved_aside_twice_under_one_tag_keeps_both(tmp_path):
    """Two checkpoints set aside within the same second (one tag) are both kept, the second with
    a number: nothing moved aside is ever replaced."""
    cells = tmp_path / "cells"
    for n in range(3):
        (cells / "k").mkdir(parents=True)
        (cells / "k" / "checkpoint.pt").write_text(str(n))
        move_aside(cells / "k", "orphan-20261129-160000")
    kept = {p.name: (p / "checkpoint.pt").read_text() for p in cells.iterdir()}
    assert kept == {
        "k.orphan-20261129-160000": "0",
        "k.orphan-20261129-160000-1": "1",
        "k.orphan-20261129-160000-2": "2",
    }
