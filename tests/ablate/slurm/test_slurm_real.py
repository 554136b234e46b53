"""``ablate slurm`` against a real SLURM: Debian's slurmctld, two slurmd as two nodes (each in a
network namespace of its own) and munge, set up by the tests themselves (``slurm_cluster``), with
real Ray and MLflow. What runs is ``slurm_scenario``'s docstring: two jobs at once on node n1, one
requeued (``scontrol requeue``) and one warned of its time limit (SIGUSR1), both finishing after
their requeue, and the refusals. It runs once per session, started in the background as the
session starts (``tests/conftest.py``); these tests read what it recorded.

Slow (about two minutes: four job attempts); needs root, ``ip netns`` and the SLURM packages:
skipped without them, except under CI (``CI`` set), where ``.ci/run`` installs them and a missing
one fails.
"""

from __future__ import annotations

import math
import os
import re
from datetime import datetime

import pytest
from slurm_cluster import missing
from slurm_scenario import STEPS, TIMING, scenario_folder, scenario_once

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    why = missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-SLURM tests: {why} (.ci/run installs them)")
        pytest.skip(f"no real SLURM here: {why}")
    return scenario_once(scenario_folder(tmp_path_factory.getbasetemp()))


def _cells(job):
    """Cell key -> its one run (a key recorded twice fails here)."""
    out = {}
    for key, runs in job.runs.items():
        assert len(runs) == 1, f"cell {key} has {len(runs)} runs"
        out[key] = runs[0]
    return out


def test_both_jobs_finish_every_cell_once(scenario):
    for job, n in ((scenario.b, 2), (scenario.d, 1)):
        assert job.state["JobState"] == "COMPLETED" and job.state["ExitCode"] == "0:0", job.output
        cells = _cells(job)
        assert len(cells) == n, job.output[-3000:]
        for run in cells.values():
            assert run["status"] == "FINISHED" and run["tags"]["ablate.status"] == "finished"
            steps = [s for s, *_ in run["metrics"]["train_loss"]]
            assert steps == list(range(1, STEPS + 1))


def test_the_cells_of_the_two_node_job_ran_on_both_nodes(scenario):
    nodes = {run["tags"]["ablate.node"] for run in _cells(scenario.b).values()}
    assert nodes == {"n1", "n2"}, nodes  # one 1-CPU cell per node: both nodes at once
    assert all(r["tags"]["ablate.slurm_job"] == scenario.b.id for r in _cells(scenario.b).values())


def _ray_up(output: str) -> list[tuple[datetime, datetime]]:
    """Each attempt's Ray, from when all its nodes were up to when the job's processes stopped (the
    driver's ``slurm: <time> ...`` lines)."""
    up = re.findall(r"slurm: (\S+) Ray on \d+ node", output)
    down = re.findall(r"slurm: (\S+) Ray and the job's processes stopped", output)
    return [
        (datetime.fromisoformat(a), datetime.fromisoformat(b))
        for a, b in zip(up, down, strict=False)
    ]


def test_two_jobs_on_one_node_at_once_do_not_collide(scenario):
    assert scenario.ports["b"] != scenario.ports["d"]  # blocks of ports of their own
    (d,) = _cells(scenario.d).values()
    assert d["tags"]["ablate.node"] == "n1"
    # both jobs had their Ray (the two-node job also its MLflow server) up on n1 at once, and both
    # finished their cells
    b_up, d_up = _ray_up(scenario.b.output), _ray_up(scenario.d.output)
    assert len(b_up) == len(d_up) == 2, (b_up, d_up)
    assert any(max(b[0], e[0]) < min(b[1], e[1]) for b in b_up for e in d_up), (b_up, d_up)


def test_a_requeued_job_resumes_its_cells_where_they_stopped(scenario):
    for job, how in (
        (scenario.b, "scontrol requeue"),
        (scenario.d, "scancel --batch --signal=USR1"),
    ):
        assert job.how == how
        assert job.state["Restarts"] == "1", job.state
        assert "attempt 2" in job.output
        before = job.steps_before
        assert any(10 <= before[key] < STEPS for key in before), before  # one stopped mid-study
        for key, run in _cells(job).items():
            if before.get(key, 0) == STEPS:  # it finished before the signal
                continue
            # the second attempt started from the step the first logged last: a checkpoint at
            # the stop, so nothing was computed twice (0: the cell had not started)
            assert int(run["tags"]["ablate.resumed_from"]) == before.get(key, 0), (key, before)


def test_the_time_limit_signal_stops_the_cells_and_the_script_requeues_the_job(scenario):
    out = scenario.d.output
    assert "stopping: SIGUSR1, the job nears its time limit" in out, out[-3000:]
    assert "stopped ahead of the time limit; requeueing job" in out


def test_a_requeue_stops_the_cells_through_sigterm(scenario):
    out = scenario.b.output
    assert "stopping: SIGTERM, SLURM ends the job" in out, out[-3000:]


def test_every_metric_step_is_recorded_once(scenario):
    for job in (scenario.b, scenario.d):
        for key, run in _cells(job).items():
            assert run["twice"] == 0, key
            for name, points in run["metrics"].items():
                steps = [s for s, *_ in points]
                assert len(steps) == len(set(steps)), (key, name)


def test_a_resumed_cell_ends_bit_identical_to_an_uninterrupted_one(scenario):
    ref = {key: runs[0] for key, runs in scenario.reference.items()}
    for job in (scenario.b, scenario.d):
        for key, run in _cells(job).items():
            want = ref[key]["metrics"]
            got = run["metrics"]  # and the report's summary metrics (the two-node job)
            assert set(want) <= set(got), key
            for name in want:
                if name in TIMING:
                    continue
                a = [(s, v) for s, v, _ in got[name]]
                b = [(s, v) for s, v, _ in want[name]]
                assert a == b or all(
                    sa == sb and (va == vb or (math.isnan(va) and math.isnan(vb)))
                    for (sa, va), (sb, vb) in zip(a, b, strict=True)
                ), (key, name)


def test_the_two_node_job_ends_with_the_report(scenario):
    assert scenario.report, scenario.b.output[-3000:]


@pytest.mark.parametrize(
    "case, says",
    [
        ("cell larger than the node", "resources: a cell asks for 5 CPU(s) and 0 GPU(s)"),
        ("port taken", "(for Ray's GCS) is taken by pid"),
        ("from salloc", "resources: a cell asks for 5 CPU(s) and 0 GPU(s)"),
    ],
)
def test_slurm_run_refuses_before_anything_starts(scenario, case, says):
    code, out = scenario.refusals[case]
    assert code == 2 and says in out, out[-3000:]


def test_a_job_with_nothing_left_to_run_starts_no_ray(scenario):
    code, out = scenario.refusals["nothing to run"]
    assert code == 0, out[-3000:]
    assert "nothing to run: the study's 2 cells have ended; Ray not started" in out
    assert "Ray on" not in out
