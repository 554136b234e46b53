"""The live progress line of a running study: cells done / running / queued / failed, the running
cells' step and training loss, elapsed time and an ETA from the steps done so far. It reads the
latest metrics from MLflow in a background thread, so it works the same for in-process and Ray
cells.

A cell counts as running while its step advances. One whose step has not moved for ``STALL_S``
seconds (or ten of its own step times, if longer) counts as queued again: that is what a cell whose
worker died looks like while Ray's retry waits for a worker (it resumes from its checkpoint)."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO

from .tracking import StudyTracker

STALL_S = 60.0


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


def fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
