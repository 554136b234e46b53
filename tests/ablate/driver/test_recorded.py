"""A study recorded by earlier code: its cells were keyed under numerics 1 (the keys pinned here,
as the code before the layout change computed them, when every seed read batch order 0: the
study finds them with ``data: {data_seed: 0}``). This code keys them the same at
numerics 1, so nothing of the layout moved a key; its own numerics are newer, so the study resumed
now trains new cells instead of mixing two sets of numbers, and ``ablate adopt`` takes the old runs
over knowingly, after which every cell is found finished (a checkpoint it cannot read stops it
first, in one line, nothing adopted; one it reads moves, re-keyed)."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from click.testing import CliRunner

from ablate.cli import main
from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.study import load_study
from ablate.tracking import StudyTracker
from ablate.train.checkpoint import CHECKPOINT, load_file
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


def test_a_quickstart_recorded_under_numerics_1_reruns_unless_adopted(tmp_path, monkeypatch):
    # the study as a user has it: its file, its output folder, its store
    text = QUICKSTART.read_text()
    order0 = "data: {corpus: builtin, val_tokens: 8192, data_seed: 0}"
    (tmp_path / "quickstart.yaml").write_text(
        text.replace("data: {corpus: builtin, val_tokens: 8192}", order0)
    )
    monkeypatch.chdir(tmp_path)
    study = load_study(tmp_path / "quickstart.yaml")
    old = {config_hash(c.config, numerics=1): c.label for c in study.cells}
    assert sorted(old) == RECORDED  # the layout moved no key
    # what the earlier code recorded: a finished run per cell, under the key it computed
    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    parent = tracker.parent_run(study.text)
    for key in RECORDED:
        run_id = tracker.create_run(parent, key, old[key], {}, {})
        tracker.set_status(run_id, "finished")
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
    # taken over knowingly: every cell is found finished, and nothing trains
    res = CliRunner().invoke(main, ["adopt", "--yes", str(tmp_path / "quickstart.yaml")])
    assert res.exit_code == 0, res.output
    assert f"adopted {len(study.cells)} runs" in res.output and "numerics 1" in res.output
    assert not old_dir.exists()
    assert load_file(study.checkpoint_dir(cell) / CHECKPOINT)["config_hash"] == cell.key
    assert [p.action for p in plan(study)] == ["skip"] * len(study.cells)
    res = run_study(study, executor="local", progress=False, stream=io.StringIO())
    assert res.outcomes == {} and not res.failed
