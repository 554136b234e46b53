"""The progress line's view of a cell: running while its step advances, queued again once it
stalls (a dead worker whose Ray retry waits for a worker), running again when it moves."""

from __future__ import annotations

from ablate.progress import STALL_S, CellProgress


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
