"""Stalls: runs that sit on a loss plateau long after the others left it, counted as an outcome of
their own (numpy; ``stall_flags`` reads the report's tidy tables).

Small language models leave an early plateau of the loss (near the unigram entropy) at a time that
varies from seed to seed, and a seed now and then stays on it for a large part of its budget (the
quickstart's FP8 seed 1: perplexity 29.6 / 28.1 / 26.5 at 24-49k tokens while the other runs stood
at 16-20). Its tokens to target are then the time it took to leave the plateau, not the speed of
the recipe: pooled into the Gaussian seed noise of the token cost, one such run widens every
interval of its comparisons by a factor of ten and breaks their coverage when the baseline is the
arm that stalls. So a stall is reported as a rate, and the token cost is estimated on the runs that
did not stall (a hurdle model: how often a recipe stalls, and how fast it is when it does not).

Definition. At ``at`` of its budget (default ``STALL_AT`` = 0.5), each run's perplexity is read
from its curve (``targets.ppl_at``: the lowest it had reached by then), on the log scale y_ji
(configuration j, seed i). A run is *stalled* when it stands above what its own configuration's
other seeds predict for it by more than ``log(1 + margin)`` (default ``STALL_MARGIN`` = 0.25):

    predicted_ji = median over seeds k != i of ( y_jk + median over configurations j' != j
                                                   of (y_j'i - y_j'k) )

each other seed k of the configuration, moved by how seed i stands against seed k in the study's
other configurations (the seed effect that every configuration shares). A configuration's token
cost moves all its seeds alike and a seed effect moves all configurations alike, so neither is
taken for a stall: only a run that one seed of one configuration spent on a plateau. A run of a
configuration with no other judged seed is not judged; neither is a run that diverged (a divergence
is its own outcome), one whose evaluations stop before ``at`` of its budget, or one with fewer
than ``MIN_EVALS`` (4) evaluations up to there. A configuration whose every seed stalls shows as
a large token cost, not as stalls. One stalled run would move the seed shifts that predict the
others, so the runs are taken out one at a time, the furthest above its prediction first.

The margin is a stated choice, not a fit: the quickstart's stalled FP8 seed stood at perplexity
29.6-26.5 through 24-49k tokens while every other run stood at 16-20, 50-80% lower. The
simulations (``ablate.bench.seeds``) count how often a run that did not stall is taken for one.

Rate and test. A configuration's stall rate k / n has its exact (Clopper-Pearson) 95% interval;
Fisher's exact test, one-sided, asks whether it stalls more often than the baseline. A
configuration that does (p < 0.05) is called *worse* by the verdict whatever its token cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ablate.report.inputs import budget_steps, curves
from ablate.targets import Curve, ppl_at

STALL_AT = 0.5
"""The share of its budget at which a run is judged."""
STALL_MARGIN = 0.25
"""How far above the study's median perplexity at ``STALL_AT`` a stalled run stands."""
MIN_EVALS = 4
"""The fewest evaluations up to the stall share that a judged run has."""
STALL_P = 0.05
"""Fisher's one-sided p-value below which a configuration stalls more often than its baseline."""


def ppl_at_share(curve: Curve, budget: float, at: float = STALL_AT) -> float:
    """The perplexity ``curve`` had reached by ``at`` of ``budget``; NaN when its evaluations stop
    before then, or fewer than ``MIN_EVALS`` of them are at or before it (the run cannot be
    judged: a perplexity interpolated between far evaluations says nothing of a plateau)."""
    if not len(curve.tokens) or not budget > 0 or curve.tokens[-1] < at * budget * (1 - 1e-9):
        return math.nan
    if int((curve.tokens <= at * budget * (1 + 1e-9)).sum()) < MIN_EVALS:
        return math.nan
    return ppl_at(curve, at * budget)


def stalled_runs(
    ppl: Mapping[tuple[str, int], float], margin: float = STALL_MARGIN
) -> dict[tuple[str, int], bool | None]:
    """Per (configuration, seed): whether the run stalled (module docstring), None where it
    cannot be judged. ``ppl``: each run's perplexity at the stall share (NaN: not judged).

    One stalled run would move the seed shifts that predict the others, so the runs are taken
    out one at a time: the run furthest above its prediction, while it is above the margin, is
    stalled and leaves the data before the predictions are made again."""
    y = {k: math.log(v) for k, v in ppl.items() if math.isfinite(v) and v > 0}
    limit = math.log1p(margin)
    out: dict[tuple[str, int], bool | None] = {k: None for k in ppl}
    while True:
        residuals = _residuals(y)
        for k in residuals:
            if out[k] is None:
                out[k] = False
        if not residuals:
            return out
        worst = max(residuals, key=lambda k: residuals[k])
        if residuals[worst] <= limit:
            return out
        out[worst] = True
        del y[worst]


def _residuals(y: Mapping[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """Each run's log perplexity less its prediction from its configuration's other seeds."""
    by_config: dict[str, dict[int, float]] = {}
    for (c, s), v in y.items():
        by_config.setdefault(c, {})[s] = v
    out = {}
    for (c, i), v in y.items():
        preds = []
        for k, vk in by_config[c].items():
            if k == i:
                continue
            shifts = [
                runs[i] - runs[k]
                for o, runs in by_config.items()
                if o != c and i in runs and k in runs
            ]
            preds.append(vk + (float(np.median(shifts)) if shifts else 0.0))
        if preds:
            out[(c, i)] = v - float(np.median(preds))
    return out


@dataclass(frozen=True)
class StallRate:
    """A configuration's stall rate: ``k`` of ``n`` judged runs stalled, the exact 95% interval
    ``lo``/``hi``, and ``p``: Fisher's one-sided p-value that it stalls more often than the
    baseline (NaN for the baseline itself or without judged runs)."""

    k: int
    n: int
    lo: float
    hi: float
    p: float = math.nan

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else math.nan

    @property
    def more_than_baseline(self) -> bool:
        return self.p < STALL_P


def stall_rate(k: int, n: int, base: tuple[int, int] | None = None) -> StallRate:
    """``k`` stalled of ``n`` judged runs; ``base``: the baseline's (k, n) for the test."""
    lo, hi = clopper_pearson(k, n)
    p = fisher_greater(k, n, *base) if base is not None and n and base[1] else math.nan
    return StallRate(k, n, lo, hi, p)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion, by bisection on the binomial
    CDF ((NaN, NaN) for n = 0): lo solves P(X >= k | lo) = a/2, hi solves P(X <= k | hi) = a/2."""
    if n == 0:
        return math.nan, math.nan
    a = (1 - level) / 2

    def solve(f: Callable[[float], float], target: float, rising: bool) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            v = f(mid)
            if (v < target) == rising:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: 1 - _binom_cdf(k - 1, n, p), a, True)
    high = 1.0 if k == n else solve(lambda p: _binom_cdf(k, n, p), a, False)
    return low, high


def fisher_greater(k1: int, n1: int, k2: int, n2: int) -> float:
    """Fisher's exact one-sided p-value that group 1's rate (k1 of n1) exceeds group 2's (k2 of
    n2): P(X >= k1) under the hypergeometric law of the 2x2 table with its margins fixed."""
    total, hits = n1 + n2, k1 + k2
    denom = math.comb(total, n1)
    top = min(hits, n1)
    return float(
        sum(math.comb(hits, x) * math.comb(total - hits, n1 - x) for x in range(k1, top + 1))
        / denom
    )


def stall_flags(
    cells: Any, evals: Any, at: float = STALL_AT, margin: float = STALL_MARGIN
) -> dict[str, bool]:
    """key -> whether the cell stalled, for every cell that can be judged (finished, no
    non-finite loss up to its budget, evaluated up to ``at`` of it); the others are absent.
    ``evals``: the cleaned evaluations (``inputs.clean_evals``); a cell trained past its budget is
    judged on the part up to it, as an ordinary cell."""
    budget = budget_steps(cells)
    info = {
        str(k): (str(c), int(s))
        for k, c, s, st in zip(
            cells["key"], cells["config"], cells["seed"], cells["status"], strict=True
        )
        if st == "finished"
    }
    found: dict[tuple[str, int], tuple[str, float]] = {}
    for key, step, tok, ppl in curves(evals):
        if key not in info:
            continue
        ordinary = step <= budget.get(key, math.inf)
        curve = Curve.of(tok[ordinary], ppl[ordinary])
        if len(curve.tokens) < int(ordinary.sum()):
            continue  # a non-finite loss before the budget: a divergence, not a stall
        found[info[key]] = (key, ppl_at_share(curve, curve.budget, at))
    flags = stalled_runs({run: p for run, (_, p) in found.items()}, margin)
    return {key: bool(flags[run]) for run, (key, _) in found.items() if flags[run] is not None}
