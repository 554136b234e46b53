"""The executor interface (``Executor``: submit / wait / cancel) and ``LocalExecutor``, which runs
each task in this process, one at a time (tests, tiny studies, debugging)."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterator
from typing import Literal, Protocol

from ablate.executor.task import Outcome, Task
from ablate.executor.worker import run_one

ExecutorName = Literal["ray", "local"]


class Executor(Protocol):
    name: str
    in_process: bool
    """True when ``wait`` runs a task to its end in this process (nothing can be cancelled
    mid-run)."""
    multi_node: bool
    """Whether tasks may run on other machines (a machine-local store cannot serve them)."""

    def submit(self, task: Task) -> None: ...

    def wait(self, timeout: float) -> list[Outcome]:
        """The outcomes of tasks that ended within ``timeout`` seconds (maybe none)."""
        ...

    def cancel(self, *keys: str) -> None:
        """Drop the tasks ``keys``, or end those that run, and return once they have ended (one
        bounded wait for all of them; a killed process may take moments more to exit)."""
        ...

    def stop_running(self) -> None:
        """Hand out nothing more; ask the tasks in flight to checkpoint after their current step
        and end ``interrupted`` (their outcomes come through ``wait``)."""
        ...

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...

    def __len__(self) -> int:
        """Tasks submitted and not yet returned by ``wait``."""
        ...


@contextlib.contextmanager
def _driver_state_kept() -> Iterator[None]:
    """A task run in this process changes what a worker process may change for good: the working
    directory and torch's thread count. Both come back afterwards, so the driver (or whatever else
    runs in this process next, e.g. compiled code built for its thread count) does not inherit a
    cell's."""
    import torch

    cwd, threads = os.getcwd(), torch.get_num_threads()
    try:
        yield
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)


class LocalExecutor:
    """In this process, one task at a time: ``wait`` runs the next one to its end."""

    name = "local"
    in_process = True
    multi_node = False

    def __init__(self) -> None:
        self._queue: deque[Task] = deque()

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def wait(self, timeout: float) -> list[Outcome]:
        if not self._queue:
            return []
        with _driver_state_kept():
            return [run_one(self._queue.popleft())]

    def cancel(self, *keys: str) -> None:
        self._queue = deque(t for t in self._queue if t.key not in keys)

    def stop_running(self) -> None:
        self._queue.clear()  # a task runs only inside ``wait``: none is in flight between calls

    def cancel_all(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)
