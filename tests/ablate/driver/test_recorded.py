"""A study recorded by earlier code: its cells were keyed under numerics 1 (the keys pinned here,
as the code before the layout change computed them, when every seed read batch order 0: the
study finds them with ``data: {data_seed: 0}``). This code keys them the same at
numerics 1, so nothing of the layout moved a key; its own numerics are newer, so the study resumed
now trains new cells instead of mixing two sets of numbers, and ``ablate adopt`` takes the old runs
over knowingly, after which every cell is found finished (a checkpoint it cannot read stops it
first, in one line, nothing adopted; one it reads moves, re-keyed, a sharded one too)."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import torch
from click.testing import CliRunner

from ablate.cli import main
from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.study import load_study
from ablate.tracking import StudyTracker
from ablate.train.checkpoint import CHECKPOINT, checkpoint_info, load_file
from ablate.train.config import config_hash

QUICKSTART = Path(__file__).parent / "quickstart_numerics1.yaml"
"""The quickstart as it was written when these runs were recorded (two seeds of eight recipes)."""
RECORDED = [
    "102bfa95ffa67696",
    "1105cedba6017bb8",
    "262d8e5bb085d50d",
    "3c700967c3db0fbe",
    "4d3ffdf6a96650ec",
    "6598c418a3809cd8",
    "811849d113a16e49",
    "96f068940779384a",
    "9a007da48651ceee",
    "9cd7518d4dcfd8b0",
    "a908ff38e3843e65",
    "bc1b9b8b57c9e91b",
    "ca97318674b60a56",
    "f1e288f86b42749a",
    "f264ce3c6b3f80dc",
    "fd653921c0c15777",
]
"""The quickstart's keys under numerics 1, every seed on batch order 0."""


def _sharded(folder: Path) -> Path:
    """A finished run's sharded checkpoint of one rank in ``folder``, under the key its name is,
    as ``save_sharded`` writes one (DCP shards, train state, RNG state, the sidecar naming them):
    its train state's path."""
    import torch.distributed.checkpoint as dcp

    step = folder / "sharded" / "step-000000008-0"
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save({"model": {"w": torch.zeros(2)}}, checkpoint_id=str(step), no_dist=True)
    state = {"step": 8, "status": "finished"}
    torch.save(
        {"config_hash": folder.name, "state": state, "sampler": {}, "world": 1, "parallel": "ddp"},
        step / "train_state.pt",
    )
    torch.save({"rng_cpu": torch.get_rng_state(), "rng_cuda": None}, step / "rng-rank0.pt")
    info = state | {"config_hash": folder.name, "format": "sharded", "path": f"sharded/{step.name}"}
    (folder / "checkpoint.json").write_text(json.dumps(info | {"world": 1, "parallel": "ddp"}))
    return step / "train_state.pt"


def _recorded_quickstart(tmp_path: Path, monkeypatch) -> tuple:
    """The study as a user has it (its file, its output folder, its store) and what the earlier code
    recorded: a finished run per cell, under the key it computed; (study, tracker, {old key:
    label})."""
    text = QUICKSTART.read_text()
    order0 = "data: {corpus: builtin, val_tokens: 8192, data_seed: 0}"
    (tmp_path / "quickstart.yaml").write_text(
        text.replace("data: {corpus: builtin, val_tokens: 8192}", order0)
    )
    monkeypatch.chdir(tmp_path)
    study = load_study(tmp_path / "quickstart.yaml")
    old = {config_hash(c.config, numerics=1): c.label for c in study.cells}
    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    parent = tracker.parent_run(study.text)
    for key in sorted(old):
        tracker.set_status(tracker.create_run(parent, key, old[key], {}, {}), "finished")
    return study, tracker, old


def test_a_run_that_cannot_be_re_tagged_is_named_with_its_cell_and_what_was_adopted(
    tmp_path, monkeypatch
):
    """A run deleted from the store between `adopt`'s listing and its re-tagging (another client,
    a real race) failed with MLflow's bare error, after its checkpoint had moved: the error names
    the cell, the run, where its checkpoint is now and how many runs were adopted before it."""
    import pytest
    from mlflow.tracking import MlflowClient

    from ablate.errors import AdoptError
    from ablate.tracking.adopt import adopt, adoptable

    study, tracker, _ = _recorded_quickstart(tmp_path, monkeypatch)
    found, _ = adoptable(study, tracker)
    third = found[2]
    old_dir = study.output_dir / "cells" / third.old_key
    old_dir.mkdir(parents=True)
    torch.save(
        {"config_hash": old_dir.name, "state": {"step": 8, "status": "finished"}, "model": {}}
        | {"optimizer": {}, "sampler": {}, "rng_cpu": torch.zeros(1), "rng_cuda": None},
        old_dir / CHECKPOINT,
    )
    found, _ = adoptable(study, tracker)  # now with its checkpoint
    MlflowClient(study.tracking_uri).delete_run(third.run_id)
    with pytest.raises(AdoptError) as e:
        adopt(study, tracker, found)
    msg = str(e.value)
    assert msg.startswith(f"{third.cell.label}: not adopted: its run {third.run_id} could not be ")
    assert str(study.checkpoint_dir(third.cell)) in msg and "2 runs adopted before it" in msg
    assert load_file(study.checkpoint_dir(third.cell) / CHECKPOINT)["config_hash"] == (
        third.cell.key
    )
    assert sum(1 for k in tracker.cell_runs() if k not in RECORDED) == 2  # the two before it


def test_a_quickstart_recorded_under_numerics_1_reruns_unless_adopted(tmp_path, monkeypatch):
    study, tracker, old = _recorded_quickstart(tmp_path, monkeypatch)
    assert sorted(old) == RECORDED  # the layout moved no key
    # resumed across the numerics change: every cell is new
    assert [p.action for p in plan(study)] == ["run"] * len(study.cells)
    # a checkpoint of an old run that the file system cannot read (an I/O error: /proc/self/mem
    # at offset 0) is no damage: exit 1 in one line naming the cell and the file, and nothing
    # adopted, the cells before it included
    cell = study.cells[3]
    old_dir = study.output_dir / "cells" / config_hash(cell.config, numerics=1)
    old_dir.mkdir(parents=True)
    (old_dir / CHECKPOINT).symlink_to("/proc/self/mem")
    res = CliRunner().invoke(main, ["adopt", "--yes", str(tmp_path / "quickstart.yaml")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.splitlines()[-1] == (
        f"Error: {cell.label}: not adopted: [Errno 5] Input/output error: '{old_dir / CHECKPOINT}'"
    )
    assert sorted(tracker.cell_runs()) == RECORDED  # every run under its old key
    assert (old_dir / CHECKPOINT).is_symlink() and not study.checkpoint_dir(cell).exists()
    # a checkpoint it reads moves to the cell's current key, re-keyed
    (old_dir / CHECKPOINT).unlink()
    torch.save(
        {"config_hash": old_dir.name, "state": {"step": 8, "status": "finished"}, "model": {}}
        | {"optimizer": {}, "sampler": {}, "rng_cpu": torch.zeros(1), "rng_cuda": None},
        old_dir / CHECKPOINT,
    )
    # a sharded checkpoint (of a distributed run) alike: its train state, which the ranks check
    # for the key, unreadable stops it in one line, nothing adopted, the cell before it included
    cell5 = study.cells[5]
    old5 = study.output_dir / "cells" / config_hash(cell5.config, numerics=1)
    state = _sharded(old5)
    saved = state.read_bytes()
    state.unlink()
    state.symlink_to("/proc/self/mem")
    res = CliRunner().invoke(main, ["adopt", "--yes", str(tmp_path / "quickstart.yaml")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.splitlines()[-1] == (
        f"Error: {cell5.label}: not adopted: [Errno 5] Input/output error: '{state}'"
    )
    assert sorted(tracker.cell_runs()) == RECORDED
    assert load_file(old_dir / CHECKPOINT)["config_hash"] == old_dir.name  # cell 3: as it was
    assert not study.checkpoint_dir(cell).exists() and not study.checkpoint_dir(cell5).exists()
    state.unlink()
    state.write_bytes(saved)
    # taken over knowingly: every cell is found finished, and nothing trains
    res = CliRunner().invoke(main, ["adopt", "--yes", str(tmp_path / "quickstart.yaml")])
    assert res.exit_code == 0, res.output
    assert f"adopted {len(study.cells)} runs" in res.output and "numerics 1" in res.output
    assert not old_dir.exists()
    assert load_file(study.checkpoint_dir(cell) / CHECKPOINT)["config_hash"] == cell.key
    # the sharded one re-keyed where a resumed run checks the key: its train state and sidecar
    new5 = study.checkpoint_dir(cell5)
    info = checkpoint_info(new5)
    assert not old5.exists() and info is not None and info["config_hash"] == cell5.key
    assert load_file(new5 / info["path"] / "train_state.pt")["config_hash"] == cell5.key
    assert [p.action for p in plan(study)] == ["skip"] * len(study.cells)
    res = run_study(study, executor="local", progress=False, stream=io.StringIO())
    assert res.outcomes == {} and not res.failed
