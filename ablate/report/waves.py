"""Sequential seeds replayed from the store: each configuration's comparison with the baseline after
every wave a study's ``seeds: {initial, step, max}`` has run (``replay``), judged by
``ablate.report.sequential`` on the paired log tokens to the study's target, stalled pairs left
out, censored runs as bounds. Pure functions of what the store holds: ``ablate run`` trains the
waves (``ablate.driver.waves``), ``ablate status`` and the report read them from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.errors import ReportError
from ablate.report.sequential import Judgement, judge, seeds_to_decide
from ablate.study import Cell, Study
from ablate.study.seeds import SeedPlan
from ablate.tracking import CellRun
from ablate.tracking.vocab import ENDED


@dataclass(frozen=True)
class Comparison:
    """One configuration against the baseline after a wave."""

    config: str
    seeds: int
    """Seeds the configuration has been given."""
    judgement: Judgement
    stalled: int
    """Pairs left out because a run of them stalled."""
    missing: int
    """Pairs without two ended runs (failed, or both short of the target)."""
    more: int | None = None
    """For an open comparison: pairs that would decide it if its mean and spread held."""

    def line(self) -> str:
        j = self.judgement
        if math.isnan(j.lo):
            how = f"open: {j.pairs} usable pair(s)"
        else:
            cost, lo, hi = (100 * x for x in j.cost)
            how = f"{j.state} {cost:+.1f}% [{lo:+.1f}%, {hi:+.1f}%] on {j.pairs} pair(s)"
        extra = [f"{self.stalled} stalled" if self.stalled else ""]
        extra += [f"{j.censored} censored" if j.censored else ""]
        extra += [f"{self.missing} missing" if self.missing else ""]
        if j.state == "open" and self.more is not None:
            extra.append(f"about {self.more} pairs would decide it")
        notes = ", ".join(x for x in extra if x)
        return f"{self.config} ({self.seeds} seeds): {how}" + (f" ({notes})" if notes else "")


def configs_of(study: Study) -> list[str]:
    """The compared configurations (not the baseline), in the study's order."""
    return list(dict.fromkeys(c.config_label for c in study.cells if not c.baseline))


def wave_cells(study: Study, seeds: dict[str, int]) -> list[Cell]:
    """The cells ``seeds`` (configuration -> seeds given) asks for, the baseline's up to the most."""
    top = max(seeds.values(), default=0)
    return [
        c for c in study.cells if c.seed < (top if c.baseline else seeds.get(c.config_label, 0))
    ]


def _pairs(
    rows: Any, config: str, seeds: int
) -> tuple[list[float], list[bool], list[bool], int, int]:
    """Paired log ratios of ``config`` against the baseline over seeds below ``seeds``: values,
    lower-bound flags, upper-bound flags, stalled pairs, missing pairs."""
    d: list[float] = []
    low: list[bool] = []
    up: list[bool] = []
    stalled = missing = 0
    base = {int(r.seed): r for r in rows.itertuples() if r.baseline}
    mine = {int(r.seed): r for r in rows.itertuples() if r.config == config and not r.baseline}
    for s in range(seeds):
        c, b = mine.get(s), base.get(s)
        if c is None or b is None or c.status not in ENDED or b.status not in ENDED:
            missing += 1
            continue
        if bool(c.stalled) or bool(b.stalled):
            stalled += 1
            continue
        if c.reached and b.reached:
            d.append(math.log(c.tokens_to_target) - math.log(b.tokens_to_target))
            low.append(False)
            up.append(False)
        elif b.reached and c.last_tokens > 0:  # the configuration needs more than it trained
            d.append(math.log(c.last_tokens) - math.log(b.tokens_to_target))
            low.append(True)
            up.append(False)
        elif c.reached and b.last_tokens > 0:  # the baseline needs more than it trained
            d.append(math.log(c.tokens_to_target) - math.log(b.last_tokens))
            low.append(False)
            up.append(True)
        else:
            missing += 1
    return d, low, up, stalled, missing


def cell_rows(study: Study, runs: Mapping[str, CellRun] | None = None) -> Any:
    """Every cell of ``study`` with its tokens to the study's target, read from the store once
    (``report.metrics.per_cell``: status, reached, stalled, tokens_to_target, last_tokens), with
    its ``runs`` by key where the caller has read them."""
    from ablate.report.recorded import study_frames

    return rows_of(study, *study_frames(study, runs))


def rows_of(study: Study, cells: Any, evals: Any) -> Any:
    """``cell_rows`` from the report's frames of the study's cells (``study_frames``): a cell
    without a row is one without a run, as a pending one is."""
    from ablate.report.metrics import per_cell
    from ablate.targets import target_ppl_of

    assert study.target is not None
    return per_cell(cells, evals, target_ppl_of(study.target))


def judge_study(study: Study, seeds: dict[str, int], rows: Any = None) -> dict[str, Comparison]:
    """Each configuration's comparison with the baseline on the seeds it has been given, from
    ``rows`` (``cell_rows``; default: read now from the store)."""
    plan = study.sequential
    assert plan is not None
    if rows is None:
        rows = cell_rows(study)
    configs = configs_of(study)
    out = {}
    for cfg in configs:
        d, low, up, stalled, missing = _pairs(rows, cfg, seeds[cfg])
        j = judge(
            d, n_max=plan.max, comparisons=len(configs), margin=plan.log_margin, lower=low, upper=up
        )
        more = seeds_to_decide(
            j, n_max=plan.max, comparisons=len(configs), margin=plan.log_margin, up_to=50
        )
        out[cfg] = Comparison(cfg, seeds[cfg], j, stalled, missing, more)
    return out


def grow(plan: SeedPlan, seeds: dict[str, int], judged: dict[str, Comparison]) -> dict[str, int]:
    """The next wave's seeds: ``step`` more for each open comparison below ``max``."""
    return {
        c: min(n + plan.step, plan.max) if judged[c].judgement.state == "open" else n
        for c, n in seeds.items()
    }


@dataclass(frozen=True)
class Replay:
    """Where a sequential study stands, read from its store."""

    seeds: dict[str, int]
    """Seeds each configuration has been given so far."""
    cells: list[Cell]
    """The cells its waves have asked for so far."""
    judged: dict[str, Comparison]
    """The comparisons after the last complete wave (empty before the first ends)."""
    waves: int
    done: bool
    """Every comparison decided or at seeds.max."""


def replay(study: Study, rows: Any = None) -> Replay:
    """The waves a sequential study has run, replayed from its store (read once; ``rows``: its
    ``cell_rows`` as the caller read them): each wave whose cells have all ended is judged and
    grows the next, as ``run_waves`` did (the same pure function)."""
    plan = study.sequential
    assert plan is not None
    if rows is None:
        rows = cell_rows(study)
    ended = set(rows["key"][rows["status"].isin(ENDED)])
    seeds = {c: plan.initial for c in configs_of(study)}
    judged: dict[str, Comparison] = {}
    wave = 0
    while True:
        cells = wave_cells(study, seeds)
        if any(c.key not in ended for c in cells):
            return Replay(seeds, cells, judged, wave, False)
        wave += 1
        judged = judge_study(dataclasses.replace(study, cells=cells), seeds, rows)
        nxt = grow(plan, seeds, judged)
        if nxt == seeds:
            return Replay(seeds, cells, judged, wave, True)
        seeds = nxt


def asked_part(study: Study, rows: Any = None) -> Study:
    """A study with sequential seeds less the seeds its waves have not asked for or not trained:
    what its report reads, the seeds its decision reads. Its store may hold other seeds (trained
    under another plan or target, or by a study with a written seed axis): they are not the
    waves', and the report leaves them out as the decision does. Any other study as it is.
    ``rows``: its ``cell_rows`` as the caller read them (default: read now)."""
    if study.sequential is None:
        return study
    if rows is None:
        try:
            rows = cell_rows(study)
        except ReportError:
            return study  # nothing recorded: the report says so
    recorded = set(rows["key"][rows["status"] != "pending"])
    return dataclasses.replace(
        study, cells=[c for c in replay(study, rows).cells if c.key in recorded]
    )


def sequential_lines(study: Study, cells: Any, evals: Any) -> tuple[str, list[str]] | None:
    """The report's sequential decision from the frames it read (``study_frames`` of the cells
    with runs): (its lead, one line per comparison after the last wave that ended); None for a
    study without ``seeds:``, or before its first wave has ended."""
    plan = study.sequential
    if plan is None:
        return None
    rp = replay(study, rows_of(study, cells, evals))
    if not rp.judged:
        return None
    where = "every comparison decided or at seeds.max" if rp.done else "the next wave to run"
    margin = 100 * (math.exp(plan.log_margin) - 1)
    lead = (
        f"**Sequential decision** (the study's `seeds:` rule, after {rp.waves} wave(s); "
        f"{where}): each configuration's token cost against the baseline, paired by seed, with a "
        "simultaneous 95% confidence sequence over every wave and comparison (docs/report.md, "
        f"Sequential seeds); *equivalent* means within ±{margin:.3g}%. This decides the token "
        "cost; the fixed-n intervals below, and the speedup verdict built on them, describe the "
        "seeds trained without accounting for the looks that chose them."
    )
    return lead, [c.line() for c in rp.judged.values()]
