"""The progress line's view of a cell: running while its step advances, queued again once it
stalls (a dead worker whose Ray retry waits for a worker), running again when it moves."""

from __future__ import annotations

from ablate.driver.progress import STALL_S, CellProgress, WaitWatch


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


class Cluster:
    """What the watch reads from the executor, as plain data the test sets: the cells that started
    and the cluster's free and total resources; ``reads`` counts the reads."""

    def __init__(self, started: set[str], free: dict[str, float], total: dict[str, float]):
        self.started_keys, self.free, self.total, self.reads = started, free, total, 0

    def started(self) -> set[str]:
        self.reads += 1
        return set(self.started_keys)

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        return dict(self.free), dict(self.total)


def _watch(dispatched: dict[str, float], cluster: Cluster, cpus: float = 1.0) -> WaitWatch:
    labels = {k: f"cell-{k}" for k in dispatched}
    return WaitWatch(
        dispatched,
        labels,
        cluster.started,
        cluster.resources,
        {"CPU": cpus, "GPU": 0.0},
        f"a cell asks for {cpus:g} CPU(s)",
        after_s=60,
        every_s=300,
    )


def test_a_cell_waiting_behind_the_studys_own_running_cells_is_queued_without_a_line():
    # two CPUs, both held by the study's two running cells; the third waits its turn
    cluster = Cluster({"a", "b"}, {"CPU": 0.0}, {"CPU": 2.0})
    watch = _watch({"a": 0.0, "b": 0.0, "c": 0.0}, cluster)
    assert watch.check(set(), now=59.0) is None and cluster.reads == 0  # nobody waited 60 s
    assert watch.check(set(), now=61.0) is None and cluster.reads == 1
    assert watch.check(set(), now=3600.0) is None  # however long the study's own queue is
    # something else holds one of the two CPUs: one running cell still frees what c needs
    cluster.started_keys = {"a"}
    assert watch.check(set(), now=3700.0) is None


def test_a_cell_waiting_for_resources_held_elsewhere_is_reported_now_and_then():
    # one CPU, held by something else; none of the study's cells runs
    cluster = Cluster(set(), {"CPU": 0.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0})
    watch = _watch({"a": 0.0, "b": 0.0, "c": 30.0}, cluster)
    assert watch.check(set(), now=59.0) is None and cluster.reads == 0
    line = watch.check(set(), now=61.0)
    assert line == (
        "waiting for resources: cell cell-a was submitted 1m01s ago and has not started (1 more "
        "cell(s) wait as well); a cell asks for 1 CPU(s); the Ray cluster has 0 of 1 CPUs free and "
        "0 of 0 GPUs free, and this study's running cells hold 0 CPUs and 0 GPUs: something else "
        "holds what the cell needs, or no node has room for it; see `ray status`, wait for "
        "that work or stop it, add nodes or lower resources"
    )
    assert watch.check(set(), now=200.0) is None  # not again before every_s
    line = watch.check({"a", "b"}, now=400.0)  # a and b ended: what they held went to c
    assert line is None
    line = watch.check({"a", "b"}, now=461.0)  # c waits on, 60 s after the queue last moved
    assert line is not None and "cell cell-c was submitted 7m11s ago" in line
    cluster.started_keys = {"c"}
    assert watch.check({"a", "b"}, now=800.0) is None


def test_a_cell_ray_started_but_not_yet_heard_from_explains_a_wait_for_a_while():
    # one CPU free before the study; two cells handed over at 0; Ray started a, whose worker has
    # not said so yet (a loaded machine): the CPU in use is a's, b waits behind it
    cluster = Cluster(set(), {"CPU": 0.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0})
    watch = _watch({"a": 0.0, "b": 0.0}, cluster)
    watch.after_s, watch.every_s = 6, 6
    watch.before = {"a": {"CPU": 0.0, "GPU": 0.0}, "b": {"CPU": 0.0, "GPU": 0.0}}
    assert watch.check(set(), now=7.0) is None
    assert watch.check(set(), now=59.0) is None
    line = watch.check(set(), now=61.0)  # a minute and still no word: something else holds it
    assert line is not None and "this study's running cells hold 0 CPUs" in line
    # what was in use before the cells were handed over is not theirs: said at once
    blocked = _watch({"a": 0.0}, Cluster(set(), {"CPU": 0.0}, {"CPU": 1.0}))
    blocked.after_s, blocked.before = 6, {"a": {"CPU": 1.0, "GPU": 0.0}}
    assert blocked.check(set(), now=7.0) is not None


def test_a_cell_that_no_node_has_room_for_is_reported():
    # two nodes of two CPUs, a cell asks for two; the node that ran cell a left: one CPU is left,
    # and a (started before, now retried by Ray) holds nothing
    cluster = Cluster({"a"}, {"CPU": 1.0}, {"CPU": 1.0})
    watch = _watch({"a": 0.0, "b": 10.0}, cluster, cpus=2.0)
    line = watch.check(set(), now=71.0)
    assert line is not None and "cell cell-b was submitted 1m01s ago" in line
    assert "the Ray cluster has 1 of 1 CPUs free" in line
    assert "this study's running cells hold 0 CPUs" in line


def test_a_watch_with_no_threshold_never_speaks():
    cluster = Cluster(set(), {"CPU": 0.0}, {"CPU": 1.0})
    watch = WaitWatch({"a": 0.0}, {"a": "a"}, cluster.started, cluster.resources, {"CPU": 1.0})
    watch.after_s = 0
    assert watch.check(set(), now=1e6) is None and cluster.reads == 0
