"""A study's cells joined with what the store recorded of them: the one join that ``ablate status``,
``ablate plan``, ``ablate run`` and the report all read; and the baseline's recorded curves that a
target derived from the baseline needs (tune, the validate/plan headroom warning)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ablate.study.cells import Cell, Study
from ablate.targets import Curve
from ablate.tracking.history import read_histories
from ablate.tracking.runs import CellRun, read_cells
from ablate.train.config import config_hash

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


def shared_order_note(study: Study, runs: Mapping[str, CellRun]) -> str | None:
    """The line saying which of the study's seeds have no run of their own but a run recorded when
    every seed read batch order 0 (``data.data_seed`` has followed the seed since 2026-11-26): that
    run trained on another batch order, so it is kept but not this cell's; a study that fixes
    ``data: {data_seed: 0}`` finds it again. None when there is none."""
    seeds: set[int] = set()
    for c in study.cells:
        cfg = c.config
        if c.key in runs or cfg.seed == 0 or cfg.data.data_seed != cfg.seed:
            continue
        old = copy.copy(cfg)
        old.data = copy.copy(cfg.data)
        old.data.data_seed = 0
        if config_hash(old) in runs:
            seeds.add(cfg.seed)
    if not seeds:
        return None
    return (
        f"  seed(s) {', '.join(map(str, sorted(seeds)))}: runs recorded when every seed read batch "
        "order 0 are kept, not reused: each seed now reads its own order (data.data_seed follows "
        "the seed); `data: {data_seed: 0}` in the study's base reuses them"
    )


def study_status(study: Study) -> list[CellStatus]:
    """Every cell with its recorded run; raises ``TrackingError`` when the study's store or
    experiment does not exist (nothing was ever recorded: callers decide what that means)."""
    runs = read_cells(study.tracking_uri, study.name, experiment=study.experiment)
    return join_runs(study, {r.key: r for r in runs})


def baseline_curves(study: Study, statuses: list[CellStatus] | None = None) -> list[Curve]:
    """The validation curves (tokens, perplexity) of the baseline's finished runs up to the end of
    their schedule (the study's budget), as the target rule (``ablate.targets.target_ppl``) takes
    them; raises ``TrackingError`` like ``study_status`` when nothing was ever recorded."""
    statuses = study_status(study) if statuses is None else statuses
    # a baseline trained past the budget (baseline_extend) counts up to the end of its schedule:
    # that part is exactly an ordinary cell's curve
    budget = {
        cs.run.run_id: cs.cell.config.train.schedule_end
        for cs in statuses
        if cs.cell.baseline and cs.run is not None and _finished_by_budget(cs.run, cs.cell)
    }
    out = []
    for rid, h in read_histories(study.tracking_uri, list(budget), ("val_loss", "tokens")).items():
        tokens = dict(h["tokens"])
        points = [(tokens.get(s, math.nan), v) for s, v in h["val_loss"] if s <= budget[rid]]
        curve = Curve.of([t for t, _ in points], [math.exp(min(v, 700.0)) for _, v in points])
        if len(curve.tokens):
            out.append(curve)
    return out


def _finished_by_budget(run: CellRun, cell: Cell) -> bool:
    """Finished, or diverged only past the budget it trained beyond (``baseline_extend``)."""
    if run.status == "finished":
        return True
    late = run.diverged_at > cell.config.train.schedule_end  # NaN when unknown: not late
    return run.status == "diverged" and cell.extra_steps > 0 and late


def count(statuses: list[str]) -> dict[str, int]:
    """How many of each, in order of first appearance (for one-line summaries)."""
    out: dict[str, int] = {}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return out
