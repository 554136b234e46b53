"""Checkpoints are untrusted files: a pickle that would run code is refused, unread, wherever the
project loads one (a resumed run, ``ablate adopt``'s re-key, ``ablate export`` of a one-process or a
sharded checkpoint: its train state, its DCP metadata and its non-tensor entries, a run's RNG
state, ``ablate probe``); a damaged, truncated or empty file is refused with its name."""

from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ablate.cli import main
from ablate.errors import CheckpointError
from ablate.export.weights import read_checkpoint
from ablate.train import RunConfig, train
from ablate.train.checkpoint import (
    CHECKPOINT,
    load_checkpoint,
    load_file,
    rekey_checkpoint,
)
from ablate.train.untrusted import dcp_load

ROOT = Path(__file__).resolve().parents[3]


class Payload:
    """Unpickled without restriction, it creates ``marker``: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _cfg(tmp: Path) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"preset": "tiny", "n_layers": 1},
            "data": {"val_tokens": 2048},
            "device": "cpu",
            "checkpoint_dir": str(tmp / "ck"),
            "train": {"steps": 2, "batch_size": 2, "seq_len": 16, "eval_every": 2},
        }
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[RunConfig, Path]:
    tmp = tmp_path_factory.mktemp("untrusted")
    cfg = _cfg(tmp)
    train(cfg)
    return cfg, Path(cfg.checkpoint_dir or "")


def _poisoned(path: Path, marker: Path, keep: dict | None = None) -> None:
    """Replace ``path`` by a checkpoint-shaped dict (``keep``'s entries) with the payload in it."""
    torch.save({**(keep or {}), "extra": Payload(marker)}, path)


def test_the_payload_runs_when_unpickled_without_restriction(tmp_path):
    """The control: the poisoned file is live (so the refusals below are real)."""
    marker = tmp_path / "ran"
    _poisoned(tmp_path / "x.pt", marker)
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert marker.exists()


def test_a_resumed_run_refuses_a_poisoned_checkpoint_unread(trained, tmp_path):
    cfg, ck = trained
    bad = tmp_path / "ck"
    bad.mkdir()
    marker = tmp_path / "ran"
    good = load_file(ck / CHECKPOINT)
    _poisoned(bad / CHECKPOINT, marker, good)
    from ablate.model import build_model

    model = build_model(cfg.model, 257, recipe=cfg.recipe, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError, match=r"refused, not loaded.*could run code"):
        load_checkpoint(
            bad, config_hash=good["config_hash"], model=model, optimizer=opt, sampler=None
        )  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="refused, not loaded"):
        rekey_checkpoint(bad, "0" * 16)
    with pytest.raises(CheckpointError, match="refused, not loaded"):
        read_checkpoint(bad)
    assert not marker.exists()


def test_a_resumed_cell_with_a_poisoned_checkpoint_fails_naming_it(trained, tmp_path):
    """Through the trainer itself: the cell stops before step 0 with the file named."""
    cfg, ck = trained
    marker = tmp_path / "ran"
    mine = _cfg(tmp_path)
    Path(mine.checkpoint_dir or "").mkdir()
    _poisoned(Path(mine.checkpoint_dir or "") / CHECKPOINT, marker, load_file(ck / CHECKPOINT))
    with pytest.raises(CheckpointError, match=re.escape(str(mine.checkpoint_dir))):
        train(mine)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "a list", "no model"])
def test_a_damaged_checkpoint_is_refused_with_its_name(trained, tmp_path, damage):
    _, ck = trained
    raw = (ck / CHECKPOINT).read_bytes()
    bad = tmp_path / CHECKPOINT
    if damage == "empty":
        bad.write_bytes(b"")
    elif damage == "truncated":
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":  # many kinds of garbage: the unpickler fails in many ways
        rng = random.Random(0)
        for n in range(200):
            junk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 64, 4096))))
            if n % 2:  # a pickle's opening bytes, then garbage: deeper into the unpickler
                junk = b"\x80\x02" + junk
            bad.write_bytes(junk)
            with pytest.raises(CheckpointError, match=re.escape(str(bad))):
                load_file(bad, keys=("config_hash", "state", "model"))
    elif damage == "a list":
        torch.save([1, 2], bad)
    else:
        d = load_file(ck / CHECKPOINT)
        del d["model"]
        torch.save(d, bad)
    with pytest.raises(CheckpointError, match=re.escape(str(bad))):
        load_file(bad, keys=("config_hash", "state", "model"))


def _sharded(tmp: Path) -> Path:
    """A sharded checkpoint as a distributed run writes it (DCP shards, train state, RNG state,
    the sidecar naming it), written here in one process."""
    import json

    import torch.distributed.checkpoint as dcp

    from ablate.train.checkpoint import TRAIN_STATE_KEYS

    d = tmp / "sharded-run"
    step = d / "sharded" / "step-000000002-abcd1234"
    step.mkdir(parents=True)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(step), no_dist=True)
    ts = {"config_hash": "f" * 16, "state": {"step": 2, "status": "finished", "evals": []}}
    ts |= {"sampler": {}, "world": 2, "parallel": "fsdp"}
    assert set(ts) == set(TRAIN_STATE_KEYS)
    torch.save(ts, step / "train_state.pt")
    torch.save({"rng_cpu": torch.get_rng_state(), "rng_cuda": None}, step / "rng-rank0.pt")
    rel = step.relative_to(d).as_posix()
    (d / "checkpoint.json").write_text(
        json.dumps(
            {
                "step": 2,
                "status": "finished",
                "config_hash": "f" * 16,
                "format": "sharded",
                "path": rel,
            }
        )
    )
    return step


def test_a_sharded_checkpoint_reads_and_its_poisoned_parts_are_refused(tmp_path):
    step = _sharded(tmp_path)
    run = step.parents[1]
    w = read_checkpoint(run)  # the control: the untouched checkpoint reads
    assert w.format == "sharded" and set(w.state) == {"weight", "bias"} and w.step == 2
    marker = tmp_path / "ran"

    # its DCP metadata: DCP itself would unpickle it with plain pickle
    meta = (step / ".metadata").read_bytes()
    (step / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused, not loaded"):
        read_checkpoint(run)
    (step / ".metadata").write_bytes(meta[: len(meta) // 3])
    with pytest.raises(CheckpointError, match=r"\.metadata: damaged"):
        read_checkpoint(run)
    (step / ".metadata").write_bytes(meta)

    # its train state and a rank's RNG state
    ts = load_file(step / "train_state.pt")
    _poisoned(step / "train_state.pt", marker, ts)
    with pytest.raises(CheckpointError, match=r"train_state\.pt: refused"):
        read_checkpoint(run)
    torch.save(ts, step / "train_state.pt")
    _poisoned(step / "rng-rank0.pt", marker)
    with pytest.raises(CheckpointError, match=r"rng-rank0\.pt: refused"):
        load_file(step / "rng-rank0.pt", keys=("rng_cpu", "rng_cuda"))
    assert not marker.exists()


def test_a_poisoned_non_tensor_entry_of_a_sharded_checkpoint_is_refused(tmp_path):
    """DCP saves a state dict's non-tensor values as pickles and loads them with
    ``weights_only=False``; ``dcp_load`` reads them as tensors and plain values only."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    good, bad = tmp_path / "good", tmp_path / "bad"
    dcp.save({"w": torch.ones(2), "lr": 0.5}, checkpoint_id=str(good), no_dist=True)
    dcp.save({"w": torch.ones(2), "lr": Payload(marker)}, checkpoint_id=str(bad), no_dist=True)
    state = {"w": torch.zeros(2), "lr": 0.0}
    dcp_load(state, good, no_dist=True)
    assert state["lr"] == 0.5 and torch.equal(state["w"], torch.ones(2))
    with pytest.raises(CheckpointError, match="checkpoint entry lr: refused, not loaded"):
        dcp_load({"w": torch.zeros(2), "lr": 0.0}, bad, no_dist=True)
    assert not marker.exists()


def test_export_of_a_poisoned_checkpoint_exits_2_without_running_it(trained, tmp_path):
    cfg, ck = trained
    study = tmp_path / "s.yaml"
    study.write_text(
        "name: poisoned\nbase:\n  model: {preset: tiny, n_layers: 1}\n  data: {val_tokens: 2048}\n"
        "  train: {steps: 2, batch_size: 2, seq_len: 16, eval_every: 2}\ngrid:\n  - seed: [0]\n"
    )
    from ablate.study import load_study

    s = load_study(study, output=tmp_path / "out")
    cell = s.cells[0]
    d = s.checkpoint_dir(cell)
    d.mkdir(parents=True)
    marker = tmp_path / "ran"
    _poisoned(d / CHECKPOINT, marker, load_file(ck / CHECKPOINT))
    args = ["export", str(study), "--output", str(tmp_path / "out"), "--cell", cell.label]
    res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "hf")])
    assert res.exit_code == 2, res.output
    assert "refused, not loaded" in res.output and str(d / CHECKPOINT) in res.output
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_no_module_unpickles_without_restriction():
    """Every load of a file goes through ``load_file``/``dcp_load`` (tensors and plain values)."""
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for base in ("ablate", "backends")
        for p in (ROOT / base).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"weights_only\s*=\s*False|pickle\.loads?\(", line)
        and not line.lstrip().startswith("#")
    ]
    assert found == [], f"unrestricted unpickling at {found}: use ablate.train.checkpoint.load_file"
