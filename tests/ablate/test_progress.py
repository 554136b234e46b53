"""The progress line's view of a cell: running while its step advances, queued again once it
stalls (a dead worker whose Ray retry waits for a worker), running again when it moves."""

from __future__ import annotations

from ablate.progress import STALL_S, CellProgress, WaitWatch


def test_a_cell_whose_step_stops_moving_counts_as_queued_until_it_moves_again():
    c = CellProgress("c", total_steps=100)
    assert c.status == "queued"
    c.observe(5, 3.0, now=100.0)
    assert (c.status, c.step, c.loss) == ("running", 5, 3.0)
    c.observe(15, 2.5, now=110.0)  # 1 s per step
    assert c.status == "running" and c.step_s == 1.0
    c.observe(15, 2.5, now=110.0 + STALL_S - 1)
    assert c.status == "running"  # not yet stalled
    c.observe(15, 2.5, now=110.0 + STALL_S + 1)
    assert c.status == "queued"  # its worker died; a retry waits
    c.observe(16, 2.4, now=300.0)  # the retry resumed and passed the old step
    assert (c.status, c.step) == ("running", 16)


def test_a_slow_cell_is_not_called_stalled_before_ten_of_its_own_steps():
    c = CellProgress("slow", total_steps=10)
    c.observe(1, 3.0, now=0.0)
    c.observe(2, 3.0, now=100.0)  # 100 s per step
    c.observe(2, 3.0, now=100.0 + 5 * 100)
    assert c.status == "running"
    c.observe(2, 3.0, now=100.0 + 11 * 100)
    assert c.status == "queued"


def test_a_cell_handed_to_the_cluster_and_not_started_is_reported_now_and_then():
    status = {"r1": "running", "r2": "pending", "r3": "pending"}
    asked: list[list[str]] = []

    def statuses(run_ids):
        asked.append(sorted(run_ids))
        return {r: status[r] for r in run_ids}

    watch = WaitWatch(
        {"a": 0.0, "b": 0.0, "c": 30.0},
        {"a": "r1", "b": "r2", "c": "r3"},
        {"a": "cell-a", "b": "cell-b", "c": "cell-c"},
        statuses,
        lambda: "free: nothing",
        after_s=60,
        every_s=300,
    )
    assert watch.check(set(), now=59.0) is None and asked == []  # nobody waited 60 s yet: no read
    line = watch.check(set(), now=61.0)
    assert asked == [["r1", "r2"]]  # only the late ones
    assert line is not None and line.startswith(
        "waiting for resources: cell cell-b was submitted 1m01s ago and has not started; "
        "free: nothing; this study has 3 cell(s) on the cluster now."
    )
    assert watch.check(set(), now=200.0) is None  # not again before every_s
    line = watch.check({"b"}, now=400.0)  # b ended; c waits; a started and is not read again
    assert asked[-1] == ["r3"] and line is not None and "cell cell-c was submitted 6m10s" in line
    status["r3"] = "running"
    assert watch.check({"b"}, now=800.0) is None
    assert WaitWatch({"a": 0.0}, {"a": "r1"}, {}, statuses, str, after_s=0).check(set()) is None
