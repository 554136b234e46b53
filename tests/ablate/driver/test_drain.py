"""A drain request (``run_study(drain=...)``, what ``ablate slurm`` passes on SIGUSR1 or SIGTERM):
nothing more starts, the cells that did not run are marked ``interrupted``, the study returns
``interrupted``, and the next run resumes it to the same end, every step recorded once."""

from __future__ import annotations

import pytest
from test_runner import assert_store_holds, tiny_study

from ablate.driver.planning import plan
from ablate.driver.runner import run_study

pytestmark = pytest.mark.slow  # a few tiny cells in this process: 10-30 s


def test_a_drain_request_stops_handing_out_cells_and_the_next_run_resumes_them(tmp_path):
    s = tiny_study(tmp_path, steps=3, seed=[0, 1, 2])
    asked: list[str] = []

    def drain() -> str:  # asked before each wait: the first cell runs, then the study drains
        asked.append("x")
        return "SIGUSR1, the job nears its time limit" if len(asked) > 1 else ""

    res = run_study(s, executor="local", progress=False, drain=drain)
    assert res.interrupted
    assert [o.status for o in res.outcomes.values()] == ["finished"]
    assert [p.action for p in plan(s)] == ["skip", "resume", "resume"]  # marked interrupted
    again = run_study(s, executor="local", progress=False, drain=lambda: "")
    assert not again.interrupted and len(again.outcomes) == 2
    assert_store_holds(s, expect_steps=3)


def test_a_drain_before_any_cell_ran_leaves_every_cell_to_the_next_run(tmp_path):
    s = tiny_study(tmp_path, steps=3, seed=[0])
    res = run_study(s, executor="local", progress=False, drain=lambda: "SIGTERM")
    # asked before the first wait: the queue is emptied before the cell runs
    assert res.interrupted and res.outcomes == {}
    res = run_study(s, executor="local", progress=False, drain=lambda: "")
    assert not res.interrupted and [o.status for o in res.outcomes.values()] == ["finished"]
