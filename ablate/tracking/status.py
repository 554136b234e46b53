"""A study's cells joined with what the store recorded of them: the one join that ``ablate status``,
``ablate plan``, ``ablate run`` and the report all read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..spec.study import Cell, Study
from .runs import CellRun, read_cells

NOT_STARTED = "not started"


@dataclass(frozen=True)
class CellStatus:
    """One cell of the study and its newest MLflow run (None: never started)."""

    cell: Cell
    run: CellRun | None

    @property
    def status(self) -> str:
        """The run's status (``vocab.STATUSES``), or ``not started``."""
        return self.run.status if self.run is not None else NOT_STARTED


def join_runs(study: Study, runs: Mapping[str, CellRun]) -> list[CellStatus]:
    """The study's cells in study order, each with its run from ``runs`` (by cell key)."""
    return [CellStatus(c, runs.get(c.key)) for c in study.cells]


def study_status(study: Study) -> list[CellStatus]:
    """Every cell with its recorded run; raises ``TrackingError`` when the study's store or
    experiment does not exist (nothing was ever recorded: callers decide what that means)."""
    runs = read_cells(study.tracking_uri, study.name, experiment=study.experiment)
    return join_runs(study, {r.key: r for r in runs})


def count(statuses: list[str]) -> dict[str, int]:
    """How many of each, in order of first appearance (for one-line summaries)."""
    out: dict[str, int] = {}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return out
