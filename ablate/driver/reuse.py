"""Baseline seeds reused from another study's store (``baseline_from``; ``ablate.study.baseline_from``).

Before it plans, ``ablate run`` looks up each baseline cell that has no run in this study's store
among the runs of the store ``baseline_from`` names, by key: a run there that is a result
(finished, or diverged: a diverged seed is a seed, never left out) is copied into this study's
store (``StudyTracker.copy_run``: metrics, params, provenance, status; tagged ``reused_from`` and
``reused_run``) and planned as done; a seed found there that failed or never ended, and a seed not
found there, train here like any cell. Nothing in the other store is written; nothing already
recorded here is replaced. A copy cut short (the driver killed midway) leaves a ``pending`` run
tagged ``reused_from``, which the next ``ablate run`` deletes and copies again.

``baseline_plan`` says the same without writing anything, for ``ablate plan``; ``check_source``
is what ``preflight`` asks first: that the store named passes the study's own store's checks
(``check_store``), and that it and the study named can be read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO

from ablate.errors import CannotRunError, RunnerError, TrackingError
from ablate.study import Cell, Study
from ablate.study.baseline_from import BaselineSource
from ablate.study.expand import baseline_source
from ablate.tracking import StudyTracker, check_store
from ablate.tracking.runs import CellRun, check_study, read_cells
from ablate.tracking.vocab import ENDED


@dataclass
class BaselinePlan:
    """What ``baseline_from`` gives this study now: the baseline cells to copy (with their run
    there), those found there but not results (with their status), and those not found."""

    source: BaselineSource
    copy: list[tuple[Cell, CellRun]] = field(default_factory=list)
    unusable: list[tuple[Cell, str]] = field(default_factory=list)
    missing: list[Cell] = field(default_factory=list)
    here: int = 0
    """Baseline cells with a run in this store already (reused earlier, or trained here)."""

    def line(self) -> str:
        """One line for ``run`` and ``plan``."""
        n = len(self.copy) + len(self.unusable) + len(self.missing) + self.here
        parts = [f"{len(self.copy)} of {n} baseline seeds to reuse from {self.source.label}"]
        if self.here:
            parts.append(f"{self.here} recorded here already")
        if self.unusable:
            what = ", ".join(f"seed {c.seed} {status}" for c, status in self.unusable)
            parts.append(f"train here: {what} there")
        if self.missing:
            seeds = ", ".join(str(c.seed) for c in self.missing)
            parts.append(f"train here: seed(s) {seeds} (no run of their key there)")
        return "baseline_from: " + "; ".join(parts)


def source_of(study: Study) -> BaselineSource | None:
    """Where the study's ``baseline_from`` points (None: it names none): as resolved when the
    study was read, else resolved now (``expand.baseline_source``)."""
    spec = study.file.baseline_from
    if spec is None:
        return None
    return study.baseline_source or baseline_source(spec)


def check_source(study: Study) -> None:
    """What ``preflight`` asks before anything starts (its runs are not read): ``CannotRunError``
    naming ``baseline_from.uri`` (``baseline_from`` for a study file) when the store it names is
    unusable, checked as the study's own store is (``check_store``: the scheme, a damaged SQLite
    file, one request to a server; never the retries), and ``RunnerError`` naming
    ``baseline_from`` when that store or the study in it cannot be read."""
    source = source_of(study)
    if source is None:
        return
    spec = study.file.baseline_from
    field = "baseline_from.uri" if spec is not None and spec.uri is not None else "baseline_from"
    try:
        check_store(source.uri, create=False)
    except TrackingError as e:
        raise CannotRunError(f"{field}: {e}") from None
    try:
        check_study(source.uri, source.name, experiment=source.experiment)
    except TrackingError as e:
        raise RunnerError(f"baseline_from: {source.label}: {e}") from None


def baseline_plan(study: Study, runs: Mapping[str, CellRun]) -> BaselinePlan | None:
    """What ``baseline_from`` would reuse, given this store's ``runs`` by key (None: the study
    names no source). ``RunnerError`` naming ``baseline_from`` when its store or study cannot be
    read; read only."""
    source = source_of(study)
    if source is None:
        return None
    try:
        theirs = {
            r.key: r for r in read_cells(source.uri, source.name, experiment=source.experiment)
        }
    except TrackingError as e:
        raise RunnerError(f"baseline_from: {source.label}: {e}") from None
    plan = BaselinePlan(source)
    for c in study.baseline_cells:
        mine = runs.get(c.key)
        if mine is not None and not _cut_short(mine):
            plan.here += 1
        elif (r := theirs.get(c.key)) is None:
            plan.missing.append(c)
        elif r.status in ENDED:
            plan.copy.append((c, r))
        else:
            plan.unusable.append((c, r.status))
    return plan


def _cut_short(run: CellRun) -> bool:
    """A copy the driver did not finish: its run tagged as reused, still pending."""
    return bool(run.reused_from) and run.status == "pending"


def reuse_baselines(
    study: Study,
    tracker: StudyTracker,
    parent_id: str,
    runs: Mapping[str, CellRun],
    out: IO[str],
) -> dict[str, CellRun]:
    """Copy the baseline seeds ``baseline_plan`` finds into this study's store (under the
    driver's lock) and return this store's runs by key afterwards."""
    plan = baseline_plan(study, runs)
    if plan is None:
        return dict(runs)
    print(plan.line(), file=out)
    for c, theirs in plan.copy:
        mine = runs.get(c.key)
        if mine is not None:  # a copy cut short: start it again
            tracker.delete_run(mine.run_id)
        run_id = tracker.create_cell_run(parent_id, c)
        tracker.copy_run(plan.source.uri, theirs.run_id, run_id, reused_from=plan.source.label)
    return tracker.cell_runs() if plan.copy else dict(runs)
