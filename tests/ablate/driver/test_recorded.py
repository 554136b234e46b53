"""A study recorded by an earlier layout of the code is found finished by this one: the keys its
cells were recorded under (pinned in ``test_key``, as that code computed them) are the keys this
code expands the study into, so ``ablate plan`` skips every cell and ``ablate run`` trains none."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from test_key import STUDY_KEYS

from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.spec import load_study
from ablate.tracking import StudyTracker

ROOT = Path(__file__).resolve().parents[3]


def test_a_quickstart_recorded_before_the_layout_change_is_found_finished(tmp_path, monkeypatch):
    # the study as a user has it: its file, its output folder, its store
    shutil.copy(ROOT / "studies" / "quickstart.yaml", tmp_path / "quickstart.yaml")
    monkeypatch.chdir(tmp_path)
    study = load_study(tmp_path / "quickstart.yaml")
    labels = {c.key: c.label for c in study.cells}
    # what the earlier code recorded: a finished run per cell, under the key it computed
    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    parent = tracker.parent_run(study.text)
    for key in STUDY_KEYS["quickstart"]:
        run_id = tracker.create_run(parent, key, labels.get(key, key), {}, {})
        tracker.set_status(run_id, "finished")
    planned = plan(study)
    assert [p.action for p in planned] == ["skip"] * len(study.cells)
    res = run_study(study, executor="local", progress=False, stream=io.StringIO())
    assert res.outcomes == {} and not res.failed
