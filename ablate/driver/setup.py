"""A driver's set-up around a study, shared by ``ablate run`` (``ablate.driver.runner``) and
``ablate tune`` (``ablate.tune.driver``): one driver per output folder (``study_lock``, read by
``ablate status`` through ``driver_running``), a refused start that leaves no folder behind
(``clean_failed_start``), the executor with the study's per-cell resources (``study_executor``),
the study's store, experiment, lock in the store and parent run (``open_study``,
``ablate.tracking.lock``), and the torch threads of one task (``task_threads``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ablate.driver.preflight import check_gpus
from ablate.errors import AblateError, CannotRunError, RunnerError, TrackingError
from ablate.executor import Executor, ExecutorName, LocalExecutor, RayExecutor
from ablate.study import Study
from ablate.tracking import StudyTracker, check_uri, is_local_store, prepare_store
from ablate.train.config import flatten


@contextlib.contextmanager
def study_lock(
    output_dir: Path, command: str = "ablate run", error: type[AblateError] = RunnerError
) -> Iterator[None]:
    """One driver per study: an exclusive lock on <output>/.lock (released when the process dies);
    a held lock raises ``error`` naming ``command``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / ".lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise error(
                f"{output_dir}: another `{command}` is running this study ({holder}); wait for "
                "it or stop it first"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def clean_failed_start(output_dir: Path) -> Iterator[list[bool]]:
    """Remove ``output_dir`` again when the block fails before anything was launched (the caller
    appends to the yielded list when it launches) and the folder did not exist before: a refused
    start leaves nothing behind, and a study that had written there keeps all of it."""
    existed = output_dir.exists()
    launched: list[bool] = []
    try:
        yield launched
    except BaseException:
        if not existed and not launched:
            shutil.rmtree(output_dir, ignore_errors=True)
        raise


def driver_running(output_dir: Path) -> bool | None:
    """Whether an ``ablate run`` holds the study's lock now: True, False (its driver stopped or
    was killed: the kernel released the lock), or None (never run from this output folder)."""
    path = output_dir / ".lock"
    if not path.is_file():
        return None
    with open(path) as f:  # read only: never creates the file
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def study_executor(
    study: Study,
    executor: ExecutorName,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
) -> Executor:
    """The executor for a study's cells or trials: ``local`` (in this process) or ``ray`` (a local
    Ray, or the cluster at ``address`` / ``RAY_ADDRESS``), with the study's per-cell resources."""
    if executor == "local":
        return LocalExecutor()
    res = study.file.resources
    ex = RayExecutor(
        address=address,
        cpus=res.cpus,
        gpus=res.gpus,  # > 0 for cells that need a GPU (check_gpus): Ray sets CUDA_VISIBLE_DEVICES
        max_retries=res.max_retries,
        max_concurrent=max_concurrent or res.max_concurrent,
        num_cpus=num_cpus,
        workers=res.workers,
    )
    try:  # device: auto with resources.gpus: 0 on a cluster that has GPUs
        check_gpus(study, gpus_seen=ex.cluster_gpus, where="the Ray cluster")
    except CannotRunError:
        ex.close()
        raise
    return ex


def artifact_root(study: Study) -> Path | None:
    """Where a new experiment of the study keeps its artifacts: beside a SQLite store, in the
    output folder; None for a tracking server, which chooses (its ``--artifacts-destination``,
    served as ``mlflow-artifacts:/``), so that artifacts go through the server and not into a
    folder on the driver that only the driver sees."""
    return study.output_dir / "artifacts" if is_local_store(study.tracking_uri) else None


@contextlib.contextmanager
def open_study(
    study: Study,
    ex: Executor,
    *,
    lock: str = "run",
    command: str = "ablate run",
    error: type[AblateError] = RunnerError,
    out: IO[str] | None = None,
) -> Iterator[tuple[StudyTracker, str]]:
    """Create the study's store and experiment, take the study's lock ``lock`` in the store (one
    driver at a time whatever its output folder: ``ablate.tracking.lock``; a refusal raises
    ``error`` naming the holder), then find or create the parent run (driver only, before any
    worker starts); yields the tracker and the parent run's id, holding the lock until the block
    ends."""
    uri = study.tracking_uri
    try:
        check_uri(uri, multi_node=ex.multi_node)
    except TrackingError as e:
        raise CannotRunError(str(e)) from None
    prepare_store(uri, study.output_dir)
    tracker = StudyTracker(
        uri, study.name, experiment=study.experiment, artifact_root=artifact_root(study)
    )
    with tracker.driver_lock(
        lock,
        command=command,
        output=study.output_dir.resolve(),
        error=error,
        note=lambda msg: print(msg, file=out or sys.stderr),
    ):
        base = flatten(study.file.base.model_dump(mode="json", exclude_none=True), "base.")
        parent = tracker.parent_run(study.text, description=study.file.description, params=base)
        yield tracker, parent


def task_threads(study: Study) -> int:
    """torch threads of one cell: its CPU cores, rounded down, at least 1."""
    return max(1, int(study.file.resources.cpus))
