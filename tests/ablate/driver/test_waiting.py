"""The progress output tells a study's own queue from a fault, on a real local Ray: a cell that waits
behind the study's own running cell is only queued (no warning), and a cell that waits for a CPU
that something else holds is reported: which cell, what it asks for, what the cluster has free and
what the study's own cells hold."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_runner import tiny_study

from ablate.driver.runner import run_study

WARNING = "waiting for resources: "


@pytest.fixture(scope="module")
def one_cpu_ray():
    """A local Ray of one CPU, shared by the tests here (the study's executor joins it)."""
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=100 * 2**20)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_a_cell_queued_behind_the_studys_own_running_cell_gets_no_warning(tmp_path, one_cpu_ray):
    # one CPU, two cells of one CPU each: the second waits for the first, well past the threshold
    study = tiny_study(tmp_path, steps=40, seed=[0, 1], eval_batches=0)  # every batch: a long cell
    out = io.StringIO()
    began = time.time()
    res = run_study(study, executor="ray", progress=False, stream=out, wait_warning_s=3.0)
    text = out.getvalue()
    assert sorted(o.status for o in res.outcomes.values()) == ["finished", "finished"], text
    assert WARNING not in text, text
    # the second cell did wait behind the first (its run's clock starts when it starts), longer
    # than the warning threshold after it was submitted
    client = MlflowClient(tracking_uri=study.tracking_uri)
    runs = sorted(
        (client.get_run(rid).info for rid in res.run_ids.values()), key=lambda r: r.start_time
    )
    assert runs[1].start_time >= runs[0].end_time - 5_000  # after the first, give or take its end
    assert runs[1].start_time / 1000 - began > 3.0 + 5.0, text


@pytest.mark.slow
def test_a_cell_waiting_for_a_cpu_held_by_something_else_is_reported(tmp_path, one_cpu_ray):
    ray = one_cpu_ray
    flag = tmp_path / "release"

    def hold_a_cpu_until(flag: str, limit_s: float) -> None:  # something other than the study
        deadline = time.monotonic() + limit_s
        while not Path(flag).exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    blocker = ray.remote(num_cpus=1)(hold_a_cpu_until).remote(str(flag), 120.0)
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 0  # the blocker holds the one CPU
    study = tiny_study(tmp_path, steps=6, seed=[0], fp4_gemms=[[]])
    out = io.StringIO()

    def release_once_warned() -> None:  # the blocker ends once the study has said why it waits
        while WARNING not in out.getvalue() and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        flag.touch()

    watcher = threading.Thread(target=release_once_warned, daemon=True)
    watcher.start()
    res = run_study(study, executor="ray", progress=False, stream=out, wait_warning_s=2.0)
    watcher.join()
    ray.get(blocker)
    text = out.getvalue()
    assert [o.status for o in res.outcomes.values()] == ["finished"], text
    lines = [x for x in text.splitlines() if x.startswith(WARNING)]
    assert len(lines) == 1, text
    label = study.cells[0].label
    assert lines[0].startswith(f"{WARNING}cell {label} was submitted 0m0"), lines[0]
    assert (
        "ago and has not started; a cell asks for 1 CPU(s) and 0 GPU(s) (resources); the Ray "
        "cluster has 0 of 1 CPUs free and 0 of 0 GPUs free, and this study's running cells hold "
        "0 CPUs and 0 GPUs: something else holds what the cell needs" in lines[0]
    ), lines[0]
