"""``RayExecutor``: each task a Ray task with the study's resources, at most ``max_concurrent`` in
flight, outcomes as they finish. A task whose worker dies is retried (``resources.max_retries``) and
resumes from its checkpoint in the same MLflow run; a multi-worker cell is one Ray task holding no
resources of its own that runs ``worker.run_distributed``, whose Ray Train workers hold them.

Each task tells a small actor of the executor's (``_Starts``, no resources) when it starts to run,
so that the driver knows which of its cells hold resources now and which wait for them
(``started``; the runner's wait watch, ``progress.WaitWatch``, reads it). The same actor carries
the driver's request that the running cells checkpoint and stop (``stop_running``), which each
task watches (``worker.StopWatch``)."""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from typing import Any

from ablate.errors import CannotRunError
from ablate.executor.cluster import cluster_address, connect
from ablate.executor.task import Outcome, Task
from ablate.executor.worker import error_line, run_distributed, run_one_on_ray

CANCEL_WAIT_S = 30.0
"""How long ``cancel`` waits for a cancelled task's worker to end (it takes tens of ms)."""


def _slots(resources: dict[str, float], cpus: float, gpus: float) -> int:
    """How many workers of ``cpus`` CPUs and ``gpus`` GPUs one node's resources hold."""
    n = math.floor(resources.get("CPU", 0) / cpus)
    if gpus > 0:
        n = min(n, math.floor(resources.get("GPU", 0) / gpus))
    return int(n)


class _Starts:
    """A Ray actor (holding no resources) that each task of one executor tells when it starts to
    run: from then on the task holds what it asked for (a retried task tells it again). It also
    holds the driver's stop flag, which the tasks poll."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.stop = False

    def add(self, key: str) -> None:
        self.keys.add(key)

    def get(self) -> set[str]:
        return self.keys

    def request_stop(self) -> None:
        self.stop = True

    def stopping(self) -> bool:
        return self.stop


def cell_task_env() -> dict[str, Any]:
    """The ``runtime_env`` of a multi-worker cell's task: ``RAY_ADDRESS`` set to this Ray's own GCS.
    Ray Train's controller inherits it (its own ``env_vars`` merge with the task's), and so does the
    placement-group cleaner the controller starts, which asks the state API whether the controller
    lives at the address it finds itself: without it, the last ``ray start`` on the machine
    (``/tmp/ray/ray_current_cluster``), another cluster or a dead one. Asking a dead one times out,
    and the controller's shutdown then waits up to 12 s for the cleaner ("Failed to stop
    PlacementGroupCleaner gracefully")."""
    import ray

    return {"env_vars": {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}}


class RayExecutor:
    """Each task a Ray task with the study's resources; at most ``max_concurrent`` in flight (the
    rest wait here, in submission order), outcomes as they finish."""

    name = "ray"
    in_process = False

    def __init__(
        self,
        *,
        address: str | None = None,
        cpus: float = 1,
        gpus: float = 0,
        max_retries: int = 3,
        max_concurrent: int | None = None,
        num_cpus: int | None = None,
        object_store_mb: int = 256,
        workers: int = 1,
    ) -> None:
        import ray

        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            # Ray Train (multi-worker cells) asks the state API, served by the dashboard, whether
            # its controller lives: without one it warns about that every few seconds
            connect(
                cluster_address(address),
                num_cpus=num_cpus,
                object_store_mb=object_store_mb,
                dashboard=workers > 1,
            )
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.multi_node = len(nodes) > 1
        self.cluster_gpus = sum(n["Resources"].get("GPU", 0) for n in nodes)
        """GPUs of the cluster's live nodes, all together (Ray's count, declared or detected)."""
        slots = sum(_slots(n["Resources"], cpus, gpus) for n in nodes)
        if slots < workers:  # Ray would queue every task forever
            have = ", ".join(
                f"{n['Resources'].get('CPU', 0):g} CPUs / {n['Resources'].get('GPU', 0):g} GPUs"
                for n in nodes
            )
            self.close()
            each = f"{workers} workers of " if workers > 1 else ""
            raise CannotRunError(
                f"resources: a cell asks for {each}{cpus:g} CPUs and {gpus:g} GPUs, but the Ray "
                f"cluster's nodes fit {slots} such worker(s) ({have or 'no live node'}); lower "
                "resources.cpus / resources.gpus / resources.workers or add nodes that fit"
            )
        self._starts: Any = ray.remote(num_cpus=0)(_Starts).remote()
        self._started: set[str] = set()
        self._remote: Any
        if workers > 1:  # the cell's task holds nothing: its Ray Train workers hold the resources
            opts: dict[str, Any] = {
                "num_cpus": 0,
                "max_retries": max_retries,
                "runtime_env": cell_task_env(),
            }
            self._remote = ray.remote(run_distributed).options(**opts)  # type: ignore[arg-type]
            self._kwargs: dict[str, Any] = dict(
                workers=workers, cpus=cpus, gpus=gpus, max_failures=max_retries
            )
        else:
            opts = {"num_cpus": cpus, "num_gpus": gpus, "max_retries": max_retries}
            self._remote = ray.remote(run_one_on_ray).options(**opts)
            self._kwargs = {}
        self._kwargs["starts"] = self._starts
        self.max_concurrent = max_concurrent
        self._queue: deque[Task] = deque()
        self._inflight: dict[Any, Task] = {}
        self.dispatched: dict[str, float] = {}
        """When (time.monotonic) each task was handed to Ray, by key (it may wait there for
        resources; the runner reports a cell that waits long: ``progress.WaitWatch``)."""
        self.in_use_before: dict[str, dict[str, float]] = {}
        """What the cluster had in use (``CPU``, ``GPU``) just before each task was handed to Ray,
        by key: what comes into use after it may be that task, started but not yet heard from."""

    def submit(self, task: Task) -> None:
        self._queue.append(task)
        self._dispatch()

    def _dispatch(self) -> None:
        limit = self.max_concurrent or math.inf
        if not (self._queue and len(self._inflight) < limit):
            return
        free, total = self.resources()  # in use before these tasks (``in_use_before``)
        in_use = {r: total.get(r, 0.0) - free.get(r, 0.0) for r in ("CPU", "GPU")}
        while self._queue and len(self._inflight) < limit:
            t = self._queue.popleft()
            self._inflight[self._remote.remote(t, **self._kwargs)] = t
            self.dispatched[t.key] = time.monotonic()
            self.in_use_before[t.key] = in_use

    def wait(self, timeout: float) -> list[Outcome]:
        if not self._inflight:
            return []
        refs = list(self._inflight)
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout)
        out = [self._outcome(ref, self._inflight.pop(ref)) for ref in ready]
        self._dispatch()
        return out

    def _outcome(self, ref: Any, task: Task) -> Outcome:
        try:
            o: Outcome = self._ray.get(ref)
            return o
        except self._ray.exceptions.RayError as e:  # the worker died more often than retried
            return Outcome(task.key, "failed", reason=error_line(e, 500))

    def started(self) -> set[str]:
        """Keys of the tasks that have started to run on a worker (so held their resources), as
        the tasks told (a second or so after Ray started them); the last answer when the record
        cannot be read within a few seconds."""
        with contextlib.suppress(Exception):
            self._started = set(self._ray.get(self._starts.get.remote(), timeout=5))
        return self._started

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """The cluster's resources (``CPU``, ``GPU``, ...) free now and in all, as Ray counts
        them."""
        return dict(self._ray.available_resources()), dict(self._ray.cluster_resources())

    def cancel(self, *keys: str) -> None:
        """Drop the tasks ``keys`` that wait here; kill the workers of those in flight
        (``ray.cancel(force=True)``, which returns at once), all of them first, then wait until
        Ray reports them ended (``CANCEL_WAIT_S`` at most, once for all): their workers have been
        told to exit then, and do within moments. A worker being killed may still be writing its
        checkpoint, which the caller may remove next (``ablate tune`` removes what such a write
        leaves when it starts again)."""
        self._queue = deque(t for t in self._queue if t.key not in keys)
        cancelled = []
        for ref, t in list(self._inflight.items()):
            if t.key in keys:
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
                    cancelled.append(ref)
                del self._inflight[ref]
        if cancelled:
            with contextlib.suppress(Exception):
                self._ray.wait(cancelled, num_returns=len(cancelled), timeout=CANCEL_WAIT_S)

    def stop_running(self) -> None:
        """Hand out nothing more, and ask the tasks in flight to checkpoint after their current
        step and end ``interrupted`` (those not started yet end as they start); their outcomes
        come through ``wait`` as usual."""
        self._queue.clear()
        self._ray.get(self._starts.request_stop.remote(), timeout=30)

    def cancel_all(self) -> None:
        self._queue.clear()
        for ref in list(self._inflight):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._inflight.clear()

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        elif (starts := getattr(self, "_starts", None)) is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(starts)

    def __len__(self) -> int:
        return len(self._queue) + len(self._inflight)
