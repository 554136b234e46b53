"""``ablate slurm run``: a study on the allocation this process runs in, from the first node.

In order, the first three refusing (exit status 2, naming what is wrong) before anything starts:

1. the allocation (``allocation.read_allocation``) must fit the study: a cell's ``resources.cpus``
   and ``resources.gpus`` on some node (its workers on the nodes together), and the study's own
   checks (``driver.preflight``: the ``ABLATE_*`` switches, GPUs, devices, memory, the hub);
2. the job's ports must be free on this node (another job's Ray or MLflow would collide), and the
   study's SQLite store must not be in use by another job (``StoreLock``);
3. the study planned against its store and, when a cell is left to run (or its data changed
   since it trained), its data prepared as ``ablate run`` does before it starts
   (``runner.prepared_data``: data that do not prepare, and a cell interrupted on data that
   prepare to other tokens now, refused): with nothing left to run it prepares and starts
   nothing (the report);
4. ``_start``: on several nodes the study's SQLite store served by the job's own MLflow server on
   this node (``tracking.server``; ``_serve``), Ray's head here and a Ray node on every other node
   (``ray_nodes``) with a token made for the job; the study runs on them (``driver.runner``), and
   everything stops at the end, on a failure and on a signal.

On SIGUSR1 (the time limit nears) or SIGTERM (requeue, preemption, scancel) the running cells
checkpoint after their current step and end ``interrupted`` (``signals``); the study returns
``interrupted`` and the next job resumes each cell where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ablate.errors import AblateError, CannotRunError
from ablate.slurm.allocation import Allocation, SlurmError, check_fits
from ablate.slurm.ports import JobPorts, ports_taken
from ablate.slurm.ray_nodes import JobRay, shielded
from ablate.slurm.signals import Stopped, StopSignals

if TYPE_CHECKING:
    from ablate.driver.preparing import DataSet
    from ablate.study import Study
    from ablate.tracking.server import TrackingServer

START_TIMEOUT_S = 180.0
"""How long the job's Ray nodes and MLflow server may take to come up."""


def check_study(study: Study, alloc: Allocation) -> None:
    """``driver.preflight``'s checks that do not need the cluster: the ``ABLATE_*`` switches hold
    values they allow (as ``ablate run`` checks them first), the store can be created, cells
    that need a GPU get one, ``cuda:N`` exists in a task, this node's device runs every recipe and
    has the memory a cell needs (the allocation's nodes are taken to be alike), the hub."""
    from ablate.driver.preflight import (
        check_devices,
        check_environment,
        check_gpus,
        check_hub,
        check_memory,
        check_ray_devices,
    )
    from ablate.errors import TrackingError
    from ablate.tracking import check_store

    check_environment()
    try:
        check_store(study.tracking_uri)
    except TrackingError as e:
        raise CannotRunError(str(e)) from None
    check_gpus(study, gpus_seen=alloc.gpus_per_node, where=f"job {alloc.job_id}'s nodes")
    check_ray_devices(study)
    check_devices(study)
    check_memory(study)
    check_hub(study)


class StoreLock:
    """An exclusive lock beside a study's SQLite file, held by the job that writes it (directly on
    one node, through its MLflow server on several): two jobs writing one SQLite file from two
    nodes would corrupt it."""

    def __init__(self, db: Path, holder: str) -> None:
        self.path = db.parent / ".ablate-slurm.lock"
        self.holder = holder
        self._f: IO[str] | None = None

    def __enter__(self) -> StoreLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 (held until __exit__)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            who = f.read().strip() or "another process"
            f.close()
            raise SlurmError(
                f"the study's store in {self.path.parent} is in use by {who}: two jobs writing "
                "one SQLite file from two nodes would corrupt it; wait for that job to end, or "
                "give this study another output folder (-o)"
            ) from None
        except OSError as e:
            f.close()
            raise SlurmError(
                f"cannot lock a file in {self.path.parent} ({e}): SQLite is not safe on a file "
                "system without working locks; put the output folder on one that has them, or "
                "set tracking.uri (--tracking-uri) to a tracking server, http://<host>:<port>"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(self.holder)
        f.flush()
        self._f = f
        return self

    def __exit__(self, *exc: object) -> None:
        if self._f is not None:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()


@dataclass
class SlurmRun:
    """How ``run_on_allocation`` ended."""

    stopped_by: str = ""
    """Why the cells were asked to stop ("": they were not)."""
    interrupted: bool = False
    failed: int = 0
    left_failed: int = 0
    report: str = ""
    ready_s: float = 0.0
    """From the driver's start to Ray's nodes and the MLflow server answering."""


def _say(out: IO[str], msg: str) -> None:
    print(f"slurm: {time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}", file=out, flush=True)


@contextlib.contextmanager
def _job_token(job_dir: Path) -> Iterator[None]:
    """A Ray token made for this job (256 random bits, ``secrets``), in a file only this user reads;
    every node's Ray and this process's ``ray.init`` take it through the environment (Ray reads it
    once per process, so before anything imports Ray here). Removed at the end."""
    path = job_dir / "ray-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    saved = {
        k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")
    }
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        path.unlink(missing_ok=True)


def _sqlite(study: Study) -> Path | None:
    """The study's SQLite file, None for a tracking server."""
    from ablate.tracking import is_local_store
    from ablate.tracking.store import sqlite_path

    uri = study.tracking_uri
    return sqlite_path(uri) if is_local_store(uri) else None


@contextlib.contextmanager
def _serve(study: Study, job_dir: Path, host: str, port: int) -> Iterator[TrackingServer]:
    """The study's SQLite store served by the job's own MLflow server on this node, for cells on
    several nodes, under ``supervise`` (so that it outlives SLURM's SIGTERM until the cells have
    checkpointed, and none of its processes outlives the job). A new store is made from the
    template first (``prepare_served_store``: the server then runs no migrations); ``_experiment``
    creates the study's experiment through the server."""
    from ablate.tracking.server import TrackingServer
    from ablate.tracking.store import prepare_served_store

    server = TrackingServer(
        study.tracking_uri, host=host, port=port,
        artifacts_destination=study.output_dir / "artifacts", log=job_dir / "mlflow-server.log",
        preexec=shielded,
        wrap=[sys.executable, "-m", "ablate.slurm.supervise", "--grace", "5", "--"],
    )  # fmt: skip
    study.output_dir.mkdir(parents=True, exist_ok=True)
    prepare_served_store(study.tracking_uri)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _experiment(study: Study, server: TrackingServer) -> None:
    """The study's experiment, created through the server if new, with its artifacts in the output
    folder (a file location every node reaches), not the server's ``mlflow-artifacts:/``: so that
    ``ablate report`` and ``ablate ui`` read the same store from the login node afterwards, with no
    server."""
    from ablate.tracking import StudyTracker

    artifacts = study.output_dir / "artifacts"
    StudyTracker(server.url, study.name, experiment=study.experiment, artifact_root=artifacts)


def _refuse_early(study: Study, alloc: Allocation) -> JobPorts:
    """Steps 1 and 2 of the module docstring but the store's lock; the job's ports."""
    if alloc.this_node != alloc.head:
        raise SlurmError(
            f"this process runs on {alloc.this_node or 'no node of the job'}, not on the job's "
            f"first node {alloc.head}, where Ray's head and the driver go (run it from the batch "
            "script, or in salloc through `ablate slurm run`, which moves itself there)"
        )
    check_fits(study, alloc)
    check_study(study, alloc)
    ports = JobPorts(alloc.job_id)
    taken = ports_taken(ports.named(head=True, mlflow=len(alloc.nodes) > 1))  # 1 node: no server
    if taken:
        raise SlurmError(
            f"node {alloc.head}: {'; '.join(taken[:4])}: another job's Ray or MLflow on this node "
            f"(or one started by hand) uses job {alloc.job_id}'s {ports.describe()}; stop it, or "
            "run the study in another job"
        )
    return ports


def _start(
    stack: contextlib.ExitStack,
    study: Study,
    alloc: Allocation,
    ray: JobRay,
    signals: StopSignals,
    *,
    serve: bool,
    object_store_mb: int,
    start_timeout: float,
    out: IO[str],
) -> None:
    """Ray on every node and, with ``serve``, the job's MLflow server (the study's URI pointed at
    it), connected; each stopped by ``stack`` when it unwinds."""
    from ablate.executor.cluster import connect, disconnect, wait_for_nodes

    t0 = time.monotonic()
    job_dir = ray.job_dir
    stack.callback(_say, out, "Ray and the job's processes stopped")
    stack.enter_context(_job_token(job_dir))
    stack.callback(ray.stop)
    ray.start_head()  # it takes a while: the store's server meanwhile
    server = None
    if serve:  # several nodes on a SQLite store: the job's own server (_serve says why)
        server = stack.enter_context(
            _serve(study, job_dir, ray.addresses[alloc.head], ray.ports.mlflow)
        )
    ray.start_nodes()

    def check() -> None:
        ray.check()
        if signals.reason():
            raise Stopped(f"stopped while starting: {signals.reason()}")

    stack.callback(disconnect)
    connect(ray.address, num_cpus=None, object_store_mb=object_store_mb, dashboard=False)
    signals.install()  # over the SIGTERM handler ray.init put in place
    wait_for_nodes(len(alloc.nodes), start_timeout, check)
    _say(out, f"Ray on {len(alloc.nodes)} node(s) at {ray.address} ({time.monotonic() - t0:.1f} s)")
    if server is not None:
        server.wait(start_timeout)
        _experiment(study, server)
        study.file.tracking.uri = server.url
        _say(out, f"MLflow server {server.url} on {server.store} ({time.monotonic() - t0:.1f} s)")
    check()


def run_on_allocation(
    study: Study,
    alloc: Allocation,
    *,
    out: IO[str] | None = None,
    rerun_failed: bool = False,
    rerun_stale: bool = False,
    max_concurrent: int | None = None,
    progress: bool = True,
    report: bool = True,
    object_store_mb: int = 256,
    start_timeout: float = START_TIMEOUT_S,
) -> SlurmRun:
    """Run ``study`` on the allocation (see the module docstring); raises ``SlurmError`` (or
    another ``CannotRunError``) before anything starts, ``AblateError`` for a failure after."""
    from ablate.driver.runner import run_study

    out = out or sys.stderr
    t0 = time.monotonic()
    _refuse_early(study, alloc)
    multi = len(alloc.nodes) > 1
    _say(out, f"{alloc.describe()}; {JobPorts(alloc.job_id).describe()}")
    job_dir = study.output_dir / "slurm" / f"job-{alloc.job_id}"
    job_dir.mkdir(parents=True, exist_ok=True)
    os.environ.pop("RAY_ADDRESS", None)  # the job's Ray, named explicitly below
    result = SlurmRun()
    given = study.file.tracking.uri
    with contextlib.ExitStack() as stack, StopSignals() as signals:
        stack.callback(setattr, study.file.tracking, "uri", given)
        db = _sqlite(study)
        if db is not None:  # one job at a time on a SQLite store, however many nodes it has
            holder = f"job {alloc.job_id} on {alloc.head} ({socket.gethostname()})"
            stack.enter_context(StoreLock(db, holder))
        data = _to_run(study, rerun_failed, rerun_stale, result, out)
        if data is None:
            if report:
                result.report = _report(study, out)
            return result
        workers = study.file.resources.workers
        ray = JobRay(alloc, job_dir, object_store_mb=object_store_mb, dashboard=workers > 1)
        _start(
            stack, study, alloc, ray, signals, serve=db is not None and multi,
            object_store_mb=object_store_mb, start_timeout=start_timeout, out=out,
        )  # fmt: skip
        result.ready_s = time.monotonic() - t0
        # on one node the study runs as on one machine (this process is connected to the job's
        # Ray already): its checks of this machine's CPUs, devices and memory, a SQLite store
        res = run_study(
            study,
            executor="ray",
            address=ray.address if multi else None,
            num_cpus=None if multi else alloc.cpus[0],
            rerun_failed=rerun_failed,
            rerun_stale=rerun_stale,
            max_concurrent=max_concurrent,
            progress=progress,
            stream=out,
            drain=signals.reason,
            data=data,
        )
        result.stopped_by = signals.reason()
        result.interrupted = res.interrupted
        result.failed = len(res.failed)
        result.left_failed = sum(p.action == "failed" for p in res.planned)
        if report and not res.interrupted:
            result.report = _report(study, out)
    return result


def _to_run(
    study: Study, rerun_failed: bool, rerun_stale: bool, result: SlurmRun, out: IO[str]
) -> Mapping[str, DataSet] | None:
    """The study's data, prepared and checked as ``ablate run`` does before it starts
    (``runner.prepared_data``: a cell interrupted on data that prepare to other tokens now is
    refused, ``CannotRunError``), when a cell needs to run, or a baseline seed to be copied from
    another store (planned as ``run`` plans it, against the store, read only: this job holds
    it; a study with sequential seeds, the cells its waves have asked for so far); None for a
    job with nothing left (a requeued one whose study ended): no Ray started. Planned first on
    the data as they are: such a job prepares nothing (which could checksum, or tokenize, a whole
    corpus) unless a cell's data changed since it trained and only their tokens tell what it
    does (``stale-data``; a finished one with ``--rerun-stale``)."""
    from ablate.driver.planning import TO_RUN, plan
    from ablate.driver.runner import prepared_data
    from ablate.report.waves import replay

    asked = study
    if study.sequential is not None:  # the cells its waves have asked for (driver.waves)
        with contextlib.suppress(AblateError):  # nothing recorded: every cell planned, new
            asked = dataclasses.replace(study, cells=replay(study).cells)
    planned = plan(asked, rerun_failed=rerun_failed, rerun_stale=rerun_stale)
    data = None
    if any(
        p.action in (*TO_RUN, "reuse", "stale-data") or (rerun_stale and p.data_change)
        for p in planned
    ):
        data = prepared_data(study, rerun_stale=rerun_stale, out=out)
        planned = plan(asked, rerun_failed=rerun_failed, rerun_stale=rerun_stale)
    if data is not None and any(p.action in (*TO_RUN, "reuse") for p in planned):
        return data
    result.left_failed = sum(p.action == "failed" for p in planned)
    _say(out, f"nothing to run: the study's {len(planned)} cells have ended; Ray not started")
    return None


def _report(study: Study, out: IO[str]) -> str:
    from ablate.report.study import report_study

    try:
        rep = report_study(study)
    except AblateError as e:
        _say(out, f"no report: {e}")
        return ""
    return str(rep.report_md)


def relaunch_command(alloc: Allocation, args: list[str]) -> list[str]:
    """The ``srun`` that runs ``ablate <args>`` on the job's first node with that node's CPUs (and
    GPUs): from an ``salloc`` shell on the login node, where no Ray node can run the driver."""
    cmd = [
        "srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={alloc.head}",
        f"--cpus-per-task={alloc.cpus_of(alloc.head)}", "--mem=0", "--kill-on-bad-exit=1",
    ]  # fmt: skip
    if alloc.gpus_per_node:
        cmd.append(f"--gres=gpu:{alloc.gpus_per_node}")
    return [*cmd, sys.executable, "-m", "ablate.cli", *args]
