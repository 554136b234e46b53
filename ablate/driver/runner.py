"""Running a study: plan each cell against what MLflow already holds (``ablate.driver.planning``), launch
the cells that need it on an executor (``ablate.executor``: Ray tasks by default, or in this
process), collect results as they finish, show progress. ``run_study`` is those steps, after the
checks of ``ablate.driver.preflight`` and within the set-up of ``ablate.driver.setup``:
``plan_cells``, ``_launch``, ``_collect``. A family of wsd budgets (``ablate.driver.branching``)
runs its trunk first; each decay branch starts once the trunk has saved its branch checkpoint (or
ended), families in parallel with each other.

Ctrl-C cancels the cells in flight, marks them ``interrupted`` and leaves a study that the next
``ablate run`` resumes. A ``drain`` request (``ablate.slurm``: a job about to be requeued) stops
them more gently: nothing more starts, the running cells checkpoint after their current step and
end ``interrupted``, and the study returns ``interrupted`` once all have. One driver per study at
a time: a lock file in the output folder (``setup.study_lock``) and, for drivers with other output
folders on the same tracking store, the study's lock in the store (``setup.open_study``,
``ablate.tracking.lock``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from ablate.driver.branching import BranchGate, Member, members, own_step, trunk_passes
from ablate.driver.planning import TO_RUN, PlannedCell, plan_cells, summarize
from ablate.driver.preflight import preflight
from ablate.driver.preparing import prepare_study
from ablate.driver.progress import (
    WAIT_REPEAT_S,
    WAIT_WARN_S,
    CellProgress,
    Progress,
    WaitWatch,
    fmt_s,
)
from ablate.driver.setup import (
    clean_failed_start,
    open_study,
    study_executor,
    study_lock,
    task_threads,
)
from ablate.executor import Executor, ExecutorName, RayExecutor
from ablate.executor.task import Outcome, Task
from ablate.study import Cell, Study
from ablate.tracking import StudyTracker, join_runs
from ablate.tracking.vocab import (
    cell_params,
    cell_tags,
    family_tags,
    outcome_details,
    short_name,
)


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
    branches: bool = True,
    drain: Callable[[], str] | None = None,
) -> StudyResult:
    """Run every cell that needs it (see the module docstring); returns when all have ended, on
    Ctrl-C (``interrupted``), or once the cells in flight have stopped after ``drain`` (asked every
    second) said why they must (``interrupted``, unless every cell ended anyway). Nothing finished
    is ever rerun or overwritten. On Ray, a cell that the cluster has not started
    ``wait_warning_s`` after it was submitted, and that the study's own running cells do not hold
    up, is reported, again every five times that long (at most every ``WAIT_REPEAT_S``) while it
    waits (0: never; ``progress.WaitWatch``). ``branches=False`` trains every budget of a family
    of wsd budgets from step 0, none waiting for a trunk (the same numbers: ``driver.branching``)."""
    out = stream or sys.stderr
    preflight(study, executor=executor, address=address, num_cpus=num_cpus)  # writes nothing
    prepare_study(study, out=out)  # tokenizes each data configuration once, records nothing
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
            gate = _launch(study, tracker, parent, ex, result, stop_after, branches=branches)
            _collect(
                study, tracker, ex, result, out, progress=progress, on_outcome=on_outcome,
                wait_warning_s=wait_warning_s, gate=gate, drain=drain,
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
    *,
    branches: bool = True,
) -> BranchGate:
    """Create (or reuse) each planned cell's run, mark it pending and submit its task; a family's
    trunk before its decay branches, and a branch whose trunk passes its branch point now held in
    the returned gate until the trunk has saved its checkpoint or ended (``driver.branching``)."""
    ms = members(study) if branches else {}
    done = [p.cell.key for p in result.planned if p.run is not None and p.action == "skip"]
    gate = BranchGate(ms, done)
    planned = {p.cell.key: p for p in result.planned}
    # trunks (and every other cell) first: a branch's task names its trunk's run
    order = sorted(
        result.planned, key=lambda p: p.cell.key in ms and ms[p.cell.key].point is not None
    )
    for p in order:
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
        cfg = dataclasses.replace(
            c.config, checkpoint_dir=str(ckpt), data_cache=str(study.data_cache())
        )
        tracker.set_status(rid, "pending")
        uri, cwd = study.tracking_uri, os.getcwd()
        task = Task(c.key, c.label, cfg.to_dict(), uri, rid, cwd, task_threads(study), stop_after)
        _submit(study, tracker, ex, gate, result, planned, p, ms.get(c.key), task)
    return gate


def _submit(
    study: Study,
    tracker: StudyTracker,
    ex: Executor,
    gate: BranchGate,
    result: StudyResult,
    planned: dict[str, PlannedCell],
    p: PlannedCell,
    m: Member | None,
    task: Task,
) -> None:
    """Submit one cell's task. A member of a family gets its branches and tags; a trunk that
    starts from step 0 first removes its family's branch checkpoints (it writes them anew: none
    of other code stays); a branch gets its trunk's run, and waits in ``gate`` while its trunk
    has yet to pass its branch point in this run."""
    if m is None:
        ex.submit(task)
        return
    trunk, point = m.trunk, m.point
    tracker.set_raw_tags(
        task.run_id, family_tags(m.family.key, trunk.key if trunk else None, point)
    )
    task = dataclasses.replace(task, branches=m.branches.to_dict())
    if trunk is None or point is None:
        if not own_step(study, p):
            shutil.rmtree(m.branches.root, ignore_errors=True)
        ex.submit(task)
        return
    tp = planned[trunk.key]
    trunk_run = result.run_ids.get(trunk.key) or (tp.run.run_id if tp.run else "")
    task = dataclasses.replace(task, trunk_run=trunk_run)
    passes = trunk_passes(study, tp, point)
    if p.fresh and not passes:  # a stale result rerun: not from a checkpoint of older code
        fresh = dataclasses.replace(m.branches, start_at=None)
        task = dataclasses.replace(task, branches=fresh.to_dict())
    if passes and not m.branches.ready(point) and not own_step(study, p):
        gate.hold(task, m.branches, trunk.key)
    else:
        ex.submit(task)


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
    gate: BranchGate | None = None,
    drain: Callable[[], str] | None = None,
) -> None:
    """Record each outcome as it arrives, with a live progress line and a line about cells that
    wait longer than ``wait_warning_s`` for resources that the study's own cells do not hold
    (``wait_watch``), and submit the decay branches that ``gate`` releases; Ctrl-C cancels the
    rest, ``drain`` stops them (``_Drain``)."""
    by_key = {c.key: c for c in study.cells}
    cells = {k: CellProgress(by_key[k].label, by_key[k].config.train.steps) for k in result.run_ids}
    prog = Progress(tracker, cells, result.run_ids, stream=out)
    live = progress and bool(result.run_ids)
    if live:
        prog.start()
    watch = wait_watch(study, ex, wait_warning_s)
    with _ctrl_c_noted() as ctrl_c:
        _collect_outcomes(
            ex, tracker, result, prog, out, by_key, progress, on_outcome, ctrl_c, watch,
            gate if gate is not None else BranchGate(),
            _Drain(drain, ex, out),
        )  # fmt: skip


def wait_watch(study: Study, ex: Executor, after_s: float) -> WaitWatch | None:
    """The watch on cells that Ray holds without starting them (None in process: a cell there
    starts when the previous one ends)."""
    if not isinstance(ex, RayExecutor) or after_s <= 0:
        return None
    res = study.file.resources
    each = f" for each of its {res.workers} workers" if res.workers > 1 else ""
    asks = f"a cell asks for {res.cpus:g} CPU(s) and {res.gpus:g} GPU(s){each} (resources)"
    ask = {"CPU": res.cpus * res.workers, "GPU": res.gpus * res.workers}
    labels = {c.key: c.label for c in study.cells}
    every = min(WAIT_REPEAT_S, 5 * after_s)
    return WaitWatch(ex.dispatched, labels, ex.started, ex.resources, ask, asks, after_s, every)


class _Drain:
    """Asks ``request`` (after each wait) whether the cells must stop; the first reason it gives
    stops them (``Executor.stop_running``) and is kept."""

    def __init__(self, request: Callable[[], str] | None, ex: Executor, out: IO[str]) -> None:
        self.request, self.ex, self.out = request, ex, out
        self.why = ""

    def check(self) -> None:
        if self.why or self.request is None or not (why := self.request()):
            return
        self.why = why
        print(f"\nstopping: {why}: the running cells checkpoint and stop", file=self.out)
        self.ex.stop_running()


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
    gate: BranchGate,
    drain: _Drain,
) -> None:
    live = progress and bool(result.run_ids)
    try:
        while len(ex) or len(gate):
            if ctrl_c:
                raise KeyboardInterrupt
            drain.check()
            if drain.why:  # nothing more starts: the held branches stay queued (interrupted)
                gate.clear()
            # a held branch goes once its trunk saved its checkpoint or ended (all of them when
            # nothing else is left to run: nothing could release them then)
            for task in gate.release(result.outcomes, everything=not len(ex)):
                ex.submit(task)
            if watch is not None and (line := watch.check(result.outcomes)):
                print(line, file=out)
            for o in ex.wait(1.0):
                result.outcomes[o.key] = o
                tracker.set_status(result.run_ids[o.key], o.status, outcome_details(o))
                gate.ended(o.key, o.status)  # branch checkpoints no branch needs any more
                prog.finished(o.key, o.status)
                if progress:
                    print(_outcome_line(by_key[o.key], o, prog), file=out)
                if on_outcome is not None:
                    on_outcome(by_key[o.key], o)
        if drain.why:
            for key, rid in result.run_ids.items():  # queued, never handed out
                if key not in result.outcomes:
                    tracker.set_status(rid, "interrupted", {"by": drain.why})
            result.interrupted = any(
                key not in result.outcomes or result.outcomes[key].status == "interrupted"
                for key in result.run_ids
            )
            print(
                f"stopped ({drain.why}): {len(result.outcomes)} cells ended this time; the rest "
                "resume from their checkpoints when the study runs again",
                file=out,
            )
    except KeyboardInterrupt:
        result.interrupted = True
        gate.clear()
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
