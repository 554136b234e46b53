"""What runs in a worker: ``run_one(task) -> Outcome`` trains one cell (or tune trial) and logs into
its MLflow run; ``run_distributed`` does the same for a multi-worker cell through a Ray Train
``TorchTrainer`` (NCCL on GPUs, gloo on CPUs), rank 0 logging. Both are plain functions that the
executors (``local``, ``ray_executor``) only decide where to run; both check the worker first
(``ablate.executor.worker_checks``) and never raise for a failing run: the failure is the outcome, recorded
on the run, so one bad cell does not stop a study.

A cell on Ray also watches its executor's stop flag (``StopWatch``): once the driver raises it (a
SLURM job about to be requeued, ``ablate.slurm``), the cell checkpoints after its current step and
ends ``interrupted``, to resume there in the next job; one that has not started yet does not start.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ablate.executor.task import Outcome, Task

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_line(e: BaseException, limit: int) -> str:
    """A Ray error as one line: its last non-empty line without terminal colours, cut at
    ``limit`` characters, after the exception's type."""
    lines = [x for x in _ANSI.sub("", str(e)).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[-1].strip()[:limit] if lines else repr(e)}"


def run_one(task: Task, stop: Callable[[], bool] | None = None) -> Outcome:
    """Train one cell, logging into its MLflow run; never raises for a failing run (the failure is
    the outcome, recorded on the run) so one bad cell does not stop a study. A ddp or fsdp cell
    of one worker trains in a process group of one (``train.parallel.process_group``). ``stop``
    (asked after every step): checkpoint and end ``interrupted`` once it says True."""
    from ablate.executor.worker_checks import check_worker
    from ablate.tracking import MlflowLogger
    from ablate.train import RunConfig

    _enter(task)
    logger = MlflowLogger(task.tracking_uri, task.run_id)
    t0 = time.perf_counter()
    try:
        check_worker(task)  # the driver's code and paths, before anything is logged as running
        cfg = RunConfig.from_dict(task.config)
        return _train_cell(task, cfg, logger, stop=stop)
    except Exception as e:  # a failed cell is a result, not a crash of the study
        _log_failure(logger, e)
        reason = f"{type(e).__name__}: {e}"
        return Outcome(task.key, "failed", reason=reason, wall_time_s=time.perf_counter() - t0)
    finally:
        with contextlib.suppress(Exception):
            logger.close()


def run_one_on_ray(task: Task, starts: Any) -> Outcome:
    """``run_one`` as a Ray task: it first tells ``starts`` (its executor's actor) that it runs on
    a worker, and so holds the resources it asked for, then trains the cell, stopping it when the
    actor's stop flag goes up (``StopWatch``); a task that starts after that ends at once."""
    starts.add.remote(task.key)
    with StopWatch(starts) as watch:
        if watch.stopping():
            return Outcome(task.key, "interrupted", reason="stopped before it started")
        return run_one(task, stop=watch.stopping)


class StopWatch:
    """Polls an executor's actor (``ray_executor._Starts``) for its stop flag every ``every``
    seconds in a thread of its own, so that the trainer's check after each step costs nothing."""

    def __init__(self, starts: Any, every: float = 1.0) -> None:
        self._starts, self._every = starts, every
        self._flag, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="ablate-stop-watch")

    def _ask(self) -> bool:
        # through the reference's future, never ray.get: a task blocked in ray.get (or ray.wait)
        # hands its CPUs back to Ray, which then starts another task on them, so that a study's
        # cells would run more at once than its resources allow
        return bool(self._starts.stopping.remote().future().result(timeout=10))

    def _poll(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(Exception):
                if self._ask():
                    self._flag.set()
                    return
            self._done.wait(self._every)

    def stopping(self) -> bool:
        return self._flag.is_set()

    def __enter__(self) -> StopWatch:
        with contextlib.suppress(Exception):  # the first answer before anything starts
            if self._ask():
                self._flag.set()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()


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


def _train_cell(
    task: Task,
    cfg: Any,
    logger: Any,
    extra: dict[str, Any] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Outcome:
    """Check the device, record where the cell runs and that it is running, train it (in a
    process group of one where its parallel mode needs a group and none exists) and return its
    outcome. ``logger`` is rank 0's (the others pass a ``NullLogger``). Where the cell runs
    includes the SLURM node and job (``SLURMD_NODENAME``, ``SLURM_JOB_ID``) when there are."""
    from ablate.executor.devices import check_worker_device, placement
    from ablate.tracking import MlflowLogger
    from ablate.train import train
    from ablate.train.branch import Branches
    from ablate.train.checkpoint import checkpoint_step
    from ablate.train.damage import load_damage
    from ablate.train.device import resolve_device
    from ablate.train.parallel import process_group
    from ablate.train.provenance import environment

    check_worker_device(cfg.device, task.label)  # before anything is logged as running
    branches = Branches.from_dict(task.branches) if task.branches else None
    if isinstance(logger, MlflowLogger):  # rank 0's, or a one-process cell's
        ckpt = checkpoint_step(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        where = {"host": socket.gethostname(), "pid": os.getpid(), **slurm_place(), **(extra or {})}
        logger.log_environment({**environment(cfg), **placement(cfg.device)})
        if ckpt is None:
            logger.mark_started()  # the run's start: now, not when the driver queued it
        # the step this attempt starts from: 0 where the trainer sets a damaged checkpoint aside
        resumed = 0 if not ckpt or load_damage(cfg.checkpoint_dir) else ckpt
        logger.log_status("running", {**where, "resumed_from": resumed})
        # a decay branch that starts from its trunk's checkpoint (the trainer loads the same one):
        # the trunk's curve up to there first, so that the run holds the whole curve; none where
        # the trainer's load would find it damaged, set it aside and train from step 0
        start = None
        if branches is not None and ckpt is None and task.trunk_run:
            start = branches.loaded_start()
        if start is not None:
            logger.copy_curve(task.trunk_run, step=start, tokens=start * cfg.train.tokens_per_step)
    with process_group(cfg, resolve_device(cfg.device)):
        res = train(cfg, logger, stop_after=task.stop_after, branches=branches, stop=stop)
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


def slurm_place() -> dict[str, str]:
    """The SLURM node and job this process runs in (nodes of one machine share a hostname), as the
    status details ``node`` and ``slurm_job``; empty outside SLURM."""
    out = {}
    if node := os.environ.get("SLURMD_NODENAME"):
        out["node"] = node
    if job := os.environ.get("SLURM_JOB_ID"):
        out["slurm_job"] = job
    return out


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

    from ablate.executor.worker_checks import check_worker
    from ablate.train import RunConfig
    from ablate.train.logger import NullLogger

    task: Task = loop_config["task"]
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    if rank == 0 and loop_config.get("starts") is not None:  # every worker of the cell is placed
        loop_config["starts"].add.remote(task.key)
    _enter(task)
    d = dict(task.config)
    if d.get("device", "cpu").startswith("cuda"):  # the GPU Ray Train gave this worker
        d["device"] = str(ray.train.torch.get_device())
    cfg = RunConfig.from_dict(d)
    logger: Any = NullLogger()
    if rank == 0:  # the other ranks never import MLflow (2-3 s of CPU each)
        from ablate.tracking import MlflowLogger

        logger = MlflowLogger(task.tracking_uri, task.run_id)
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
    task: Task,
    *,
    workers: int,
    cpus: float,
    gpus: float,
    max_failures: int,
    starts: Any = None,
) -> Outcome:
    """A multi-worker cell: a Ray Train ``TorchTrainer`` of ``workers`` workers (each with
    ``cpus`` CPUs and ``gpus`` GPUs; NCCL on GPUs, gloo on CPUs) that train the cell's run, rank 0
    logging. A worker's death makes Ray Train restart the group, up to ``max_failures`` times,
    resuming from the sharded checkpoint. Runs as a Ray task itself (holding no resources); never
    raises for a failing run. Rank 0 tells ``starts`` (an executor's actor, if given) when the
    workers run, and so hold their resources."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from ablate.executor.worker_checks import check_worker
    from ablate.tracking import MlflowLogger

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
        train_loop_config={"task": task, "box": box, "starts": starts},
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
        return failed(e, error_line(e, 400))
    finally:
        with contextlib.suppress(Exception):
            ray.kill(box)
