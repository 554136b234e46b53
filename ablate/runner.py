"""Running a study: plan each cell against what MLflow already holds, run the cells that need it
(Ray tasks by default, or in this process), stream results as they finish, show progress.

``run_one(task) -> Outcome`` is a plain function that trains one cell and logs into its MLflow run;
executors only decide where it runs. Ray owns the cluster side: each cell is a task with the study's
resources, and a task whose worker dies is retried (``resources.max_retries``) and resumes from the
cell's checkpoint in the same MLflow run (the logger skips steps already recorded).

What ``run`` does to a cell (``plan``):

- ``run``: no MLflow run has its key yet -> create one and train;
- ``skip``: finished or diverged (both are results);
- ``resume``: started but not ended (interrupted, worker lost, driver killed) -> continue from its
  checkpoint (or from step 0 when there is none) in the same run;
- ``failed``: ended with an error -> left alone unless ``--rerun-failed`` (then resumed like above).

Ctrl-C cancels the cells in flight, marks them ``interrupted`` and leaves a study that the next
``ablate run`` resumes. One driver per study at a time (a lock file in the output folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import re
import socket
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from .progress import CellProgress, Progress, fmt_s
from .spec import Cell, Study
from .tracking import CellRun, StudyTracker, TrackingError, check_uri, prepare_store, read_cells
from .train.loop import checkpoint_info

Action = Literal["run", "skip", "resume", "failed", "rerun"]
ExecutorName = Literal["ray", "local"]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RunnerError(RuntimeError):
    """The study cannot be run as asked (another driver holds it, the cluster is unreachable...)."""


# --- one cell -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """Everything a worker needs to run one cell (plain data: it travels to Ray workers)."""

    key: str
    label: str
    config: dict[str, Any]
    """The resolved RunConfig as a dict, checkpoint_dir set."""
    tracking_uri: str
    run_id: str
    workdir: str
    """The driver's working directory (relative data paths are read from there)."""
    threads: int = 1
    stop_after: int | None = None
    """Stop after this many steps (tests: an interruption at a known step)."""


@dataclass(frozen=True)
class Outcome:
    key: str
    status: str
    """finished, diverged, failed, or interrupted."""
    steps: int = 0
    tokens: int = 0
    final_val_loss: float = math.nan
    tokens_per_s: float = 0.0
    diverged_at: int | None = None
    reason: str = ""
    wall_time_s: float = 0.0

    @property
    def final_val_ppl(self) -> float:
        return math.exp(min(self.final_val_loss, 700.0))


def run_one(task: Task) -> Outcome:
    """Train one cell, logging into its MLflow run; never raises for a failing run (the failure is
    the outcome, recorded on the run) so one bad cell does not stop a study."""
    import torch

    from .tracking import MlflowLogger
    from .train import RunConfig, train

    if os.path.isdir(task.workdir):
        os.chdir(task.workdir)
    torch.set_num_threads(max(1, task.threads))
    logger = MlflowLogger(task.tracking_uri, task.run_id)
    t0 = time.perf_counter()
    try:
        cfg = RunConfig.from_dict(task.config)
        ckpt = checkpoint_info(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        where = {"host": socket.gethostname(), "pid": os.getpid()}
        logger.log_status("running", {**where, "resumed_from": ckpt["step"] if ckpt else 0})
        res = train(cfg, logger, stop_after=task.stop_after)
    except Exception as e:  # a failed cell is a result, not a crash of the study
        reason = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc()
        with contextlib.suppress(Exception):
            logger.log_status("failed", {"reason": reason[:500], "traceback": tb[-4000:]})
        return Outcome(task.key, "failed", reason=reason, wall_time_s=time.perf_counter() - t0)
    finally:
        with contextlib.suppress(Exception):
            logger.close()
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


# --- executors ----------------------------------------------------------------------------------------


class LocalExecutor:
    """Runs cells one after another in this process (tests, tiny studies, debugging)."""

    name = "local"

    def run(self, tasks: list[Task]) -> Iterator[Outcome]:
        for t in tasks:
            yield run_one(t)

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


class RayExecutor:
    """Each cell a Ray task with the study's resources; results stream back as they finish."""

    name = "ray"

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
    ) -> None:
        import ray

        self._ray = ray
        self._owns = not ray.is_initialized()
        address = address or os.environ.get("RAY_ADDRESS") or None
        if self._owns:
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if address is None:
                kw.update(num_cpus=num_cpus, object_store_memory=object_store_mb * 2**20)
            try:
                ray.init(address=address, **kw)
            except ConnectionError as e:
                raise RunnerError(f"--address {address}: cannot reach a Ray cluster ({e})") from e
        self.multi_node = len([n for n in ray.nodes() if n.get("Alive")]) > 1
        self._opts = {"num_cpus": cpus, "num_gpus": gpus, "max_retries": max_retries}
        self.max_concurrent = max_concurrent
        self._inflight: dict[Any, Task] = {}

    def run(self, tasks: list[Task]) -> Iterator[Outcome]:
        ray = self._ray
        remote = ray.remote(run_one).options(**self._opts)
        queue = list(tasks)
        limit = self.max_concurrent or len(queue) or 1
        while queue or self._inflight:
            while queue and len(self._inflight) < limit:
                t = queue.pop(0)
                self._inflight[remote.remote(t)] = t
            done, _ = ray.wait(list(self._inflight), num_returns=1, timeout=1.0)
            for ref in done:
                t = self._inflight.pop(ref)
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as e:  # worker died more often than retried
                    lines = [x for x in _ANSI.sub("", str(e)).splitlines() if x.strip()]
                    msg = lines[-1].strip()[:500] if lines else repr(e)
                    yield Outcome(t.key, "failed", reason=f"{type(e).__name__}: {msg}")

    def cancel(self) -> None:
        for ref in list(self._inflight):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._inflight.clear()

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


# --- planning -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    action: Action
    run: CellRun | None = None
    why: str = ""


def plan_cell(
    cell: Cell, run: CellRun | None, *, rerun_failed: bool, ckpt_step: int | None
) -> PlannedCell:
    if run is None:
        return PlannedCell(cell, "run", None, "new")
    if run.status in ("finished", "diverged"):
        return PlannedCell(cell, "skip", run, run.status)
    where = f"from the step-{ckpt_step} checkpoint" if ckpt_step else "from step 0"
    if run.status == "failed":
        if rerun_failed:
            return PlannedCell(cell, "rerun", run, f"failed before; again {where}")
        reason = run.tags.get("ablate.reason", "")
        return PlannedCell(cell, "failed", run, f"failed ({reason[:80]}); --rerun-failed reruns it")
    return PlannedCell(cell, "resume", run, f"{run.status}; {where}")


def plan(study: Study, *, rerun_failed: bool = False) -> list[PlannedCell]:
    """What ``run`` would do to each cell, from the study's MLflow store if it exists (read only:
    planning creates nothing)."""
    try:
        runs = {
            r.key: r
            for r in read_cells(study.tracking_uri, study.name, experiment=study.experiment)
        }
    except TrackingError:
        runs = {}
    return [
        plan_cell(
            c,
            runs.get(c.key),
            rerun_failed=rerun_failed,
            ckpt_step=_ckpt_step(study, c),
        )
        for c in study.cells
    ]


def check_devices(study: Study, cells: Iterable[Cell] | None = None) -> None:
    """Ask each cell's GEMM backend whether this machine's device can run its recipe (before any
    cell starts); raises ``RunnerError`` listing every refusal. On a Ray cluster (``--address``)
    the workers' devices are not this machine's, so the check then runs in the workers."""
    from backends.registry import UnsupportedFormatError, get_backend

    from .train.loop import resolve_device

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
        raise RunnerError("this machine cannot run the study:\n" + "\n".join(lines))


def _ckpt_step(study: Study, cell: Cell) -> int | None:
    info = checkpoint_info(study.checkpoint_dir(cell))
    return int(info["step"]) if info else None


# --- the driver ---------------------------------------------------------------------------------------


@dataclass
class StudyResult:
    outcomes: dict[str, Outcome]
    """Outcomes of the cells run now (by key)."""
    planned: list[PlannedCell]
    interrupted: bool = False
    parent_run_id: str = ""

    @property
    def failed(self) -> list[str]:
        return [k for k, o in self.outcomes.items() if o.status == "failed"]


@contextlib.contextmanager
def study_lock(output_dir: Path) -> Iterator[None]:
    """One driver per study: an exclusive lock on <output>/.lock (released when the process dies)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / ".lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise RunnerError(
                f"{output_dir}: another `ablate run` is running this study ({holder}); wait for "
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


def run_study(
    study: Study,
    *,
    executor: ExecutorName = "ray",
    address: str | None = None,
    rerun_failed: bool = False,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    progress: bool = True,
    stream: IO[str] | None = None,
    stop_after: int | None = None,
    on_outcome: Callable[[Cell, Outcome], None] | None = None,
) -> StudyResult:
    """Run every cell that needs it (see the module docstring); returns when all have ended or on
    Ctrl-C (``interrupted``). Nothing finished is ever rerun or overwritten."""
    out = stream or sys.stderr
    uri = study.tracking_uri
    res = study.spec.resources
    if executor == "local" or not (address or os.environ.get("RAY_ADDRESS")):
        check_devices(study)  # before anything is written
    with study_lock(study.output_dir):
        ex: LocalExecutor | RayExecutor
        if executor == "ray":
            ex = RayExecutor(
                address=address,
                cpus=res.cpus,
                gpus=res.gpus,
                max_retries=res.max_retries,
                max_concurrent=max_concurrent or res.max_concurrent,
                num_cpus=num_cpus,
            )
            multi_node = ex.multi_node
        else:
            ex = LocalExecutor()
            multi_node = False
        try:
            check_uri(uri, multi_node=multi_node)
            prepare_store(uri, study.output_dir)
            tracker = StudyTracker(
                uri,
                study.name,
                experiment=study.experiment,
                artifact_root=study.output_dir / "artifacts",
            )
            parent = tracker.parent_run(study.text)
            runs = tracker.cell_runs()
            planned = [
                plan_cell(
                    c,
                    runs.get(c.key),
                    rerun_failed=rerun_failed,
                    ckpt_step=_ckpt_step(study, c),
                )
                for c in study.cells
            ]
            todo = [p for p in planned if p.action in ("run", "resume", "rerun")]
            counts = {
                a: sum(p.action == a for p in planned)
                for a in ("run", "resume", "rerun", "skip", "failed")
            }
            print(
                f"study {study.name}: {len(planned)} cells: "
                + ", ".join(f"{n} {a}" for a, n in counts.items() if n)
                + f" ({ex.name} executor, tracking {uri})",
                file=out,
            )
            tasks, run_ids = [], {}
            threads = max(1, int(res.cpus))
            for p in todo:
                c = p.cell
                rid = (
                    p.run.run_id
                    if p.run
                    else tracker.create_cell_run(
                        parent, c.key, c.label, c.tags(), c.config.to_dict()
                    )
                )
                run_ids[c.key] = rid
                cfg = dataclasses.replace(
                    c.config, checkpoint_dir=str(study.checkpoint_dir(c).resolve())
                )
                tracker.set_status(rid, "pending")
                tasks.append(
                    Task(c.key, c.label, cfg.to_dict(), uri, rid, os.getcwd(), threads, stop_after)
                )
            result = StudyResult({}, planned, parent_run_id=parent)
            by_key = {c.key: c for c in study.cells}
            prog = Progress(
                tracker,
                {k: CellProgress(by_key[k].label, by_key[k].config.train.steps) for k in run_ids},
                run_ids,
                stream=out,
            )
            if progress and tasks:
                prog.start()
            try:
                for o in ex.run(tasks):
                    result.outcomes[o.key] = o
                    tracker.set_status(run_ids[o.key], o.status, _status_info(o))
                    prog.finished(o.key, o.status)
                    if progress:
                        print(_outcome_line(by_key[o.key], o, prog), file=out)
                    if on_outcome is not None:
                        on_outcome(by_key[o.key], o)
            except KeyboardInterrupt:
                result.interrupted = True
                ex.cancel()
                for key, rid in run_ids.items():
                    if key not in result.outcomes:
                        with contextlib.suppress(Exception):
                            tracker.set_status(rid, "interrupted", {"by": "Ctrl-C"})
                print(
                    f"\ninterrupted: {len(result.outcomes)} cells ended this time; the rest resume "
                    f"from their checkpoints when you run the study again",
                    file=out,
                )
            finally:
                prog.stop() if progress and tasks else None
            ended = (
                "interrupted" if result.interrupted else ("failed" if result.failed else "finished")
            )
            tracker.finish_parent(
                parent, ended, {"cells": len(planned), "failed": len(result.failed)}
            )
            return result
        finally:
            ex.close()


def _status_info(o: Outcome) -> dict[str, Any]:
    info: dict[str, Any] = {"steps": o.steps, "wall_time_s": round(o.wall_time_s, 1)}
    if o.tokens_per_s:
        info["tokens_per_s"] = round(o.tokens_per_s, 1)
    if o.reason:
        info["reason"] = o.reason[:500]
    if o.diverged_at is not None:
        info["diverged_at"] = o.diverged_at
    return info


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


def summarize(planned: Iterable[PlannedCell]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in planned:
        counts[p.action] = counts.get(p.action, 0) + 1
    return counts
