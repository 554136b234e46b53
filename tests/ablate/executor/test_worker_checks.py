"""A worker that does not run the driver's ablate, or cannot reach the driver's paths, fails its
cell at once with the reason on the cell's MLflow run (in-process, a real SQLite store)."""

from __future__ import annotations

import pickle
import socket
import time
from pathlib import Path

import pytest

from ablate import __version__
from ablate.executor import run_distributed, run_one
from ablate.executor.task import Task
from ablate.executor.worker_checks import WorkerSetupError, check_worker
from ablate.tracking import StudyTracker, default_uri, prepare_store
from ablate.train.provenance import code_hash


@pytest.fixture
def cell(tmp_path: Path) -> tuple[StudyTracker, str, str]:
    """(tracker, a pending cell's run id, the store's URI)."""
    uri = default_uri(tmp_path / "out")
    prepare_store(uri, tmp_path / "out")
    tracker = StudyTracker(uri, "s")
    rid = tracker.create_run(tracker.parent_run("name: s\n"), "k", "cell k", {}, {})
    tracker.set_status(rid, "pending")
    return tracker, rid, uri


def _fails(tracker: StudyTracker, task: Task, workers: int = 1) -> str:
    """Run the task in this process (a multi-worker cell's task when ``workers`` > 1); assert that
    it failed at once, before it ran (no Ray Train started), and return the reason on its run."""
    t0 = time.perf_counter()
    if workers > 1:
        o = run_distributed(task, workers=workers, cpus=1, gpus=0, max_failures=0)
    else:
        o = run_one(task)
    assert time.perf_counter() - t0 < 10
    assert o.status == "failed" and o.reason.startswith("WorkerSetupError: "), o.reason
    run = tracker.cell_runs()["k"]
    assert run.status == "failed"
    assert run.reason == o.reason[:500]
    assert "ablate.host" not in run.tags  # never logged as running
    return run.reason


def test_a_task_carries_the_drivers_version_and_code_hash_to_the_worker(tmp_path):
    t = Task("k", "k", {}, "sqlite:///x", "r", str(tmp_path))
    assert (t.ablate_version, t.code_hash) == (__version__, code_hash())
    assert pickle.loads(pickle.dumps(t)) == t  # as Ray ships it: the driver's values travel
    check_worker(t)  # the same code here: taken


def test_a_worker_with_other_code_fails_the_cell_naming_both_hashes_and_the_fix(cell, tmp_path):
    tracker, rid, uri = cell
    other = "0123456789abcdef"
    reason = _fails(tracker, Task("k", "k", {}, uri, rid, str(tmp_path), code_hash=other))
    assert f"the worker on {socket.gethostname()} runs ablate {__version__} (code_hash " in reason
    assert f"{code_hash()}), the driver ablate {__version__} (code_hash {other})" in reason
    assert "install the driver's ablate on every node" in reason and "runtime environment" in reason
    # a multi-worker cell's task checks its node before it starts Ray Train
    tracker.set_status(rid, "pending")
    task = Task("k", "k", {}, uri, rid, str(tmp_path), code_hash=other)
    assert f"(code_hash {other})" in _fails(tracker, task, workers=2)
    with pytest.raises(WorkerSetupError, match="runs ablate .*, the driver ablate 0.0.1"):
        check_worker(Task("k", "k", {}, uri, rid, str(tmp_path), ablate_version="0.0.1"))


def test_a_missing_data_file_fails_the_cell_naming_the_path_and_the_host(cell, tmp_path):
    tracker, rid, uri = cell
    config = {"data": {"corpus": "text", "path": "corpus/missing.txt"}}
    reason = _fails(tracker, Task("k", "k", config, uri, rid, str(tmp_path)))
    assert f"data.path: 'corpus/missing.txt' does not exist on {socket.gethostname()}" in reason
    assert f"(working directory {tmp_path})" in reason
    assert "cluster workers need the driver's paths on shared storage" in reason


def test_a_missing_validation_file_is_named_and_a_hub_tokenizer_is_no_path(cell, tmp_path):
    tracker, rid, uri = cell
    (tmp_path / "a.txt").write_text("some text")
    config = {
        "data": {
            "corpus": "text",
            "path": "a.txt",
            "tokenizer": "meta-llama/Llama-3.1-8B",
            "val": {"corpus": "text", "path": "val/missing.txt"},
        }
    }
    reason = _fails(tracker, Task("k", "k", config, uri, rid, str(tmp_path / "gone")))
    # the driver's folder is needed for the two relative paths, not for the hub name
    assert "reads data.path: a.txt, data.val.path: val/missing.txt from it" in reason
    tracker.set_status(rid, "pending")
    reason = _fails(tracker, Task("k", "k", config, uri, rid, str(tmp_path)))
    assert f"data.val.path: 'val/missing.txt' does not exist on {socket.gethostname()}" in reason


def test_the_drivers_working_directory_and_checkpoint_folder_must_exist_on_the_worker(
    cell, tmp_path
):
    tracker, rid, uri = cell
    gone = str(tmp_path / "driver-cwd")  # the driver's folder, not on this "node"
    config = {"data": {"corpus": "text", "path": "corpus/a.txt"}}
    reason = _fails(tracker, Task("k", "k", config, uri, rid, gone))
    assert f"the driver's working directory {gone} does not exist on {socket.gethostname()}" in (
        reason
    )
    assert "reads data.path: corpus/a.txt from it" in reason
    # absolute paths need no working directory; the checkpoint's folder must exist
    ckpt = tmp_path / "elsewhere" / "cells" / "k"
    check_worker(Task("k", "k", {"checkpoint_dir": str(tmp_path / "k")}, uri, rid, gone))
    with pytest.raises(WorkerSetupError) as e:
        check_worker(Task("k", "k", {"checkpoint_dir": str(ckpt)}, uri, rid, gone))
    assert f"the checkpoint folder {ckpt.parent} (made by the driver) does not exist on " in str(
        e.value
    )
    assert "the output folder is not shared with this node" in str(e.value)
