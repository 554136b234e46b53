"""Running a study: plan each cell against what MLflow already holds, launch the cells that need it
on an executor (``ablate.executor``: Ray tasks by default, or in this process), collect results as
they finish, show progress. ``run_study`` is those three steps: ``plan``, ``_launch``, ``_collect``.

What ``run`` does to a cell (``plan``):

- ``run``: no MLflow run has its key yet -> create one and train;
- ``skip``: finished or diverged (both are results);
- ``resume``: started but not ended (interrupted, worker lost, driver killed) -> continue from its
  checkpoint (or from step 0 when there is none) in the same run;
- ``failed``: ended with an error -> left alone unless ``--rerun-failed`` (then resumed like above).

Ctrl-C cancels the cells in flight, marks them ``interrupted`` and leaves a study that the next
``ablate run`` resumes. One driver per study at a time: a lock file in the output folder
(``study_lock``) and, for drivers with other output folders on the same tracking store, the
study's lock in the store (``open_study``, ``ablate.tracking.lock``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import signal
import socket
import sys
import textwrap
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from .devices import cuda_index
from .errors import AblateError, CannotRunError, RunnerError, TrackingError
from .executor import (
    Executor,
    ExecutorName,
    LocalExecutor,
    RayExecutor,
    cluster_address,
    remote_cluster,
)
from .progress import WAIT_REPEAT_S, WAIT_WARN_S, CellProgress, Progress, WaitWatch, fmt_s
from .spec import Cell, Study
from .targets import headroom_warning, reached_fraction, schedule_fraction, target_ppl_of
from .task import Outcome, Task
from .tracking import (
    CellRun,
    CellStatus,
    StudyTracker,
    check_cluster_uri,
    check_store,
    check_uri,
    is_local_store,
    join_runs,
    prepare_store,
    study_status,
)
from .tracking.status import baseline_curves, count
from .tracking.vocab import cell_params, cell_tags, env_tag, outcome_details, short_name
from .train.checkpoint import checkpoint_info
from .train.config import device_kind, flatten
from .train.provenance import code_hash

Action = Literal["run", "skip", "resume", "failed", "rerun"]
ACTIONS: tuple[Action, ...] = ("run", "resume", "rerun", "skip", "failed")
TO_RUN = ("run", "resume", "rerun")


# --- planning -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    action: Action
    run: CellRun | None = None
    why: str = ""
    fresh: bool = False
    """Rerun from step 0 in a new MLflow run (a stale result: the old run and its checkpoint are
    kept, the checkpoint moved aside)."""


def stale(run: CellRun) -> str:
    """Why a recorded result came from other numerics code than this process runs ("" when it did
    not, or when the run predates provenance records)."""
    recorded = run.tags.get(env_tag("code_hash"))
    if not recorded or recorded == code_hash():
        return ""
    return f"code_hash {recorded}, now {code_hash()}"


def plan_cell(
    cell: Cell,
    run: CellRun | None,
    *,
    rerun_failed: bool,
    ckpt_step: int | None,
    rerun_stale: bool = False,
) -> PlannedCell:
    """What ``run`` does to one cell, given its recorded run and its checkpoint's step."""
    if run is None:
        return PlannedCell(cell, "run", None, "new")
    if run.status in ("finished", "diverged"):
        old = stale(run)
        if old and rerun_stale:
            why = f"{run.status} by other code ({old}); again from step 0 in a new run"
            return PlannedCell(cell, "rerun", run, why, fresh=True)
        if old:
            why = f"{run.status}; stale: other training code ({old}); --rerun-stale reruns it"
            return PlannedCell(cell, "skip", run, why)
        return PlannedCell(cell, "skip", run, run.status)
    where = f"from the step-{ckpt_step} checkpoint" if ckpt_step else "from step 0"
    if run.status == "failed":
        if rerun_failed:
            return PlannedCell(cell, "rerun", run, f"failed before; again {where}")
        why = f"failed ({run.reason[:80]}); --rerun-failed reruns it"
        return PlannedCell(cell, "failed", run, why)
    return PlannedCell(cell, "resume", run, f"{run.status}; {where}")


def plan_cells(
    study: Study,
    statuses: Iterable[CellStatus],
    *,
    rerun_failed: bool = False,
    rerun_stale: bool = False,
) -> list[PlannedCell]:
    return [
        plan_cell(
            cs.cell,
            cs.run,
            rerun_failed=rerun_failed,
            ckpt_step=_ckpt_step(study, cs.cell),
            rerun_stale=rerun_stale,
        )
        for cs in statuses
    ]


def plan(
    study: Study, *, rerun_failed: bool = False, rerun_stale: bool = False
) -> list[PlannedCell]:
    """What ``run`` would do to each cell, from the study's MLflow store if it exists (read only:
    planning creates nothing)."""
    try:
        statuses = study_status(study)
    except TrackingError:  # nothing recorded yet: every cell is new
        statuses = join_runs(study, {})
    return plan_cells(study, statuses, rerun_failed=rerun_failed, rerun_stale=rerun_stale)


def target_headroom(study: Study) -> str | None:
    """The warning when the baseline reaches the study's target late in its budget (so costly
    configurations show as "not reached" instead of their cost): from the baseline's recorded
    curves when it has finished runs, else from the schedule (``ablate.targets``)."""
    t = study.target
    if t is None:
        return None
    try:
        curves = baseline_curves(study)
    except TrackingError:  # nothing recorded yet
        curves = []
    if not curves:
        fraction = schedule_fraction(t.from_baseline, t.at)
        return headroom_warning(fraction, measured=False, tolerance=t.tolerance)
    try:
        target = target_ppl_of(t, curves)
    except ValueError:
        return None
    return headroom_warning(reached_fraction(curves, target), measured=True)


def summarize(planned: Iterable[PlannedCell]) -> dict[str, int]:
    """How many cells get each action, in ``ACTIONS`` order."""
    counts = count([p.action for p in planned])
    return {a: counts[a] for a in ACTIONS if a in counts}


def check_devices(study: Study, cells: Iterable[Cell] | None = None) -> None:
    """Ask each cell's GEMM backend whether this machine's device can run its recipe (before any
    cell starts); raises ``CannotRunError`` listing every refusal. On a Ray cluster (``--address``)
    the workers' devices are not this machine's, so the check then runs in the workers."""
    from backends.gemm import UnsupportedFormatError
    from backends.registry import get_backend

    from .train.device import resolve_device

    problems: dict[str, list[str]] = {}
    for c in study.cells if cells is None else cells:
        try:
            get_backend(c.config.backend).check(c.config.recipe, resolve_device(c.config.device))
        except (UnsupportedFormatError, ValueError) as e:
            problems.setdefault(str(e), []).append(c.label)
    if problems:
        lines = [
            f"  cells {', '.join(labels[:4])}{' ...' if len(labels) > 4 else ''}:\n"
            + textwrap.indent(msg, "    ")
            for msg, labels in problems.items()
        ]
        raise CannotRunError("this machine cannot run the study:\n" + "\n".join(lines))


def check_resources(study: Study, *, num_cpus: int | None = None) -> None:
    """On this machine (no cluster), a cell's ``resources`` must fit it: Ray would otherwise queue
    the cells forever. On a cluster the executor checks its nodes once Ray is up."""
    import torch

    res = study.spec.resources
    cpus = num_cpus or os.cpu_count() or 1
    gpus = torch.cuda.device_count()
    problems = []
    n = res.workers
    per = f" per worker x resources.workers {n}" if n > 1 else " per cell"
    if res.cpus * n > cpus:
        problems.append(f"resources.cpus: {res.cpus:g}{per}, but this machine has {cpus}")
    if res.gpus * n > gpus:
        problems.append(f"resources.gpus: {res.gpus:g}{per}, but this machine has {gpus}")
    if problems:
        raise CannotRunError(
            "this machine cannot run the study: "
            + "; ".join(problems)
            + " (lower them, or run on a cluster with --address)"
        )


def _device(study: Study, cell: Cell) -> str:
    """The device a cell's study asked for (``auto`` included), before expansion resolved it."""
    return str(cell.values.get("device", study.spec.base.device))


def needs_gpu(study: Study, cell: Cell) -> str:
    """Why a cell needs a GPU wherever it runs ("" when it does not): its device is CUDA
    (``cuda``, ``cuda:N``, or ``auto`` resolved with ``resources.gpus > 0``), or its backend is
    native and its device ``auto`` (native FP4/FP8 GEMMs exist only on GPUs; a native cell with
    ``device: cpu`` is the backend's to refuse, recipe by recipe)."""
    written = _device(study, cell)
    if device_kind(cell.config.device) == "cuda":
        return f"device: {cell.config.device if written == 'auto' else written}"
    if cell.config.backend == "native" and written == "auto":
        return "backend: native"
    return ""


_WHY_GPU = {
    "device": "to train on a GPU",
    "backend": "to run native FP4/FP8 GEMMs, which exist only on GPUs",
}


def check_gpus(study: Study, *, gpus_seen: float = 0, where: str = "this machine") -> None:
    """Refuse cells that need a GPU when ``resources.gpus`` gives them none (a Ray task that asks
    for no GPU sees none: it would train on the CPU in fp32, or fail in every worker). Cells that
    need one wherever they run (``needs_gpu``) are refused from the study alone; ``device: auto``
    cells (pinned to cpu at expansion when ``resources.gpus`` is 0) when ``where`` has
    ``gpus_seen`` GPUs: a GPU study that forgot ``resources.gpus`` must not silently train on CPUs,
    and a CPU study says ``device: cpu``. Raises ``CannotRunError`` naming the cells and the fix."""
    res = study.spec.resources
    if res.gpus > 0:
        return
    reasons: dict[str, list[str]] = {}
    for c in study.cells:
        why = needs_gpu(study, c)
        if not why and gpus_seen and _device(study, c) == "auto":
            why = "device: auto"
        if why:
            reasons.setdefault(why, []).append(c.label)
    if not reasons:
        return
    lines = []
    for why, labels in reasons.items():
        need = _WHY_GPU.get(why.partition(":")[0], "")
        if why == "device: auto":
            need = (
                f"{where} has {gpus_seen:g} GPU(s), but with resources.gpus: 0 auto resolves to "
                "cpu and these cells would train on the CPU in fp32"
            )
        lines.append(f"  {why} ({_cells(labels)}): {need}")
    alternatives = (
        ["device: cpu to train on CPUs on purpose"]
        if any(w.startswith("device") for w in reasons)
        else []
    )
    if "backend: native" in reasons:
        alternatives.append("backend: emulated to emulate the formats on CPUs")
    raise CannotRunError(
        "resources.gpus: 0 gives each cell no GPU (a Ray task that asks for none sees none), but "
        f"{sum(map(len, reasons.values()))} cell(s) need one:\n"
        + "\n".join(lines)
        + "\nfix: set resources.gpus: 1 (GPUs per cell), or "
        + ", or ".join(alternatives)
    )


def auto_cpu_cells(study: Study) -> list[str]:
    """Labels of the cells that ``device: auto`` pinned to cpu (``resources.gpus`` 0): what a
    cluster with GPUs refuses (``check_gpus``), which ``validate --address`` cannot see."""
    if study.spec.resources.gpus > 0:
        return []
    return [c.label for c in study.cells if _device(study, c) == "auto" and not needs_gpu(study, c)]


def check_ray_devices(study: Study) -> None:
    """A Ray task sees only the GPUs it asks for, numbered from 0: ``cuda:N`` needs N <
    ``resources.gpus`` (rounded up)."""
    seen = math.ceil(study.spec.resources.gpus)
    bad: dict[str, list[str]] = {}
    for c in study.cells:
        index = cuda_index(c.config.device)
        if index is not None and index >= max(seen, 1):  # gpus 0: check_gpus refuses them
            bad.setdefault(c.config.device, []).append(c.label)
    if bad:
        lines = [f"  device: {d} ({_cells(labels)})" for d, labels in bad.items()]
        raise CannotRunError(
            f"a Ray task sees only the resources.gpus: {study.spec.resources.gpus:g} GPU(s) it "
            "asks for, numbered from 0 (Ray sets CUDA_VISIBLE_DEVICES), so these devices do not "
            "exist in it:\n"
            + "\n".join(lines)
            + "\nfix: use device: cuda (the cell's first GPU), or raise resources.gpus"
        )


def _cells(labels: list[str]) -> str:
    more = f" and {len(labels) - 4} more" if len(labels) > 4 else ""
    return f"cell{'s' if len(labels) > 1 else ''} {', '.join(labels[:4])}{more}"


def preflight(
    study: Study,
    *,
    executor: ExecutorName = "ray",
    address: str | None = None,
    num_cpus: int | None = None,
) -> None:
    """Every check ``run`` makes before it writes anything: the tracking store is usable; cells
    that need a GPU get one (``check_gpus``: from the study alone, and for ``device: auto`` from
    this machine's GPUs unless a cluster runs the study; the executor checks the cluster's); and
    (unless a cluster's workers decide) this machine's device runs every cell's recipe and has the
    resources a cell asks for. ``validate``, ``plan``, ``run`` and ``tune`` all call it."""
    import torch

    try:
        check_store(study.tracking_uri)
    except TrackingError as e:
        raise CannotRunError(str(e)) from None
    workers = study.spec.resources.workers
    if executor == "local" and workers > 1:
        raise CannotRunError(
            f"resources.workers: {workers} workers per cell run through Ray Train; the local "
            "executor runs one process (use the ray executor, or resources.workers: 1)"
        )
    on_cluster = executor == "ray" and bool(cluster_address(address))
    check_gpus(study, gpus_seen=0 if on_cluster else torch.cuda.device_count())
    if executor == "ray":
        check_ray_devices(study)
    if not on_cluster:
        check_devices(study)
        check_resources(study, num_cpus=num_cpus)
    if executor == "ray" and remote_cluster(address):
        try:
            check_cluster_uri(study.tracking_uri, str(cluster_address(address)))
        except TrackingError as e:
            raise CannotRunError(str(e)) from None


def _ckpt_step(study: Study, cell: Cell) -> int | None:
    info = checkpoint_info(study.checkpoint_dir(cell))
    return int(info["step"]) if info else None


# --- the driver ---------------------------------------------------------------------------------------


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
    import shutil

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
    res = study.spec.resources
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
        base = flatten(study.spec.base.model_dump(mode="json", exclude_none=True), "base.")
        parent = tracker.parent_run(study.text, description=study.spec.description, params=base)
        yield tracker, parent


def task_threads(study: Study) -> int:
    """torch threads of one cell: its CPU cores, rounded down, at least 1."""
    return max(1, int(study.spec.resources.cpus))


@dataclass
class StudyResult:
    outcomes: dict[str, Outcome]
    """Outcomes of the cells run now (by key)."""
    planned: list[PlannedCell]
    interrupted: bool = False
    parent_run_id: str = ""
    run_ids: dict[str, str] = field(default_factory=dict)
    """MLflow run id of each cell launched now (by key)."""

    @property
    def failed(self) -> list[str]:
        return [k for k, o in self.outcomes.items() if o.status == "failed"]


def run_study(
    study: Study,
    *,
    executor: ExecutorName = "ray",
    address: str | None = None,
    rerun_failed: bool = False,
    rerun_stale: bool = False,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    progress: bool = True,
    stream: IO[str] | None = None,
    stop_after: int | None = None,
    on_outcome: Callable[[Cell, Outcome], None] | None = None,
    wait_warning_s: float = WAIT_WARN_S,
) -> StudyResult:
    """Run every cell that needs it (see the module docstring); returns when all have ended or on
    Ctrl-C (``interrupted``). Nothing finished is ever rerun or overwritten. On Ray, a cell that
    the cluster has not started ``wait_warning_s`` after it was submitted is reported, again every
    five times that long (at most every ``WAIT_REPEAT_S``) while cells wait (0: never;
    ``progress.WaitWatch``)."""
    out = stream or sys.stderr
    preflight(study, executor=executor, address=address, num_cpus=num_cpus)  # writes nothing
    with (
        clean_failed_start(study.output_dir) as launched,
        study_lock(study.output_dir),
        contextlib.ExitStack() as held,
    ):
        ex = study_executor(
            study, executor, address=address, max_concurrent=max_concurrent, num_cpus=num_cpus
        )
        try:
            tracker, parent = held.enter_context(open_study(study, ex, out=out))
            planned = plan_cells(
                study,
                join_runs(study, tracker.cell_runs()),
                rerun_failed=rerun_failed,
                rerun_stale=rerun_stale,
            )
            counts = ", ".join(f"{n} {a}" for a, n in summarize(planned).items())
            print(
                f"study {study.name}: {len(planned)} cells: {counts} ({ex.name} executor, "
                f"tracking {study.tracking_uri})",
                file=out,
            )
            result = StudyResult({}, planned, parent_run_id=parent)
            launched.append(True)
            _launch(study, tracker, parent, ex, result, stop_after)
            _collect(
                study, tracker, ex, result, out, progress=progress, on_outcome=on_outcome,
                wait_warning_s=wait_warning_s,
            )  # fmt: skip
            ended = (
                "interrupted" if result.interrupted else "failed" if result.failed else "finished"
            )
            tracker.set_status(parent, ended, {"cells": len(planned), "failed": len(result.failed)})
            return result
        finally:
            ex.close()


def _launch(
    study: Study,
    tracker: StudyTracker,
    parent: str,
    ex: Executor,
    result: StudyResult,
    stop_after: int | None,
) -> None:
    """Create (or reuse) each planned cell's run, mark it pending and submit its task."""
    for p in result.planned:
        if p.action not in TO_RUN:
            continue
        c = p.cell
        if p.fresh and p.run is not None:  # keep the stale run and its checkpoint, start anew
            ckpt = study.checkpoint_dir(c)
            if ckpt.exists():
                ckpt.rename(ckpt.with_name(f"{ckpt.name}.stale-{p.run.run_id[:12]}"))
        if p.run is not None and not p.fresh:
            rid = p.run.run_id
        else:
            rid = tracker.create_run(
                parent,
                c.key,
                c.label,
                cell_tags(c),
                c.config.to_dict(),
                name=short_name(c),
                params=cell_params(c),
            )
        result.run_ids[c.key] = rid
        ckpt = study.checkpoint_dir(c).resolve()
        ckpt.parent.mkdir(parents=True, exist_ok=True)  # a worker checks that it sees the folder
        cfg = dataclasses.replace(c.config, checkpoint_dir=str(ckpt))
        tracker.set_status(rid, "pending")
        uri, cwd = study.tracking_uri, os.getcwd()
        ex.submit(
            Task(c.key, c.label, cfg.to_dict(), uri, rid, cwd, task_threads(study), stop_after)
        )


def _collect(
    study: Study,
    tracker: StudyTracker,
    ex: Executor,
    result: StudyResult,
    out: IO[str],
    *,
    progress: bool,
    on_outcome: Callable[[Cell, Outcome], None] | None,
    wait_warning_s: float = 0,
) -> None:
    """Record each outcome as it arrives, with a live progress line and a line about cells that
    wait for resources longer than ``wait_warning_s`` (``wait_watch``); Ctrl-C cancels the
    rest."""
    by_key = {c.key: c for c in study.cells}
    cells = {k: CellProgress(by_key[k].label, by_key[k].config.train.steps) for k in result.run_ids}
    prog = Progress(tracker, cells, result.run_ids, stream=out)
    live = progress and bool(result.run_ids)
    if live:
        prog.start()
    watch = wait_watch(study, ex, tracker, result, wait_warning_s)
    with _ctrl_c_noted() as ctrl_c:
        _collect_outcomes(
            ex, tracker, result, prog, out, by_key, progress, on_outcome, ctrl_c, watch
        )


def wait_watch(
    study: Study, ex: Executor, tracker: StudyTracker, result: StudyResult, after_s: float
) -> WaitWatch | None:
    """The watch on cells that Ray holds without starting them (None in process: a cell there
    starts when the previous one ends)."""
    if not isinstance(ex, RayExecutor) or after_s <= 0:
        return None
    res = study.spec.resources
    each = f" for each of its {res.workers} workers" if res.workers > 1 else ""
    asks = f"a cell asks for {res.cpus:g} CPU(s) and {res.gpus:g} GPU(s){each} (resources)"

    def describe() -> str:
        free, total = ex.resources()
        have = " and ".join(
            f"{free.get(k, 0):g} of {total.get(k, 0):g} {k}s free" for k in ("CPU", "GPU")
        )
        return f"{asks}; the Ray cluster has {have}"

    labels = {c.key: c.label for c in study.cells}
    every = min(WAIT_REPEAT_S, 5 * after_s)
    return WaitWatch(
        ex.dispatched, result.run_ids, labels, tracker.statuses, describe, after_s, every
    )


@contextlib.contextmanager
def _ctrl_c_noted() -> Iterator[list[bool]]:
    """Note every SIGINT (then raise KeyboardInterrupt as Python does), so that a KeyboardInterrupt
    that some library swallows inside a cell (a bare ``except:``, a finalizer) cannot make the
    driver miss a Ctrl-C: the collect loop checks the note after each wait. Defensive: no such
    library is known to be in the path today."""
    noted: list[bool] = []
    # not from a worker thread, and not where SIGINT is ignored (a background job): leave it be
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        yield noted
        return

    def handler(signum: int, frame: Any) -> None:
        noted.append(True)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _collect_outcomes(
    ex: Executor,
    tracker: StudyTracker,
    result: StudyResult,
    prog: Progress,
    out: IO[str],
    by_key: dict[str, Cell],
    progress: bool,
    on_outcome: Callable[[Cell, Outcome], None] | None,
    ctrl_c: list[bool],
    watch: WaitWatch | None,
) -> None:
    live = progress and bool(result.run_ids)
    try:
        while len(ex):
            if ctrl_c:
                raise KeyboardInterrupt
            if watch is not None and (line := watch.check(result.outcomes)):
                print(line, file=out)
            for o in ex.wait(1.0):
                result.outcomes[o.key] = o
                tracker.set_status(result.run_ids[o.key], o.status, outcome_details(o))
                prog.finished(o.key, o.status)
                if progress:
                    print(_outcome_line(by_key[o.key], o, prog), file=out)
                if on_outcome is not None:
                    on_outcome(by_key[o.key], o)
    except KeyboardInterrupt:
        result.interrupted = True
        ex.cancel_all()
        for key, rid in result.run_ids.items():
            if key not in result.outcomes:
                with contextlib.suppress(Exception):
                    tracker.set_status(rid, "interrupted", {"by": "Ctrl-C"})
        print(
            f"\ninterrupted: {len(result.outcomes)} cells ended this time; the rest resume "
            f"from their checkpoints when you run the study again",
            file=out,
        )
    finally:
        if live:
            prog.stop()


def _outcome_line(cell: Cell, o: Outcome, prog: Progress) -> str:
    n = f"[{prog.done + prog.failed}/{len(prog.cells)}]"
    if o.status == "failed":
        return f"{n} {cell.label}: FAILED: {o.reason}"
    if o.status == "diverged":
        return f"{n} {cell.label}: diverged at step {o.diverged_at} ({o.reason})"
    return (
        f"{n} {cell.label}: {o.status}, {o.steps} steps, val ppl {o.final_val_ppl:.3f}, "
        f"{o.tokens_per_s:,.0f} tokens/s, {fmt_s(o.wall_time_s)}"
    )
