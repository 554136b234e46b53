"""A study recorded by earlier code: its cells were keyed under numerics 1 (the keys pinned in
``test_key``, as the code before the layout change computed them). This code keys them the same at
numerics 1, so nothing of the layout moved a key; its own numerics are newer, so the study resumed
now trains new cells instead of mixing two sets of numbers, and ``ablate adopt`` takes the old runs
over knowingly, after which every cell is found finished."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from click.testing import CliRunner
from test_key import STUDY_KEYS

from ablate.cli import main
from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.study import load_study
from ablate.tracking import StudyTracker
from ablate.train.config import config_hash

ROOT = Path(__file__).resolve().parents[3]


def test_a_quickstart_recorded_under_numerics_1_reruns_unless_adopted(tmp_path, monkeypatch):
    # the study as a user has it: its file, its output folder, its store
    shutil.copy(ROOT / "studies" / "quickstart.yaml", tmp_path / "quickstart.yaml")
    monkeypatch.chdir(tmp_path)
    study = load_study(tmp_path / "quickstart.yaml")
    old = {config_hash(c.config, numerics=1): c.label for c in study.cells}
    assert sorted(old) == STUDY_KEYS["quickstart"]  # the layout moved no key
    # what the earlier code recorded: a finished run per cell, under the key it computed
    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    parent = tracker.parent_run(study.text)
    for key in STUDY_KEYS["quickstart"]:
        run_id = tracker.create_run(parent, key, old[key], {}, {})
        tracker.set_status(run_id, "finished")
    # resumed across the numerics change: every cell is new
    assert [p.action for p in plan(study)] == ["run"] * len(study.cells)
    # taken over knowingly: every cell is found finished, and nothing trains
    res = CliRunner().invoke(main, ["adopt", "--yes", str(tmp_path / "quickstart.yaml")])
    assert res.exit_code == 0, res.output
    assert f"adopted {len(study.cells)} runs" in res.output and "numerics 1" in res.output
    assert [p.action for p in plan(study)] == ["skip"] * len(study.cells)
    res = run_study(study, executor="local", progress=False, stream=io.StringIO())
    assert res.outcomes == {} and not res.failed
