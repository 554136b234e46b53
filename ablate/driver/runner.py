"""Running a study: plan each cell against what MLflow already holds (``ablate.driver.planning``), launch
the cells that need it on an executor (``ablate.executor``: Ray tasks by default, or in this
process), collect results as they finish, show progress. ``run_study`` is those steps, after the
checks of ``ablate.driver.preflight`` and within the set-up of ``ablate.driver.setup`` (the
study's locks, its executor, its store and parent run): ``plan_cells``, then one ``_StudyRun``
that holds the run's state, launches its cells and collects their outcomes. A family of wsd budgets
(``ablate.driver.branching``) runs its trunk first; each decay branch starts once the trunk has
saved its branch checkpoint (or ended), families in parallel with each other.

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
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ablate.driver.branching import BranchGate, Member, members, own_step, trunk_passes
from ablate.driver.planning import (
    TO_RUN,
    PlannedCell,
    check_stale_data,
    plan_cells,
    stale_data_refusal,
    summarize,
)
from ablate.driver.preflight import preflight
from ablate.driver.preparing import DataSet, data_now, prepare_study
from ablate.driver.progress import (
    WAIT_REPEAT_S,
    WAIT_WARN_S,
    CellProgress,
    Progress,
    WaitWatch,
    fmt_s,
)
from ablate.driver.reuse import reuse_baselines
from ablate.driver.setup import (
    clean_failed_start,
    open_study,
    study_executor,
    study_lock,
    task_threads,
)
from ablate.errors import CannotRunError
from ablate.executor import Executor, ExecutorName, RayExecutor
from ablate.executor.task import Outcome, Task
from ablate.study import Cell, Study
from ablate.tracking import StudyTracker, join_runs, shared_order_note
from ablate.tracking.vocab import (
    family_tags,
    outcome_details,
)
from ablate.train.checkpoint import move_aside


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
    data: Mapping[str, DataSet] | None = None,
) -> StudyResult:
    """Run every cell that needs it (see the module docstring); returns when all have ended, on
    Ctrl-C (``interrupted``), or once the cells in flight have stopped after ``drain`` (asked every
    second) said why they must (``interrupted``, unless every cell ended anyway). Nothing finished
    is ever rerun or overwritten. On Ray, a cell that the cluster has not started
    ``wait_warning_s`` after it was submitted, and that the study's own running cells do not hold
    up, is reported, again every five times that long (at most every ``WAIT_REPEAT_S``) while it
    waits (0: never; ``progress.WaitWatch``). ``branches=False`` trains every budget of a family
    of wsd budgets from step 0, none waiting for a trunk (the same numbers: ``driver.branching``).
    ``data``: what ``prepared_data`` gave the caller for this study (None: prepared here)."""
    if study.sequential is not None:
        kw = {k: v for k, v in locals().items() if k != "study"}  # every argument but the study
        from ablate.driver.waves import run_waves

        return run_waves(
            study,
            lambda part: run_study(part, **kw),
            stream or sys.stderr,
            fast_forward=not rerun_stale,  # a stale cell of an early wave reruns only through it
            drain=drain,
        )[0]
    out = stream or sys.stderr
    preflight(study, executor=executor, address=address, num_cpus=num_cpus)  # writes nothing
    if data is None:
        data = prepared_data(study, rerun_stale=rerun_stale, out=out)
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
            runs = reuse_baselines(study, tracker, parent, tracker.cell_runs(), out)
            planned = plan_cells(
                study,
                join_runs(study, runs),
                rerun_failed=rerun_failed,
                rerun_stale=rerun_stale,
                data=data,
            )
            if why := stale_data_refusal(planned):  # recorded since check_stale_data read
                raise CannotRunError(why)
            counts = ", ".join(f"{n} {a}" for a, n in summarize(planned).items())
            print(
                f"study {study.name}: {len(planned)} cells: {counts} ({ex.name} executor, "
                f"tracking {study.tracking_uri})",
                file=out,
            )
            if note := shared_order_note(study, runs):
                print(note, file=out)
            result = StudyResult({}, planned, parent_run_id=parent)
            launched.append(True)
            run = _StudyRun(
                study,
                tracker,
                ex,
                result,
                out,
                members=members(study) if branches else {},
                stop_after=stop_after,
                progress=progress,
                on_outcome=on_outcome,
                wait_warning_s=wait_warning_s,
                drain=drain,
            )
            run.launch()
            run.collect()
            run.end()
            return result
        finally:
            ex.close()


def prepared_data(
    study: Study, *, rerun_stale: bool = False, out: IO[str] | None = None
) -> dict[str, DataSet]:
    """The data each cell reads now (``data_now``), every set prepared first (``prepare_study``:
    each data configuration tokenized once, or verified; nothing recorded). Without
    ``rerun_stale`` a study with a cell interrupted on data that prepare to other tokens now is
    refused (``check_stale_data``: ``CannotRunError``), before anything is recorded. ``run_study``
    starts with it, and ``ablate slurm run`` before the job's Ray starts."""
    data = data_now(prepare_study(study, out=out or sys.stderr))
    if not rerun_stale:
        check_stale_data(study, data)
    return data


@dataclass
class _StudyRun:
    """One run of a study in the driver, from its first launch to its last outcome: the parts it
    works with, what the user asked of it, and the state that its steps share (the branches held
    back, why the cells were asked to stop). ``run_study`` makes it once the cells are planned;
    ``launch`` hands every cell to run to the executor, ``collect`` records them as they end and
    ``end`` records how the study ended."""

    study: Study
    tracker: StudyTracker
    ex: Executor
    result: StudyResult
    """What ``run_study`` returns: the plan, and filled in here, each run id and outcome."""
    out: IO[str]
    members: dict[str, Member] = field(default_factory=dict)
    """The members of the study's families of wsd budgets, by key (none: every cell from step 0)."""
    stop_after: int | None = None
    """Each task stops after this many steps (None: at the end of its schedule)."""
    progress: bool = True
    """A live progress line, and a line for each outcome."""
    on_outcome: Callable[[Cell, Outcome], None] | None = None
    wait_warning_s: float = 0
    """Report a cell that Ray holds this long without starting it (0: never; ``wait_watch``)."""
    drain: Callable[[], str] | None = None
    """Asked after each wait whether the cells must stop: why, or "" (None: never asked)."""
    drained: str = field(default="", init=False)
    """The first reason ``drain`` gave ("": none yet)."""
    gate: BranchGate = field(init=False)
    """The decay branches held until their trunk has saved its checkpoint or ended."""
    planned: dict[str, PlannedCell] = field(init=False)
    cells: dict[str, Cell] = field(init=False)

    def __post_init__(self) -> None:
        planned = self.result.planned
        done = [p.cell.key for p in planned if p.run is not None and p.action == "skip"]
        self.gate = BranchGate(self.members, done)
        self.planned = {p.cell.key: p for p in planned}
        self.cells = {c.key: c for c in self.study.cells}

    def launch(self) -> None:
        """Create (or reuse) each planned cell's run, mark it pending and submit its task; a
        family's trunk before its decay branches, and a branch whose trunk passes its branch point
        now held in ``gate`` until the trunk has saved its checkpoint or ended
        (``driver.branching``)."""
        ms = self.members
        # trunks (and every other cell) first: a branch's task names its trunk's run
        order = sorted(
            self.result.planned,
            key=lambda p: p.cell.key in ms and ms[p.cell.key].point is not None,
        )
        for p in order:
            if p.action not in TO_RUN:
                continue
            run_id = self.result.run_ids[p.cell.key] = self.run_of(p)
            task = self.task(p.cell, run_id)
            self.tracker.set_status(run_id, "pending")
            self.submit(p, task)

    def run_of(self, p: PlannedCell) -> str:
        """The run a cell to run logs into: its recorded run when it resumes, a new one otherwise.
        A new run starts from step 0: a stale result's checkpoint is kept aside, renamed after its
        run, and so is a checkpoint that no run of the store owns (its run deleted, or the store
        replaced), renamed after the time it was set aside; resumed into a new run, it would
        leave that run without the curve before it."""
        c = p.cell
        ckpt = self.study.checkpoint_dir(c)
        if p.fresh and p.run is not None and ckpt.exists():  # keep the stale run and checkpoint
            move_aside(ckpt, f"stale-{p.run.run_id[:12]}")
        if p.run is not None and not p.fresh:
            return p.run.run_id
        if p.run is None and ckpt.exists():
            move_aside(ckpt, f"orphan-{time.strftime('%Y%m%d-%H%M%S')}")
        return self.tracker.create_cell_run(self.result.parent_run_id, c)

    def task(self, cell: Cell, run_id: str) -> Task:
        """The cell's task, with its checkpoint folder (created here: a worker checks that it sees
        it) and the study's data cache."""
        ckpt = self.study.checkpoint_dir(cell).resolve()
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.replace(
            cell.config, checkpoint_dir=str(ckpt), data_cache=str(self.study.data_cache())
        )
        uri, cwd, threads = self.study.tracking_uri, os.getcwd(), task_threads(self.study)
        return Task(cell.key, cell.label, cfg.to_dict(), uri, run_id, cwd, threads, self.stop_after)

    def submit(self, p: PlannedCell, task: Task) -> None:
        """Submit one cell's task. A member of a family gets its branches and tags; a trunk that
        starts from step 0 first removes its family's branch checkpoints (it writes them anew: none
        of other code stays); a branch gets its trunk's run, and waits in ``gate`` while its trunk
        has yet to pass its branch point in this run."""
        m = self.members.get(p.cell.key)
        if m is None:
            self.ex.submit(task)
            return
        trunk, point = m.trunk, m.point
        self.tracker.set_raw_tags(
            task.run_id, family_tags(m.family.key, trunk.key if trunk else None, point)
        )
        task = dataclasses.replace(task, branches=m.branches.to_dict())
        if trunk is None or point is None:
            if not own_step(self.study, p):
                shutil.rmtree(m.branches.root, ignore_errors=True)
            self.ex.submit(task)
            return
        trunk_plan = self.planned[trunk.key]
        trunk_run = self.result.run_ids.get(trunk.key) or (
            trunk_plan.run.run_id if trunk_plan.run else ""
        )
        task = dataclasses.replace(task, trunk_run=trunk_run)
        passes = trunk_passes(self.study, trunk_plan, point)
        if p.fresh and not passes:  # a stale result rerun: not from a checkpoint of older code
            fresh = dataclasses.replace(m.branches, start_at=None)
            task = dataclasses.replace(task, branches=fresh.to_dict())
        if passes and not m.branches.ready(point) and not own_step(self.study, p):
            self.gate.hold(task, m.branches, trunk.key)
        else:
            self.ex.submit(task)

    def collect(self) -> None:
        """Record each outcome as it arrives, with a live progress line and a line about cells that
        wait longer than ``wait_warning_s`` for resources that the study's own cells do not hold
        (``wait_watch``), and submit the decay branches that ``gate`` releases; Ctrl-C cancels the
        rest (``interrupt``), ``drain`` stops them (``check_drain``, ``drained_out``)."""
        run_ids = self.result.run_ids
        steps = {
            k: CellProgress(self.cells[k].label, self.cells[k].config.train.steps) for k in run_ids
        }
        prog = Progress(self.tracker, steps, run_ids, stream=self.out)
        live = self.progress and bool(run_ids)
        if live:
            prog.start()
        watch = wait_watch(self.study, self.ex, self.wait_warning_s)
        with _ctrl_c_noted() as ctrl_c:
            try:
                self.collect_outcomes(prog, watch, ctrl_c)
            except KeyboardInterrupt:
                self.interrupt()
            finally:
                if live:
                    prog.stop()

    def collect_outcomes(self, prog: Progress, watch: WaitWatch | None, ctrl_c: list[bool]) -> None:
        """Wait for outcomes until no cell is in flight or held, a second at a time; between waits
        look at Ctrl-C (noted in ``ctrl_c``), the drain, the held branches and the waiting cells."""
        ex, gate, outcomes = self.ex, self.gate, self.result.outcomes
        while len(ex) or len(gate):
            if ctrl_c:
                raise KeyboardInterrupt
            self.check_drain()
            if self.drained:  # nothing more starts: the held branches stay queued (interrupted)
                gate.clear()
            # a held branch goes once its trunk saved its checkpoint or ended (all of them when
            # nothing else is left to run: nothing could release them then)
            for task in gate.release(outcomes, everything=not len(ex)):
                ex.submit(task)
            if watch is not None and (line := watch.check(outcomes)):
                print(line, file=self.out)
            for o in ex.wait(1.0):
                self.record(o, prog)
        if self.drained:
            self.drained_out()

    def record(self, o: Outcome, prog: Progress) -> None:
        """One cell's outcome: into the result, its run, the gate and the progress line."""
        self.result.outcomes[o.key] = o
        self.tracker.set_status(self.result.run_ids[o.key], o.status, outcome_details(o))
        self.gate.ended(o.key, o.status)  # branch checkpoints no branch needs any more
        prog.finished(o.key, o.status)
        if self.progress:
            print(_outcome_line(self.cells[o.key], o, prog), file=self.out)
        if self.on_outcome is not None:
            self.on_outcome(self.cells[o.key], o)

    def check_drain(self) -> None:
        """Ask ``drain`` whether the cells must stop; the first reason it gives stops them
        (``Executor.stop_running``) and is kept in ``drained``."""
        if self.drained or self.drain is None or not (why := self.drain()):
            return
        self.drained = why
        print(f"\nstopping: {why}: the running cells checkpoint and stop", file=self.out)
        self.ex.stop_running()

    def drained_out(self) -> None:
        """The cells in flight have stopped after a drain: the queued ones that never started end
        ``interrupted`` too, and so does the study unless every cell ended anyway."""
        result = self.result
        for key, rid in result.run_ids.items():  # queued, never handed out
            if key not in result.outcomes:
                self.tracker.set_status(rid, "interrupted", {"by": self.drained})
        result.interrupted = any(
            key not in result.outcomes or result.outcomes[key].status == "interrupted"
            for key in result.run_ids
        )
        print(
            f"stopped ({self.drained}): {len(result.outcomes)} cells ended this time; the rest "
            "resume from their checkpoints when the study runs again",
            file=self.out,
        )

    def interrupt(self) -> None:
        """Ctrl-C: cancel every cell in flight or held and mark those without an outcome
        ``interrupted``; they resume when the study runs again."""
        result = self.result
        result.interrupted = True
        self.gate.clear()
        self.ex.cancel_all()
        for key, rid in result.run_ids.items():
            if key not in result.outcomes:
                with contextlib.suppress(Exception):
                    self.tracker.set_status(rid, "interrupted", {"by": "Ctrl-C"})
        print(
            f"\ninterrupted: {len(result.outcomes)} cells ended this time; the rest resume "
            f"from their checkpoints when you run the study again",
            file=self.out,
        )

    def end(self) -> None:
        """Record on the parent run how the study ended: interrupted, failed or finished."""
        result = self.result
        ended = "interrupted" if result.interrupted else "failed" if result.failed else "finished"
        details = {"cells": len(result.planned), "failed": len(result.failed)}
        self.tracker.set_status(result.parent_run_id, ended, details)


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
    return WaitWatch(
        ex.dispatched, labels, ex.started, ex.resources, ask, asks, after_s, every,
        before=ex.in_use_before,
    )  # fmt: skip


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
