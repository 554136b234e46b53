"""Where cells run: ``run_one(task) -> Outcome`` and the executors that decide where it runs.

``run_one`` is a plain function that trains one cell (or tune trial) and logs into its MLflow run.
An executor takes ``Task``s and hands back ``Outcome``s as they end; ``ablate run`` and
``ablate tune`` drive the same two:

- ``LocalExecutor``: in this process, one task at a time (tests, tiny studies, debugging);
- ``RayExecutor``: each task a Ray task with the study's resources; a task whose worker dies is
  retried (``resources.max_retries``) and resumes from its checkpoint in the same MLflow run.
  A cell with ``resources.workers`` > 1 is one Ray task (no resources of its own) that runs a Ray
  Train ``TorchTrainer`` of that many workers, each with the per-cell ``cpus``/``gpus`` (NCCL on
  GPUs, gloo on CPUs): ``run_distributed``. Rank 0 logs; a dead worker makes Ray Train restart the
  group (``resources.max_retries`` times), which resumes from the sharded checkpoint.

The interface is ``submit(task)``, ``wait(timeout) -> [Outcome]`` (the tasks that ended, possibly
none), ``cancel(key)``, ``cancel_all()`` and ``close()``. A task that cannot produce an outcome
(its worker died more often than retried) ends as a ``failed`` outcome, never as an exception: one
bad cell does not stop a study. This module is the only one that imports Ray.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import sys
import time
import traceback
from collections import deque
from typing import Any, Literal, Protocol

from .errors import CannotRunError, RunnerError
from .task import Outcome, Task

ExecutorName = Literal["ray", "local"]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_one(task: Task) -> Outcome:
    """Train one cell, logging into its MLflow run; never raises for a failing run (the failure is
    the outcome, recorded on the run) so one bad cell does not stop a study. A ddp or fsdp cell
    of one worker trains in a process group of one (``train.parallel.process_group``)."""
    from .tracking import MlflowLogger
    from .train import RunConfig
    from .worker_checks import check_worker

    _enter(task)
    logger = MlflowLogger(task.tracking_uri, task.run_id)
    t0 = time.perf_counter()
    try:
        check_worker(task)  # the driver's code and paths, before anything is logged as running
        cfg = RunConfig.from_dict(task.config)
        return _train_cell(task, cfg, logger)
    except Exception as e:  # a failed cell is a result, not a crash of the study
        _log_failure(logger, e)
        reason = f"{type(e).__name__}: {e}"
        return Outcome(task.key, "failed", reason=reason, wall_time_s=time.perf_counter() - t0)
    finally:
        with contextlib.suppress(Exception):
            logger.close()


def _enter(task: Task) -> None:
    """A worker's set-up for a task: the driver's working directory, the task's thread count."""
    import torch

    if os.path.isdir(task.workdir):
        os.chdir(task.workdir)
    torch.set_num_threads(max(1, task.threads))


def _log_failure(logger: Any, e: BaseException, reason: str = "") -> None:
    reason = reason or f"{type(e).__name__}: {e}"
    with contextlib.suppress(Exception):
        tb = "".join(traceback.format_exception(e))
        logger.log_status("failed", {"reason": reason[:500], "traceback": tb[-4000:]})


def _train_cell(task: Task, cfg: Any, logger: Any, extra: dict[str, Any] | None = None) -> Outcome:
    """Check the device, record where the cell runs and that it is running, train it (in a
    process group of one where its parallel mode needs a group and none exists) and return its
    outcome. ``logger`` is rank 0's (the others pass a ``NullLogger``)."""
    from .devices import check_worker_device, placement
    from .tracking import MlflowLogger
    from .train import train
    from .train.checkpoint import checkpoint_info
    from .train.device import resolve_device
    from .train.parallel import process_group
    from .train.provenance import environment

    check_worker_device(cfg.device, task.label)  # before anything is logged as running
    if isinstance(logger, MlflowLogger):  # rank 0's, or a one-process cell's
        ckpt = checkpoint_info(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        where = {"host": socket.gethostname(), "pid": os.getpid(), **(extra or {})}
        logger.log_environment({**environment(cfg), **placement(cfg.device)})
        if not ckpt:
            logger.mark_started()  # the run's start: now, not when the driver queued it
        logger.log_status("running", {**where, "resumed_from": ckpt["step"] if ckpt else 0})
    with process_group(cfg, resolve_device(cfg.device)):
        res = train(cfg, logger, stop_after=task.stop_after)
    status = "interrupted" if res.status == "stopped" else res.status
    return Outcome(
        task.key,
        status,
        steps=res.steps,
        tokens=res.tokens,
        final_val_loss=res.final_val_loss,
        tokens_per_s=res.tokens_per_s,
        diverged_at=res.diverged_at,
        reason=res.reason,
        wall_time_s=res.wall_time_s,
    )


class _OutcomeBox:
    """A Ray actor that carries rank 0's outcome from a Ray Train worker to its cell's task."""

    def __init__(self) -> None:
        self.outcome: Outcome | None = None

    def put(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def get(self) -> Outcome | None:
        return self.outcome


def _train_worker(loop_config: dict[str, Any]) -> None:
    """One Ray Train worker of a multi-worker cell: its rank of the run, in the process group Ray
    Train made. Rank 0 logs to the cell's MLflow run and hands its outcome to the cell's task. An
    exception ends the worker group (Ray Train restarts it, or fails the cell): a rank that kept
    going would wait forever in a collective the failed one never enters."""
    import ray.train
    import ray.train.torch

    from .tracking import MlflowLogger
    from .train import RunConfig
    from .train.logger import NullLogger
    from .worker_checks import check_worker

    task: Task = loop_config["task"]
    _enter(task)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    d = dict(task.config)
    if d.get("device", "cpu").startswith("cuda"):  # the GPU Ray Train gave this worker
        d["device"] = str(ray.train.torch.get_device())
    cfg = RunConfig.from_dict(d)
    logger: Any = MlflowLogger(task.tracking_uri, task.run_id) if rank == 0 else NullLogger()
    try:
        # each worker's node, too: the cell's task checked only its own (a failure here costs
        # Ray Train's restarts before the cell fails)
        check_worker(task)
        pids = _gather_pids()
        extra = {"workers": ctx.get_world_size(), "worker_pids": ",".join(map(str, pids))}
        outcome = _train_cell(task, cfg, logger, extra)
        if rank == 0:
            loop_config["box"].put.remote(outcome)
    finally:
        with contextlib.suppress(Exception):
            logger.close()


def _gather_pids() -> list[int]:
    """Every rank's process id, in rank order (collective)."""
    import torch.distributed as dist

    pids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return [int(p) for p in pids]


def run_distributed(
    task: Task, *, workers: int, cpus: float, gpus: float, max_failures: int
) -> Outcome:
    """A multi-worker cell: a Ray Train ``TorchTrainer`` of ``workers`` workers (each with
    ``cpus`` CPUs and ``gpus`` GPUs; NCCL on GPUs, gloo on CPUs) that train the cell's run, rank 0
    logging. A worker's death makes Ray Train restart the group, up to ``max_failures`` times,
    resuming from the sharded checkpoint. Runs as a Ray task itself (holding no resources); never
    raises for a failing run."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from .tracking import MlflowLogger
    from .worker_checks import check_worker

    t0 = time.perf_counter()
    _enter(task)

    def failed(e: BaseException, reason: str) -> Outcome:
        """The cell's failure, recorded on its run (no worker has logged it)."""
        logger = MlflowLogger(task.tracking_uri, task.run_id)
        _log_failure(logger, e, reason)
        with contextlib.suppress(Exception):
            logger.close()
        return Outcome(task.key, "failed", reason=reason, wall_time_s=time.perf_counter() - t0)

    try:  # this node has the driver's code and paths: else the cell fails now, not after restarts
        check_worker(task)
    except Exception as e:
        return failed(e, f"{type(e).__name__}: {e}")
    box: Any = ray.remote(num_cpus=0)(_OutcomeBox).remote()
    storage = os.path.join(task.config.get("checkpoint_dir") or task.workdir, "ray_train")
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"task": task, "box": box},
        torch_config=TorchConfig(backend="nccl" if gpus > 0 else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=gpus > 0,
            resources_per_worker={"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})},
        ),
        run_config=RunConfig(
            name=f"{task.key}-{int(time.time())}",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    try:
        trainer.fit()
        outcome = ray.get(box.get.remote())
        if outcome is None:
            raise RuntimeError("the workers ended without an outcome")
        return outcome
    except Exception as e:  # the workers failed more often than restarted
        lines = [x for x in _ANSI.sub("", str(e)).splitlines() if x.strip()]
        return failed(e, f"{type(e).__name__}: {lines[-1].strip()[:400] if lines else e!r}")
    finally:
        with contextlib.suppress(Exception):
            ray.kill(box)


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

    def cancel(self, key: str) -> None: ...

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...

    def __len__(self) -> int:
        """Tasks submitted and not yet returned by ``wait``."""
        ...


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
        return [run_one(self._queue.popleft())] if self._queue else []

    def cancel(self, key: str) -> None:
        self._queue = deque(t for t in self._queue if t.key != key)

    def cancel_all(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a study's cells run on, ``--address`` or else ``RAY_ADDRESS``; None (or
    ``local``): a Ray that ablate starts on this machine."""
    return address or os.environ.get("RAY_ADDRESS") or None


def remote_cluster(address: str | None) -> bool:
    """Whether ``address`` names a Ray cluster that ablate does not start on this machine itself
    (decided without connecting): any address but ``local``, unless this process already started
    the Ray at that address (``ray.init()`` here: its head node is this process's). Such a cluster
    may have, or later get (an autoscaler), nodes that cannot reach this machine's files."""
    address = cluster_address(address)
    if address is None or address == "local":
        return False
    ray = sys.modules.get("ray")  # not imported: this process started no Ray
    if ray is None or not ray.is_initialized():
        return True
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    if not getattr(node, "head", False):  # connected to a cluster, not started here
        return True
    here = ray.get_runtime_context().gcs_address
    return address not in (here, "auto")


_AUTH_FIX = (
    "a cluster with token authentication needs RAY_AUTH_MODE=token here and its token: in "
    "~/.ray/auth_token, or in RAY_AUTH_TOKEN or the file RAY_AUTH_TOKEN_PATH names; `ray "
    "get-auth-token` on the head prints it; see "
    "https://docs.ray.io/en/latest/ray-security/token-auth.html"
)


def _unauthenticated(e: BaseException) -> bool:
    """Whether Ray's error (or its cause) is the cluster refusing the authentication token."""
    while e is not None:
        if "Unauthenticated" in str(e) or "InvalidAuthToken" in str(e):
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False


def check_ray_auth(address: str, timeout: float = 3.0) -> None:
    """Ask the GCS at ``address`` (host:port; not ray://) whether it takes this process's
    authentication, in a second or so: ``ray.init`` retries an authentication refusal for 20 s
    and then says only that it cannot connect. Raises ``RunnerError`` naming what to set; returns
    when the cluster takes it, does not ask for a token, or cannot be asked (``ray.init`` says
    why)."""
    if "://" in address or address == "auto" or os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return
    try:
        import grpc
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        loader = AuthenticationTokenLoader.instance()
        has_token = bool(loader.has_token(ignore_auth_mode=True))
        header = loader.get_token_for_http_header(ignore_auth_mode=True) if has_token else {}
    except Exception:  # a Ray without token authentication: ray.init decides
        return

    def refused(metadata: tuple[tuple[str, str], ...]) -> bool | None:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
            try:
                call(b"", timeout=timeout, metadata=metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    return True
                return None  # unreachable, or not a GCS: ray.init says so
            return False

    if not refused(()):
        return
    where = f"--address {address}: the Ray cluster has token authentication on"
    if not has_token:
        raise RunnerError(f"{where}, and this process has no token ({_AUTH_FIX})")
    if refused(tuple(header.items())):
        raise RunnerError(f"{where}, and refuses this process's token ({_AUTH_FIX})")
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        raise RunnerError(
            f"{where}; this process has its token but does not send it without RAY_AUTH_MODE=token"
            f" (set RAY_AUTH_MODE=token; {_AUTH_FIX})"
        )


def _note_started_cluster() -> None:
    """Say on stderr that ablate starts a Ray of its own although `ray start` runs one here."""
    try:
        from ray._private.services import find_gcs_addresses
        from ray._private.utils import read_ray_address

        started = read_ray_address()
        running = started is not None and started in find_gcs_addresses()
    except Exception:
        return
    if running:
        print(
            f"note: a Ray cluster started with `ray start` runs on this machine ({started}); "
            "ablate starts a local Ray of its own. To run the cells on that cluster, pass "
            f"--address {started} (with a tracking server: --tracking-uri http://<host>:5000).",
            file=sys.stderr,
        )


def _slots(resources: dict[str, float], cpus: float, gpus: float) -> int:
    """How many workers of ``cpus`` CPUs and ``gpus`` GPUs one node's resources hold."""
    n = math.floor(resources.get("CPU", 0) / cpus)
    if gpus > 0:
        n = min(n, math.floor(resources.get("GPU", 0) / gpus))
    return int(n)


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
        address = cluster_address(address)
        if self._owns:
            # Ray Train (multi-worker cells) asks the state API, served by the dashboard, whether
            # its controller lives: without one it warns about that every few seconds
            kw: dict[str, Any] = {"include_dashboard": workers > 1, "log_to_driver": True}
            if address is None or address == "local":
                # "local": a Ray of its own, even where `ray start` runs one (a plain ray.init()
                # would join that one, and refuse num_cpus / object_store_memory)
                _note_started_cluster()
                address = None
                kw.update(num_cpus=num_cpus, object_store_memory=object_store_mb * 2**20)
            else:
                check_ray_auth(address)
            try:
                ray.init(address=address or "local", **kw)
            except ConnectionError as e:
                if _unauthenticated(e):
                    raise RunnerError(
                        f"--address {address}: the Ray cluster refused this process's "
                        f"authentication ({_AUTH_FIX})"
                    ) from e
                raise RunnerError(f"--address {address}: cannot reach a Ray cluster ({e})") from e
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
        self._remote: Any
        if workers > 1:  # the cell's task holds nothing: its Ray Train workers hold the resources
            opts: dict[str, Any] = {"num_cpus": 0, "max_retries": max_retries}
            self._remote = ray.remote(run_distributed).options(**opts)  # type: ignore[arg-type]
            self._kwargs: dict[str, Any] = dict(
                workers=workers, cpus=cpus, gpus=gpus, max_failures=max_retries
            )
        else:
            opts = {"num_cpus": cpus, "num_gpus": gpus, "max_retries": max_retries}
            self._remote = ray.remote(run_one).options(**opts)
            self._kwargs = {}
        self.max_concurrent = max_concurrent
        self._queue: deque[Task] = deque()
        self._inflight: dict[Any, Task] = {}
        self.dispatched: dict[str, float] = {}
        """When (time.monotonic) each task was handed to Ray, by key (it may wait there for
        resources; the runner reports a cell that waits long: ``progress.WaitWatch``)."""

    def submit(self, task: Task) -> None:
        self._queue.append(task)
        self._dispatch()

    def _dispatch(self) -> None:
        limit = self.max_concurrent or math.inf
        while self._queue and len(self._inflight) < limit:
            t = self._queue.popleft()
            self._inflight[self._remote.remote(t, **self._kwargs)] = t
            self.dispatched[t.key] = time.monotonic()

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
            lines = [x for x in _ANSI.sub("", str(e)).splitlines() if x.strip()]
            msg = lines[-1].strip()[:500] if lines else repr(e)
            return Outcome(task.key, "failed", reason=f"{type(e).__name__}: {msg}")

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """The cluster's resources (``CPU``, ``GPU``, ...) free now and in all, as Ray counts
        them."""
        return dict(self._ray.available_resources()), dict(self._ray.cluster_resources())

    def cancel(self, key: str) -> None:
        self._queue = deque(t for t in self._queue if t.key != key)
        for ref, t in list(self._inflight.items()):
            if t.key == key:
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
                del self._inflight[ref]

    def cancel_all(self) -> None:
        self._queue.clear()
        for ref in list(self._inflight):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._inflight.clear()

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()

    def __len__(self) -> int:
        return len(self._queue) + len(self._inflight)
