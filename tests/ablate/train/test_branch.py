"""Decay branches in the trainer (``ablate.train.branch``): a wsd trunk saves the branch checkpoints
of its family's shorter budgets, a branch starts from its own and ends bit-identical to the run
trained to its budget from step 0, random streams included; without its checkpoint it trains from
step 0 with the same numbers; one whose checkpoint is damaged is not ready (as ``ablate plan``
finds it), sets it aside (kept) and trains from step 0; a checkpoint that is not its family's, or that would run code, is refused. (That the trunk
trains as a run without branch saves: ``tests/ablate/driver/test_branches.py``.)"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
import torch
from test_untrusted import Payload

from ablate.data import DataConfig
from ablate.errors import CheckpointError
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train
from ablate.train.branch import Branches, branch_point, family_hash
from ablate.train.checkpoint import CHECKPOINT, load_file
from backends import Recipe

# budgets 8, 12, 16 of one wsd config: decays of 2, 2, 3 steps from steps 6, 10, 13; evaluations
# every 3 steps, so the branch at 6 starts on an evaluation and the one at 10 between two
TRAIN = TrainConfig(
    steps=16, batch_size=4, seq_len=32, warmup_steps=2, eval_every=3, eval_batches=1,
    schedule="wsd", lr=3e-3,
)  # fmt: skip
SR = Recipe.from_shorthand(["wgrad"], "sr")  # stochastic rounding: random streams matter
SERIES = ("train_loss", "grad_norm", "lr", "tokens", "val_loss", "val_ppl", "val_loss_by_tokens")


def cfg(steps: int, where: Path | None = None) -> RunConfig:
    return RunConfig(
        train=dataclasses.replace(TRAIN, steps=steps),
        data=DataConfig(val_tokens=2048),
        recipe=SR,
        device="cpu",
        checkpoint_dir=None if where is None else str(where),
    )


def weights(where: Path) -> dict[str, torch.Tensor]:
    return load_file(where / CHECKPOINT)["model"]


def points(log: MemoryLogger, after: int = -1) -> dict[str, list[tuple[int, float]]]:
    """Every series the run logged, at steps after ``after`` (by-token points: after its tokens)."""
    out = {}
    for name in SERIES:
        limit = after * TRAIN.tokens_per_step if name.endswith("_by_tokens") else after
        out[name] = [(s, v) for s, v in log.series(name) if s > limit]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The trunk (16 steps, saving at 6 and 10), and the budgets 8 and 12 trained directly."""
    tmp = tmp_path_factory.mktemp("branch")
    family = family_hash(cfg(16))
    trunk_branches = Branches(root=str(tmp / "family"), family=family, save_at=(6, 10))
    out = {"tmp": tmp, "family": family, "root": str(tmp / "family")}
    for steps in (8, 12, 16):
        log = MemoryLogger()
        b = trunk_branches if steps == 16 else None
        out[steps] = (train(cfg(steps, tmp / f"direct{steps}"), log, branches=b), log)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("steps, point", [(8, 6), (12, 10)])
def test_a_decay_branch_is_bit_identical_to_the_run_trained_to_its_budget(runs, steps, point):
    tmp = runs["tmp"]
    assert branch_point(cfg(steps)) == point
    branches = Branches(root=runs["root"], family=runs["family"], start_at=point)
    assert branches.ready(point) and branches.start == point
    saved = load_file(branches.dir(point) / CHECKPOINT)  # the trunk's state there, family-keyed
    assert saved["config_hash"] == runs["family"] and saved["state"]["step"] == point
    log = MemoryLogger()
    where = tmp / f"branch{steps}"
    res = train(cfg(steps, where), log, stop_after=point + 1, branches=branches)  # interrupted
    assert res.status == "stopped"
    res = train(cfg(steps, where), log, branches=branches)  # resumes from its own checkpoint
    direct, direct_log = runs[steps]
    assert res.status == "finished" and res.evals == direct.evals  # the trunk's evaluations too
    # it trained only its decay, and logged those steps once each
    assert [s for s, _ in log.series("train_loss")] == list(range(point + 1, steps + 1))
    assert points(log) == points(direct_log, after=point)
    a, b = weights(where), weights(tmp / f"direct{steps}")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_branch_without_its_checkpoint_trains_from_step_0_with_the_same_numbers(runs, tmp_path):
    branches = Branches(root=str(tmp_path / "none"), family=runs["family"], start_at=6)
    assert branches.start is None
    log = MemoryLogger()
    res = train(cfg(8), log, branches=branches)
    direct, direct_log = runs[8]
    assert res.evals == direct.evals and points(log) == points(direct_log)
    assert log.series("train_loss")[0][0] == 1


def _branch_checkpoint(tmp_path: Path, content: bytes) -> tuple[Branches, Path]:
    """A branch checkpoint at step 6 whose sidecar is right and whose file holds ``content``."""
    family = family_hash(cfg(8))
    step_dir = tmp_path / f"step-{6:09d}"
    step_dir.mkdir()
    (step_dir / "checkpoint.json").write_text(
        json.dumps({"step": 6, "status": None, "config_hash": family})
    )
    (step_dir / CHECKPOINT).write_bytes(content)
    return Branches(root=str(tmp_path), family=family, start_at=6), step_dir


def _truncated() -> bytes:
    """A ``torch.save`` file cut in half (as a full disk leaves one): no zip directory."""
    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(256)}, "state": {"step": 6}}, buf)
    return buf.getvalue()[: len(buf.getvalue()) // 2]


@pytest.mark.parametrize(
    "content", [b"\x80\x02not a checkpoint", b"PK\x03\x04" + bytes(5000), _truncated()]
)
def test_a_damaged_branch_checkpoint_is_set_aside_and_the_branch_trains_from_step_0(
    tmp_path, content
):
    branches, step_dir = _branch_checkpoint(tmp_path, content)
    # not ready (as `ablate plan` and the worker find it from its zip directory): from step 0
    assert not branches.ready(6) and branches.start is None
    assert branches.damage(6) == f"{step_dir / CHECKPOINT}: damaged or not a checkpoint file " + (
        "(BadZipFile: File is not a zip file)"
    )
    log = MemoryLogger()
    with pytest.warns(RuntimeWarning, match=rf"{step_dir}/{CHECKPOINT}: damaged.*step 0"):
        res = train(cfg(8), log, branches=branches)
    assert res.status == "finished" and log.series("train_loss")[0][0] == 1
    (aside,) = tmp_path.glob(f"{step_dir.name}.damaged-*")
    assert (aside / CHECKPOINT).read_bytes() == content and not step_dir.exists()


def test_a_poisoned_branch_checkpoint_is_refused_naming_it(tmp_path):
    marker = tmp_path / "ran"
    buf = io.BytesIO()
    torch.save({"model": Payload(marker)}, buf)  # torch's format: ready (its zip directory whole)
    branches, step_dir = _branch_checkpoint(tmp_path, buf.getvalue())
    assert branches.ready(6)
    with pytest.raises(CheckpointError, match=rf"{step_dir}/{CHECKPOINT}: refused, not loaded"):
        train(cfg(8), branches=branches)
    assert not marker.exists() and (step_dir / CHECKPOINT).exists()


@pytest.mark.parametrize("sidecar", ["[]", "{not json", '{"step": "6"}', '{"step": 6}'])
def test_a_branch_checkpoint_with_a_damaged_sidecar_is_not_ready(tmp_path, sidecar):
    family = family_hash(cfg(8))
    branches = Branches(root=str(tmp_path), family=family, start_at=6)
    branches.dir(6).mkdir()
    (branches.dir(6) / "checkpoint.json").write_text(sidecar)
    assert not branches.ready(6) and branches.start is None


def test_a_branch_checkpoint_whose_file_is_missing_is_not_ready(tmp_path):
    # the sidecar alone names no checkpoint: the trainer would find none there and train the
    # branch from step 0, so the plan and the worker must not count it from its point
    branches, step_dir = _branch_checkpoint(tmp_path, b"")
    (step_dir / CHECKPOINT).unlink()
    assert not branches.ready(6) and branches.start is None


def test_a_family_is_a_config_less_its_budget():
    f = family_hash(cfg(16))
    assert family_hash(cfg(8)) == f
    extended = dataclasses.replace(TRAIN, steps=24, schedule_steps=16)
    assert family_hash(dataclasses.replace(cfg(8), train=extended)) == f
    for other in (
        dataclasses.replace(cfg(16), seed=1),
        dataclasses.replace(cfg(16), recipe=Recipe.bf16()),
        dataclasses.replace(cfg(16), train=dataclasses.replace(TRAIN, lr=1e-3)),
        dataclasses.replace(cfg(16), train=dataclasses.replace(TRAIN, decay_fraction=0.3)),
    ):
        assert family_hash(other) != f
    assert branch_point(dataclasses.replace(cfg(16), train=dataclasses.replace(TRAIN, schedule="cosine"))) is None  # fmt: skip
    no_stable = dataclasses.replace(TRAIN, steps=8, warmup_steps=0, decay_fraction=1.0)
    assert branch_point(dataclasses.replace(cfg(8), train=no_stable)) is None  # nothing shared


@pytest.mark.parametrize(
    "branches, match",
    [
        (Branches(root="x", family="0" * 16, start_at=6), "not of family"),
        (Branches(root="x", family="", start_at=5), "starts at its decay start \\(6\\), not at 5"),
        (Branches(root="x", family="", save_at=(6, 7)), "only before its own decay.*\\[7\\]"),
    ],
)
def test_branches_that_do_not_fit_the_run_are_refused(branches, match):
    run = cfg(8)
    if not branches.family:
        branches = dataclasses.replace(branches, family=family_hash(run))
    with pytest.raises(ValueError, match=f"branches: .*{match}"):
        train(run, branches=branches)


@pytest.mark.slow
def test_budgets_trained_past_their_schedule_branch_like_any_other(tmp_path):
    # a study's baseline under baseline_extend: each budget trains on at its floor past its
    # schedule (schedule_steps); the 9-step cell (schedule 6: decays at step 5) branches off the
    # 15-step one (schedule 10: decays at step 8) and trains its decay and its extension
    def extended(steps: int, schedule: int, where: Path) -> RunConfig:
        train = dataclasses.replace(TRAIN, steps=steps, schedule_steps=schedule)
        return dataclasses.replace(cfg(steps, where), train=train)

    family = family_hash(extended(15, 10, tmp_path))
    assert family_hash(extended(9, 6, tmp_path)) == family
    assert branch_point(extended(9, 6, tmp_path)) == 5
    root = str(tmp_path / "family")
    train(extended(15, 10, tmp_path / "trunk"), branches=Branches(root, family, save_at=(5,)))
    direct_log, branch_log = MemoryLogger(), MemoryLogger()
    direct = train(extended(9, 6, tmp_path / "direct"), direct_log)
    branch = train(
        extended(9, 6, tmp_path / "branch"), branch_log, branches=Branches(root, family, start_at=5)
    )
    assert branch.evals == direct.evals and points(branch_log) == points(direct_log, after=5)
    a, b = weights(tmp_path / "branch"), weights(tmp_path / "direct")
    assert all(torch.equal(a[k], b[k]) for k in a)
