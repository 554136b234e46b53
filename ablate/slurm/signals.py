"""The signals that end a SLURM job early, turned into a request that the running cells checkpoint
and stop (the runner's ``drain``):

- SIGUSR1: the warning ``sbatch --signal=B:USR1@<seconds>`` sends to the batch script ahead of the
  time limit, which the script written by ``ablate slurm submit`` forwards to the driver (and then
  requeues the job itself: SLURM does not requeue a job that reaches its time limit);
- SIGTERM: what SLURM sends every process of a job it requeues (``scontrol requeue``, preemption)
  or cancels, ``KillWait`` seconds (30 by default) before SIGKILL. The job's Ray and MLflow
  processes have it blocked (``on_node``), so the cells live on until they have checkpointed.

SIGINT stays Ctrl-C: the runner's own, which cancels the cells at once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ablate.errors import RunnerError

WHY = {
    signal.SIGUSR1: "SIGUSR1, the job nears its time limit",
    signal.SIGTERM: "SIGTERM, SLURM ends the job (requeue, preemption or scancel)",
}


class Stopped(RunnerError):
    """A signal came while the job was starting: nothing ran, the next job starts again."""


class StopSignals:
    """Within the block, SIGUSR1 and SIGTERM are noted (the first one's reason is kept) instead of
    ending the process; ``reason()`` says why the cells must stop ("" while they need not).

    ``install`` again after ``ray.init``: Ray's core worker puts its own SIGTERM handler in place
    (Abseil's failure handler, which aborts the process)."""

    def __init__(self) -> None:
        self.why = ""
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: Any) -> None:
        self.why = self.why or WHY[signal.Signals(signum)]

    def reason(self) -> str:
        return self.why

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in WHY:
            previous = signal.signal(s, self._note)
            self._previous.setdefault(s, previous)

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
