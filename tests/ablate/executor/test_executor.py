"""The executors that ``ablate run`` and ``ablate tune`` share: submit / wait / cancel semantics and
a failing cell as an outcome, never an exception. Ray's executor runs in the end-to-end tests of
``test_runner.py`` and ``test_tune.py`` (a real local Ray); here the in-process one, with a real
MLflow store."""

from __future__ import annotations

from pathlib import Path

from ablate.executor import LocalExecutor
from ablate.executor.task import Task
from ablate.tracking import StudyTracker, default_uri, prepare_store


def _task(tmp_path: Path, key: str, run_id: str, config: dict) -> Task:
    return Task(key, key, config, default_uri(tmp_path), run_id, str(tmp_path))


def test_local_executor_runs_in_submission_order_and_cancel_drops_a_queued_task(tmp_path):
    uri = default_uri(tmp_path)
    prepare_store(uri, tmp_path)
    tracker = StudyTracker(uri, "s")
    parent = tracker.parent_run("name: s\n")
    bad = {"train": {"steps": -1}}  # refused by the trainer's config: a failed outcome
    ids = {k: tracker.create_run(parent, k, k, {}, {}) for k in ("a", "b", "c")}
    ex = LocalExecutor()
    assert ex.in_process and not ex.multi_node
    assert ex.wait(0.1) == []  # nothing submitted: nothing to wait for
    for k in ("a", "b", "c"):
        ex.submit(_task(tmp_path, k, ids[k], bad))
    assert len(ex) == 3
    ex.cancel("b")
    first = ex.wait(0.1)
    assert [o.key for o in first] == ["a"] and len(ex) == 1
    assert first[0].status == "failed" and "steps" in first[0].reason
    assert [o.key for o in ex.wait(0.1)] == ["c"] and len(ex) == 0
    runs = tracker.cell_runs()  # the worker recorded the failure on the run itself
    assert runs["a"].status == "failed" and "steps" in runs["a"].reason
    assert runs["b"].status == "pending" and runs["b"].reason == ""  # cancelled: never started
    ex.close()
