"""The live progress line of a running study: cells done / running / queued / failed, the running
cells' step and training loss, elapsed time and an ETA from the steps done so far. It reads the
latest metrics from MLflow in a background thread, so it works the same for in-process and Ray
cells.

A cell counts as running while its step advances. One whose step has not moved for ``STALL_S``
seconds (or ten of its own step times, if longer) counts as queued again: that is what a cell whose
worker died looks like while Ray's retry waits for a worker (it resumes from its checkpoint).

``WaitWatch`` tells a study's own queue from a fault. A cell that Ray has had for ``WAIT_WARN_S``
seconds without starting it (since it was submitted, and since the study's last cell ended) waits
either behind the study's own running cells, which is the normal queue of a study larger than the
cluster (the progress line counts it as queued, and nothing more is said), or for resources that
something else holds, or that no node has: then a line names the longest-waiting cell, what a cell
asks for, what the cluster has free and what the study's own cells hold, again at most every
``WAIT_REPEAT_S`` seconds while it waits."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import IO

from ablate.tracking import StudyTracker

STALL_S = 60.0
WAIT_WARN_S = 60.0
WAIT_REPEAT_S = 300.0
START_GRACE_S = 60.0
"""How long after its dispatch a cell not yet heard from may be one that Ray has started: a Ray
worker starting on a loaded machine takes seconds to import and say so (``WaitWatch``)."""


@dataclass
class CellProgress:
    label: str
    total_steps: int
    step: int = 0
    loss: float = math.nan
    status: str = "queued"
    advanced_at: float | None = None
    """When (time.monotonic) the step last moved; None before the first reading."""
    step_s: float = 0.0
    """Seconds per step, seen while running."""

    def observe(self, step: int, loss: float, now: float) -> None:
        """A new reading of the run's latest training step and loss."""
        if self.advanced_at is None or step != self.step:
            if self.advanced_at is not None and step > self.step:
                self.step_s = (now - self.advanced_at) / (step - self.step)
            self.step, self.loss, self.advanced_at, self.status = step, loss, now, "running"
        elif self.status == "running" and now - self.advanced_at > max(STALL_S, 10 * self.step_s):
            self.status = "queued"  # its worker is gone; a retry waits for one


@dataclass
class Progress:
    """Counts and per-cell step/loss, refreshed from MLflow in a background thread; one line
    rewritten in place on a terminal, a line every ``every_s`` seconds otherwise."""

    tracker: StudyTracker
    cells: dict[str, CellProgress]
    run_ids: dict[str, str]
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    every_s: float = 2.0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    _t0: float = field(default_factory=time.monotonic)
    _steps0: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last_line: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ablate-progress")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()

    def finished(self, key: str, status: str) -> None:
        with self._lock:
            self._finished(key, status)

    def _finished(self, key: str, status: str) -> None:
        c = self.cells[key]
        c.status = status
        if status == "failed":
            self.failed += 1
        else:
            self.done += 1
            c.step = c.total_steps if status == "finished" else c.step

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):  # progress must never break a study
                self._refresh()
                self._render()

    def _refresh(self) -> None:
        live = {
            k: rid
            for k, rid in self.run_ids.items()
            if self.cells[k].status in ("queued", "running")
        }
        latest = self.tracker.latest_metrics(live.values())
        now = time.monotonic()
        for key, rid in live.items():
            m = latest.get(rid, {})
            with self._lock:
                c = self.cells[key]
                if "train_loss" in m and c.status in ("queued", "running"):  # not ended meanwhile
                    c.observe(m["train_loss"][0], m["train_loss"][1], now)

    def line(self) -> str:
        total = sum(c.total_steps for c in self.cells.values())
        steps = sum(c.step for c in self.cells.values())
        if self._steps0 is None:
            self._steps0 = steps
        running = [c for c in self.cells.values() if c.status == "running"]
        queued = sum(c.status == "queued" for c in self.cells.values())
        elapsed = time.monotonic() - self._t0
        rate = (steps - self._steps0) / elapsed if elapsed > 0 else 0.0
        eta = fmt_s((total - steps) / rate) if rate > 0 else "?"
        head = (
            f"[{self.done}/{len(self.cells)} done, {len(running)} running, {queued} queued, "
            f"{self.failed} failed] "
        )
        shown = "  ".join(
            f"{c.label} {c.step}/{c.total_steps} loss {c.loss:.3f}" for c in running[:2]
        )
        more = f" +{len(running) - 2}" if len(running) > 2 else ""
        return f"{head}{shown}{more}  elapsed {fmt_s(elapsed)}, ETA {eta}"

    def _render(self) -> None:
        text = self.line()
        if self.stream.isatty():
            width = 160
            self.stream.write("\r" + text[:width].ljust(width))
        elif time.monotonic() - self._last_line >= 30:
            self.stream.write(text + "\n")
            self._last_line = time.monotonic()
        else:
            return
        self.stream.flush()


@dataclass
class WaitWatch:
    """Notices cells that the cluster holds without starting them, and says so when the study's
    own running cells do not explain the wait (see the module docstring). ``check`` is cheap until
    a cell has waited ``after_s``: only then does it ask which cells started and what the cluster
    has free.

    A cell waits behind the study's own cells when what the cluster has free plus what the study's
    running cells hold (what they asked for, at most what the cluster has in use) covers what a
    cell asks for: it starts as they end. Otherwise something else holds the rest, or the cluster
    no longer has room for a cell (a node left): the warning.
    The sums are the cluster's; a cell that fits no single node is refused before the study starts
    (``RayExecutor``)."""

    dispatched: Mapping[str, float]
    """When (time.monotonic) each cell was handed to the cluster, by key (the executor's)."""
    labels: Mapping[str, str]
    started: Callable[[], Collection[str]]
    """Keys of the cells that have started to run on the cluster (the executor's)."""
    resources: Callable[[], tuple[Mapping[str, float], Mapping[str, float]]]
    """The cluster's resources (``CPU``, ``GPU``) free now and in all."""
    ask: Mapping[str, float]
    """What one running cell holds, all its workers together (``{"CPU": 2.0, "GPU": 0.0}``)."""
    asks: str = "a cell asks for what its resources say"
    """The same in words, for the warning."""
    after_s: float = WAIT_WARN_S
    """Report a cell not started this long after it was handed over (0: never)."""
    every_s: float = WAIT_REPEAT_S
    before: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """What the cluster had in use just before each cell was handed to it, by key (the
    executor's): what came into use after it may be that cell, started but not yet heard from."""
    _ended: int = 0
    _moved: float = -math.inf
    """When the study's queue last moved: a cell of it ended (time.monotonic)."""
    _last: float = -math.inf

    def check(self, ended: Collection[str], now: float | None = None) -> str | None:
        """The line to print now (None: nothing to say); ``ended``: keys whose outcome is in."""
        now = time.monotonic() if now is None else now
        if len(ended) != self._ended:  # what the ended cells held goes to the next in the queue
            self._ended, self._moved = len(ended), now
        if self.after_s <= 0 or now - self._last < self.every_s:
            return None
        flight = [k for k in self.dispatched if k not in ended]
        late = [k for k in flight if now - max(self.dispatched[k], self._moved) >= self.after_s]
        if not late:
            return None
        started = set(self.started())
        waiting = {k: now - self.dispatched[k] for k in late if k not in started}
        if not waiting:
            return None
        running = sum(k in started for k in flight)
        free, total = self.resources()
        # what the study's running cells hold: no more than the cluster has in use (a cell whose
        # node left, retried by Ray, holds nothing)
        in_use = {r: total.get(r, 0) - free.get(r, 0) for r in self.ask}
        held = {r: min(running * a, in_use[r]) for r, a in self.ask.items()}
        # cells Ray may have started that have not said so yet: what came into use since they
        # were handed over, within START_GRACE_S of it (unknown: nothing)
        doubt = [k for k in flight if k not in started and now - self.dispatched[k] < START_GRACE_S]
        for r, a in self.ask.items():
            base = min((self.before.get(k, {}).get(r, in_use[r]) for k in doubt), default=0.0)
            held[r] += min(len(doubt) * a, max(0.0, in_use[r] - held[r] - base))
        if all(free.get(r, 0) + held[r] >= a - 1e-9 for r, a in self.ask.items() if a > 0):
            return None  # the study's own queue: its running cells hold what the next one needs
        self._last = now
        first = max(waiting, key=waiting.__getitem__)
        more = f" ({len(waiting) - 1} more cell(s) wait as well)" if len(waiting) > 1 else ""
        have = " and ".join(
            f"{free.get(r, 0):g} of {total.get(r, 0):g} {r}s free" for r in ("CPU", "GPU")
        )
        own = " and ".join(f"{held.get(r, 0):g} {r}s" for r in ("CPU", "GPU"))
        return (
            f"waiting for resources: cell {self.labels[first]} was submitted "
            f"{fmt_s(waiting[first])} ago and has not started{more}; {self.asks}; the Ray "
            f"cluster has {have}, and this study's running cells hold {own}: "
            "something else holds what the cell needs, or no node has room for it; see `ray "
            "status`, wait for that work or stop it, add nodes or lower resources"
        )


def fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
