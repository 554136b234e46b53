"""The driver of ``ablate tune``: Optuna searches over a study's search space, run by the study's
executor (``ablate.executor``, as ``ablate run`` runs cells) and logged to the study's MLflow
experiment.

The ``tune:`` section (schema: ``ablate.study.schema``; searches and checks: ``ablate.study.tune``)
splits the study's cells into
searches (``per``), each an independent Optuna study named ``<study>/<search label>`` that starts
from one cell and varies only the ``space`` paths. Different searches are never compared: each has
its own sampler state and its own pruner.

**Trials are runs.** The driver asks Optuna for a trial, resolves and validates its config (the
search's cell plus the suggested values, through the study's ``CellConfig``), creates an MLflow
child run under the study's parent run (role ``trial``, labelled ``<search>/trial<N>``, with the
search, trial number and parameters as tags: ``ablate.tracking.vocab``; ``ablate run`` plans only
``cell`` runs, so it never sees them) and hands a ``Task`` to the executor, ``parallelism`` trials per search at a time (ask-and-tell). Each
trial checkpoints in ``<output>/tune/<search>/trial<N>/`` (so a Ray retry after a lost worker
resumes it); the folder is removed when the trial ends, as nothing resumes a trial later, and when
it is interrupted by Ctrl-C, each time once its worker has ended (a cancelled Ray worker is
waited for: killed while it wrote its checkpoint, it would leave ``checkpoint.tmp`` behind);
``ablate tune`` removes at its start any trial folder left (a killed driver's).
When a trial ends, Optuna is told its state and the run gets ``ablate.tune_state`` (COMPLETE,
PRUNED, FAIL), ``ablate.value`` and ``ablate.reason``, so both stores agree. The parent run gets
``ablate.tune_status`` and ``ablate.tune_trials``: the trials that count in all its searches.

**Objective.** ``final_val_loss``: the last validation loss. ``tokens_to_target``: training tokens
at which validation perplexity first reaches the study's target (interpolated as in the report); a
trial that never reaches it scores ``NOT_REACHED_FACTOR`` (2) x its training tokens, so it ranks
below every trial that did. A target derived from the baseline needs finished baseline runs in the
store; without them ``ablate tune`` refuses before anything is written.

**Failures.** A diverged trial (the trainer's divergence guard) is PRUNED with its reason (user
attr ``reason``; TPE then treats it as worse than every complete trial, which steers it away from
such learning rates); a trial whose run fails (an exception, an invalid combination of suggested
values) is FAIL with its reason. Either way the search goes on.

**Pruning.** The driver reads each trial's validation losses from MLflow (``read_histories``) and
reports them to Optuna in step order (``trial.report(val_loss, step)``), calling ``should_prune``
after each, from ``pruner.min_step`` on. On Ray it polls trials in flight every ``poll_s`` and
cancels a pruned one (``ray.cancel(force=True)``: compute is saved; the run ends ``interrupted``).
The local executor runs a trial to its end in this process, so there the same decision is taken
on the same points after the fact: the trial is PRUNED (its run ``finished``) but nothing is saved.

**Storage and resuming.** Optuna's RDB storage in SQLite, ``<output>/optuna.db``, beside MLflow's
``mlflow.db`` but in its own file; a file there that is damaged or is not an Optuna storage
(another SQLite database) is refused before anything is written (``check_storage``). Only the
driver writes it (one ``ablate tune`` per study at a time: a lock on ``<output>/tune/.lock`` and
the lock ``tune`` in the tracking store, ``ablate.tracking.lock``; workers write only MLflow), so
SQLite's single writer is no limitation and a journal file would buy nothing. Running ``ablate
tune`` again continues each search: COMPLETE, PRUNED and FAIL trials count towards ``trials``, and
only the remainder runs.
A trial left RUNNING by a killed driver (or stopped by Ctrl-C) is marked FAIL with
``reason="interrupted"`` and does not count; it is not resumed (a new trial takes its place). The
sampler is reseeded with ``seed + trials so far``, so a continuation does not replay suggestions.

**Outcome.** ``tune_summary(study)`` reads the storage: per search the trial counts, best value and
parameters, and parameter importance (Optuna's default evaluator) once a search has >= 4 complete
trials and more than one parameter. ``write_best`` writes ``<output>/tune/best.yaml``: a ``grid:``
list with one entry per search (its axes' values plus the best parameters), which a study can use
as its grid (add ``seed: [...]`` to each entry).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import optuna
from optuna.trial import Trial, TrialState
from pydantic import ValidationError

from ablate.driver.preflight import preflight
from ablate.driver.preparing import prepare_study
from ablate.driver.setup import (
    clean_failed_start,
    open_study,
    study_executor,
    study_lock,
    task_threads,
)
from ablate.errors import TrackingError, TuneError
from ablate.executor import Executor, ExecutorName
from ablate.executor.task import Outcome, Task
from ablate.study.axes import fmt_value
from ablate.study.cells import Study
from ablate.study.schema import TuneSection
from ablate.study.tune import Search, plan_searches, trial_config
from ablate.targets import Curve, target_ppl_of, tokens_to_target
from ablate.tracking import StudyTracker, baseline_curves, read_histories
from ablate.tracking.vocab import recipe_tags, trial_tags
from ablate.train.config import config_hash
from ablate.tune.storage import (
    STORAGE,
    check_storage,
    continuation_problems,
    count_trials,
    make_pruner,
    make_sampler,
    optuna_name,
    start_fingerprint,
    storage_url,
    suggest,
    tune_spec,
    tune_summary,
    write_best,
)

NOT_REACHED_FACTOR = 2.0
"""tokens_to_target of a trial that never reaches the target: this many times its training tokens."""


# --- the driver ------------------------------------------------------------------------------------


@dataclass
class _Search:
    search: Search
    study: optuna.Study
    todo: int
    live: int = 0
    started: int = 0


@dataclass
class _Live:
    s: _Search
    trial: Trial
    task: Task
    params: dict[str, Any]
    reported: int = -1
    prune_reason: str = ""


@dataclass
class TuneResult:
    summary: list[dict[str, Any]]
    """``tune_summary`` after this invocation."""
    best_path: Path | None
    ran: int = 0
    """Trials that ended in this invocation."""
    interrupted: bool = False


class _Driver:
    def __init__(
        self,
        study: Study,
        tune: TuneSection,
        tracker: StudyTracker,
        parent: str,
        pool: Executor,
        out: IO[str],
        target_ppl: float | None,
    ) -> None:
        self.study, self.tune, self.tracker, self.parent = study, tune, tracker, parent
        self.pool, self.out, self.target_ppl = pool, out, target_ppl
        self.uri = study.tracking_uri
        self.live: dict[str, _Live] = {}
        self.ran = 0

    # searches
    def open(self, search: Search, storage: optuna.storages.BaseStorage) -> _Search:
        name = optuna_name(self.study, search)
        try:
            n_before: int | None = len(
                storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)
            )
        except KeyError:
            n_before = None
        ostudy = optuna.create_study(
            storage=storage,
            study_name=name,
            sampler=make_sampler(self.tune, n_before or 0),
            pruner=make_pruner(self.tune),
            direction="minimize",
            load_if_exists=True,
        )
        start = start_fingerprint(self.tune, self.study, search)
        if problems := continuation_problems(ostudy, self.tune, start):
            raise TuneError(
                f"search {search.label} cannot continue its {len(ostudy.trials)} earlier trials: "
                f"{'; '.join(problems)}. Restore the study file, or start afresh in a new output folder "
                f"or after `optuna delete-study --storage {storage_url(self.study)} --study-name "
                f"'{name}'`"
            )
        if n_before is None:
            ostudy.set_user_attr("objective", self.tune.objective)
            ostudy.set_user_attr("start_config", start)
            ostudy.set_user_attr("start_cell", search.cell.label)
            for params in self.tune.enqueue:
                ostudy.enqueue_trial(params, skip_if_exists=True)
        reason = "interrupted: the driver stopped before the trial ended"
        self._fail_running(ostudy, reason)
        # every trial has ended: nothing resumes one, so no folder of theirs stays (one that a
        # killed driver, or a worker killed while it wrote, left behind)
        for folder in (self.study.output_dir / "tune" / search.slug).glob("trial*"):
            self._remove_trial_dir(folder)
        done = sum(count_trials(ostudy.get_trials(deepcopy=False)).values())
        return _Search(search, ostudy, todo=max(0, self.tune.trials - done))

    def trial_dir(self, search: Search, number: int) -> Path:
        """Where trial ``number`` of ``search`` checkpoints."""
        return self.study.output_dir / "tune" / search.slug / f"trial{number}"

    @staticmethod
    def _remove_trial_dir(folder: str | Path) -> None:
        """A trial's folder and all in it: its checkpoint, and any file a killed write left
        (``checkpoint.tmp``)."""
        if Path(folder).is_dir():
            shutil.rmtree(folder, ignore_errors=True)

    def _fail_running(self, ostudy: optuna.Study, reason: str) -> None:
        """Mark every trial of the search that Optuna has RUNNING failed as interrupted."""
        for ft in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self._fail_interrupted(ostudy, Trial(ostudy, ft._trial_id), reason)

    def _fail_interrupted(self, ostudy: optuna.Study, trial: Trial, reason: str) -> None:
        trial.set_user_attr("interrupted", True)
        trial.set_user_attr("reason", reason)
        ostudy.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if rid := trial.user_attrs.get("mlflow_run_id"):
            with contextlib.suppress(TrackingError):
                self.tracker.set_status(
                    rid, "interrupted", {"tune_state": "FAIL", "reason": reason}
                )

    # trials
    def start(self, s: _Search) -> None:
        s.todo -= 1
        s.started += 1
        trial = s.study.ask()
        params = {path: suggest(trial, path, p) for path, p in self.tune.space.items()}
        label = f"{s.search.label}/trial{trial.number}"
        trial.set_user_attr("label", label)
        shown = {k: fmt_value(v) for k, v in params.items()}
        tags = trial_tags(s.search.label, trial.number, s.study.study_name, shown)
        try:
            rc = trial_config(self.study, s.search.cell, params)
        except (ValidationError, ValueError) as e:  # a combination no single bound could catch
            reason = f"invalid config: {e}"
            rid = self.tracker.create_run(self.parent, "invalid", label, tags, params, role="trial")
            trial.set_user_attr("mlflow_run_id", rid)
            self._tell(s, trial, None, TrialState.FAIL, reason, rid, "failed", {})
            return
        ckpt = self.trial_dir(s.search, trial.number)
        if ckpt.exists():  # left by an earlier optuna.db (numbers restarted): not this trial's
            shutil.rmtree(ckpt)
        ckpt.parent.mkdir(parents=True, exist_ok=True)  # a worker checks that it sees the folder
        rc = dataclasses.replace(
            rc, checkpoint_dir=str(ckpt.resolve()), data_cache=str(self.study.data_cache())
        )
        tags.update(recipe_tags(rc.recipe.short(), rc.seed))
        rid = self.tracker.create_run(
            self.parent, config_hash(rc), label, tags, rc.to_dict(), role="trial"
        )
        trial.set_user_attr("mlflow_run_id", rid)
        self.tracker.set_status(rid, "pending")
        task = Task(
            label, label, rc.to_dict(), self.uri, rid, os.getcwd(), task_threads(self.study)
        )
        self.live[label] = _Live(s, trial, task, params)
        s.live += 1
        self.pool.submit(task)

    def observe(self, live: _Live, history: list[tuple[int, float]]) -> None:
        """Report new validation losses in step order; note the first step the pruner prunes at."""
        p = self.tune.pruner
        for step, loss in history:
            if step <= live.reported or live.prune_reason:
                continue
            live.trial.report(loss, step)
            live.reported = step
            if p is not None and step >= p.min_step and live.trial.should_prune():
                why = f" > max_val_loss {p.max_val_loss:g}" if p.kind == "threshold" else ""
                live.prune_reason = (
                    f"pruned by the {p.kind} pruner at step {step} (val_loss {loss:.4g}{why})"
                )

    def finish(self, live: _Live, o: Outcome | None) -> None:
        """Tell Optuna and MLflow how a trial ended (``o`` None: pruned and cancelled in flight)."""
        s, trial, rid = live.s, live.trial, live.task.run_id
        value: float | None = None
        info: dict[str, Any] = {}
        if o is not None:
            info = {"steps": o.steps, "wall_time_s": round(o.wall_time_s, 1)}
            for k, v in (("outcome", o.status), ("steps", o.steps), ("tokens", o.tokens)):
                trial.set_user_attr(k, v)
        if o is None:
            trial.set_user_attr("outcome", "pruned")
            state, reason, status = TrialState.PRUNED, live.prune_reason, "interrupted"
        elif o.status == "finished" and live.prune_reason:
            state, status = TrialState.PRUNED, "finished"
            reason = live.prune_reason + "; judged after the trial ended (local executor)"
        elif o.status == "finished":
            value, reason, status = self.objective(live, o), "", "finished"
            state = TrialState.COMPLETE if math.isfinite(value) else TrialState.FAIL
            if state == TrialState.FAIL:
                reason, value = f"the objective is not a number ({value})", None
        elif o.status == "diverged":
            state, status = TrialState.PRUNED, "diverged"
            reason = f"diverged at step {o.diverged_at}: {o.reason}"
            info["diverged_at"] = o.diverged_at
        else:
            state, status = TrialState.FAIL, "failed" if o.status == "failed" else "interrupted"
            reason = o.reason or o.status
        self._tell(s, trial, value, state, reason, rid, status, info)
        self._remove_trial_dir(live.task.config["checkpoint_dir"])

    def _tell(
        self,
        s: _Search,
        trial: Trial,
        value: float | None,
        state: TrialState,
        reason: str,
        rid: str,
        status: str,
        info: dict[str, Any],
    ) -> None:
        if reason:
            trial.set_user_attr("reason", reason[:1000])
        frozen = s.study.tell(trial, value, state=state)
        self.ran += 1
        tags = {**info, "tune_state": state.name, "value": repr(frozen.value)}
        self.tracker.set_status(
            rid, status, {**tags, **({"reason": reason[:500]} if reason else {})}
        )
        shown = ", ".join(f"{k}={fmt_value(v)}" for k, v in trial.params.items())
        if state == TrialState.COMPLETE:
            what = f"{self.tune.objective} {frozen.value:.6g}"
        else:
            what = f"{state.name}: {reason}"
        try:
            best = f"; best {s.study.best_value:.6g} (trial {s.study.best_trial.number})"
        except ValueError:  # no complete trial yet
            best = ""
        print(f"[{s.search.label}] trial {trial.number} ({shown}): {what}{best}", file=self.out)

    def objective(self, live: _Live, o: Outcome) -> float:
        if self.tune.objective == "final_val_loss":
            return o.final_val_loss
        assert self.target_ppl is not None
        h = read_histories(self.uri, [live.task.run_id], ("val_loss", "tokens"))[live.task.run_id]
        tokens = dict(h["tokens"])
        points = [(tokens[s], math.exp(min(v, 700.0))) for s, v in h["val_loss"] if s in tokens]
        t = tokens_to_target([p[0] for p in points], [p[1] for p in points], self.target_ppl)
        live.trial.set_user_attr("reached_target", t is not None)
        return float(t) if t is not None else NOT_REACHED_FACTOR * o.tokens

    # the loop
    def run(self, searches: list[_Search], limit: int, poll_s: float) -> None:
        while True:
            while len(self.live) < limit:
                ready = [s for s in searches if s.todo > 0 and s.live < self.tune.parallelism]
                if not ready:
                    break
                self.start(min(ready, key=lambda s: s.started))  # round robin over searches
            if not self.live:
                return
            ended = {o.key: o for o in self.pool.wait(poll_s)}
            ids = [lv.task.run_id for lv in self.live.values()]
            histories = read_histories(self.uri, ids, ("val_loss",))
            for key, lv in list(self.live.items()):
                self.observe(lv, histories[lv.task.run_id]["val_loss"])
                o = ended.get(key)
                if o is None and lv.prune_reason and not self.pool.in_process:
                    self.pool.cancel(key)
                elif o is None:
                    continue
                self.finish(lv, o)
                del self.live[key]
                lv.s.live -= 1

    def interrupt(self, searches: list[_Search]) -> None:
        """Ctrl-C: cancel the trials in flight (all at once: ``cancel`` returns once they have
        ended, one wait for all) and fail them as interrupted, with their folders; and any other
        trial left RUNNING (Ctrl-C came while it was being started): none stays RUNNING for
        ``status`` and the report to count."""
        self.pool.cancel(*self.live)
        for lv in self.live.values():
            with contextlib.suppress(Exception):
                self._fail_interrupted(lv.s.study, lv.trial, "interrupted: Ctrl-C")
            self._remove_trial_dir(lv.task.config["checkpoint_dir"])  # or the next open() does
        self.live.clear()
        for s in searches:
            with contextlib.suppress(Exception):
                self._fail_running(s.study, "interrupted: Ctrl-C")


def run_tune(
    study: Study,
    *,
    executor: ExecutorName = "ray",
    address: str | None = None,
    trials: int | None = None,
    num_cpus: int | None = None,
    stream: IO[str] | None = None,
    poll_s: float = 1.0,
) -> TuneResult:
    """Run every search of the study's ``tune`` section up to its trial count (``trials``
    overrides it), then write ``best.yaml``; see the module docstring."""
    tune = tune_spec(study)
    if trials is not None:
        tune = tune.model_copy(update={"trials": trials})
    out = stream or sys.stderr
    searches = plan_searches(tune, study)
    target_ppl = resolve_target_ppl(study) if tune.objective == "tokens_to_target" else None
    uri = study.tracking_uri
    check_storage(study)  # a damaged or foreign optuna.db: refused before anything is written
    preflight(study, executor=executor, address=address, num_cpus=num_cpus)  # writes nothing
    prepare_study(study, cells=[s.cell for s in searches], out=out)  # records nothing
    lock = study_lock(study.output_dir / "tune", command="ablate tune", error=TuneError)
    with clean_failed_start(study.output_dir) as launched, lock, contextlib.ExitStack() as held:
        res = study.file.resources
        pool = study_executor(study, executor, address=address, num_cpus=num_cpus)
        limit = 1 if pool.in_process else res.max_concurrent or 1 << 30
        interrupted = False
        try:
            tracker, parent = held.enter_context(
                open_study(
                    study, pool, lock="tune", command="ablate tune", error=TuneError, out=out
                )
            )
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(storage_url(study))
            driver = _Driver(study, tune, tracker, parent, pool, out, target_ppl)
            states = [driver.open(s, storage) for s in searches]
            launched.append(True)
            todo = sum(s.todo for s in states)
            print(
                f"tune {study.name}: {len(states)} search(es) x {tune.trials} trials, {todo} to run "
                f"({executor} executor; Optuna {study.output_dir / STORAGE}; MLflow {uri})",
                file=out,
            )
            try:
                driver.run(states, limit, poll_s)
            except KeyboardInterrupt:
                interrupted = True
                driver.interrupt(states)
                print("\ninterrupted: run `ablate tune` again to continue the searches", file=out)
            # the study's own status (set by `ablate run`) stays as it is; tune_trials: the
            # searches' trials that count (all invocations), not this invocation's
            counted = sum(sum(count_trials(s.study.get_trials()).values()) for s in states)
            tracker.set_tags(
                parent,
                {
                    "tune_status": "interrupted" if interrupted else "finished",
                    "tune_trials": counted,
                },
            )
        finally:
            pool.close()
    summary = tune_summary(study)
    best = write_best(study, summary) if summary else None
    return TuneResult(summary, best, ran=driver.ran, interrupted=interrupted)


def resolve_target_ppl(study: Study) -> float:
    """The study's target perplexity for ``tokens_to_target``, by the rule the report uses
    (``ablate.targets.target_ppl``); raises TuneError when the baseline that defines it has no
    finished run yet."""
    t = study.target
    assert t is not None  # check_tune refuses tokens_to_target without a target
    fix = "; run the baseline first (`ablate run`) or give an absolute target: {val_ppl: ...}"
    curves: list[Curve] = []
    if t.from_baseline is not None:
        try:
            curves = baseline_curves(study)
        except TrackingError as e:
            raise TuneError(
                f"tune.objective: tokens_to_target needs the target, derived from the baseline "
                f"({t.from_baseline}), but the study has no results yet ({e}){fix}"
            ) from None
    try:
        return target_ppl_of(t, curves)
    except ValueError as e:
        raise TuneError(f"tune.objective: tokens_to_target: {e}{fix}") from None
