"""Sequential seeds: when a configuration's comparison with its baseline is decided, with the error
controlled over every look and every comparison of a study (numpy).

A study trains in waves of seeds; after each wave each open comparison is judged on its paired log
token ratios ``d_i = log T_ci - log T_bi`` (seed i of the configuration against seed i of the
baseline: the seed's own effect cancels). Each comparison gets an interval

    dbar_n +/- c * s_n / sqrt(n)          (n pairs, s_n their standard deviation)

whose critical values ``c = c_n`` make the intervals a *simultaneous confidence sequence*: under
normal paired differences, with probability at least ``1 - alpha`` every interval of every
comparison, at every number of pairs from ``N_MIN`` to ``max`` (not only at the planned looks),
covers its comparison's true log ratio. ``c_n`` is the t quantile (n - 1 degrees of freedom) of one
tail probability ``gamma`` shared by every n, chosen so that the one-sample t statistics ``T_n``
of a sequence of standard normal draws cross ``c_n`` at some n with probability ``alpha / J``
(``tail_level``: a pivot, which depends on no unknown, not the noise, not the seed effects;
Monte Carlo, once). The ``J`` comparisons share the error by Bonferroni, which their correlation
(a shared baseline) makes only mildly conservative. A constant ``c`` over n would be set by the
heavy tails of the first looks (two degrees of freedom at three pairs) and waste every later one.

Because the intervals cover at every n at once, any rule that reads them is valid whenever it
looks and whatever it stops: more seeds for some configurations only, a wave lost or resumed, a
pair left out because a run stalled. A comparison is decided:

    equivalent   the interval inside (-margin, +margin) on the log scale (the token costs equal
                 within the stated margin)
    slower       its lower end above 0 (the configuration needs more tokens)
    faster       its upper end below 0
    open         otherwise; more seeds, up to ``max``, or the report says how many would decide it

Pairs in which either run stalled (``stalls``) are left out and counted apart. A run that did not
reach the target within its budget bounds its pair: a censored configuration run makes ``d`` a
lower bound (the configuration needed at least its budget), a censored baseline run an upper
bound. The bound is used in its place, and such a comparison may only be decided in the
direction the bound supports: ``slower`` with censored configuration runs, ``faster`` with
censored baseline runs, neither with both.

The error over whole sequential studies (family-wise: any comparison decided wrongly at any look),
with shared seed effects, stalls, censoring and waves, and the same harness's repeated fixed-n
t intervals for contrast, is ``simulate``'s and tabled in docs/report.md; its test is
``tests/ablate/report/test_sequential.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ablate.report.stats import t975, t_quantile
from ablate.study.seeds import N_MIN, SeedPlan  # N_MIN: the fewest pairs judged (2 df)

ALPHA = 0.05
MARGIN = math.log(1.05)
"""Equivalence margin on the log token ratio: token costs within 5% of each other."""
STATES = ("faster", "slower", "equivalent", "open")
_MC_DRAWS = 200_000
_MC_SEED = 20261126


@dataclass(frozen=True)
class Judgement:
    """One comparison at one look."""

    state: str
    """One of ``STATES``."""
    pairs: int
    """Pairs it was judged on (stalled pairs left out)."""
    log_ratio: float
    lo: float
    hi: float
    """The interval on the log token ratio (nan below ``N_MIN`` pairs)."""
    critical: float
    censored: int = 0
    """Pairs carrying a bound instead of a value."""
    lower_bounds: int = 0
    """Of those, the lower bounds (the configuration's run censored); the rest are upper bounds."""

    @property
    def cost(self) -> tuple[float, float, float]:
        """Relative token cost and its interval: ``exp(.) - 1``."""
        return math.expm1(self.log_ratio), math.expm1(self.lo), math.expm1(self.hi)


def _abs_t(z: np.ndarray) -> np.ndarray:
    """The one-sample |t| of the first n columns of each row, for every n (column n - 1)."""
    n = np.arange(1, z.shape[1] + 1, dtype=float)
    s1 = np.cumsum(z, axis=1)
    s2 = np.cumsum(z * z, axis=1)
    mean = s1 / n
    var = np.maximum(s2 - n * mean * mean, 1e-300) / np.maximum(n - 1, 1)
    return np.abs(mean) / np.sqrt(var / n)


@functools.lru_cache(maxsize=64)
def tail_level(n_max: int, comparisons: int = 1, alpha: float = ALPHA) -> float:
    """The two-sided t tail probability ``gamma`` each look spends: with ``c_n`` the ``1 - gamma/2``
    quantile of t with n - 1 degrees of freedom, P(|T_n| > c_n for some n in [N_MIN, n_max]) =
    alpha / comparisons under normal pairs (the same tail at every n, Pocock's spending on the
    t scale). Monte Carlo over 200,000 sequences with a fixed seed: the same number on every
    machine. Each sequence's smallest tail over n is read from the ranks of its |T_n| among all
    sequences (the t distribution's own tail, to Monte Carlo precision), and ``gamma`` is that
    smallest tail's ``alpha / comparisons`` quantile."""
    if n_max < N_MIN:
        raise ValueError(f"n_max {n_max}: at least {N_MIN}")
    rng = np.random.default_rng(_MC_SEED)
    draws = min(_MC_DRAWS, 4_000_000 // n_max)  # memory: a few hundred MB at most
    t = _abs_t(rng.standard_normal((draws, n_max)))[:, N_MIN - 1 :]
    tail = np.empty_like(t)
    for k in range(t.shape[1]):  # tail of each |T_n| among the draws: 1 - rank / draws
        order = np.argsort(-t[:, k], kind="stable")
        tail[order, k] = (np.arange(draws) + 1) / draws
    return float(np.quantile(tail.min(axis=1), alpha / max(comparisons, 1)))


def critical_value(n: int, n_max: int, comparisons: int = 1, alpha: float = ALPHA) -> float:
    """``c_n``: the interval's half-width in standard errors at ``n`` pairs, in a study whose
    comparisons may each be judged at any n up to ``n_max`` (``tail_level``)."""
    if not N_MIN <= n <= max(n_max, N_MIN):
        raise ValueError(f"n {n}: between {N_MIN} and n_max {n_max}")
    gamma = tail_level(n_max, comparisons, alpha)
    return t_quantile(1.0 - gamma / 2.0, n - 1)


def decide(lo: float, hi: float, margin: float, lower_bounds: bool, upper_bounds: bool) -> str:
    """The state an interval on the log ratio decides (see the module docstring)."""
    if math.isnan(lo) or (lower_bounds and upper_bounds):
        return "open"
    if lower_bounds:
        return "slower" if lo > 0 else "open"
    if upper_bounds:
        return "faster" if hi < 0 else "open"
    if -margin < lo and hi < margin:
        return "equivalent"
    if lo > 0:
        return "slower"
    if hi < 0:
        return "faster"
    return "open"


def judge(
    d: Sequence[float] | np.ndarray,
    *,
    n_max: int,
    comparisons: int = 1,
    alpha: float = ALPHA,
    margin: float = MARGIN,
    lower: Sequence[bool] | np.ndarray | None = None,
    upper: Sequence[bool] | np.ndarray | None = None,
    naive: bool = False,
) -> Judgement:
    """Judge one comparison on its paired log ratios ``d`` (stalled pairs already left out), in a
    study of ``comparisons`` comparisons judged at up to ``n_max`` pairs each; ``lower[i]``: d[i]
    is a lower bound (the configuration's run censored), ``upper[i]`` an upper bound (the
    baseline's). ``naive``: the fixed-n t interval (t_0.975) instead, for contrast only."""
    x = np.asarray(d, dtype=float)
    n = len(x)
    nl = int(np.count_nonzero(np.asarray(lower, dtype=bool))) if lower is not None else 0
    nu = int(np.count_nonzero(np.asarray(upper, dtype=bool))) if upper is not None else 0
    if n < N_MIN:
        mean = float(x.mean()) if n else math.nan
        return Judgement("open", n, mean, math.nan, math.nan, math.nan, nl + nu)
    c = t975(n - 1) if naive else critical_value(n, n_max, comparisons, alpha)
    mean = float(x.mean())
    half = c * float(x.std(ddof=1)) / math.sqrt(n)
    lo, hi = mean - half, mean + half
    return Judgement(decide(lo, hi, margin, nl > 0, nu > 0), n, mean, lo, hi, c, nl + nu, nl)


def seeds_to_decide(
    j: Judgement, *, n_max: int, comparisons: int = 1, margin: float = MARGIN, up_to: int = 50
) -> int | None:
    """Pairs that would decide an open comparison if its mean and spread held (each n's critical
    value in a study planned to ``up_to`` pairs), or None when none up to ``up_to`` would: what
    the report says of a comparison left open. A comparison with censored pairs is counted to
    the one decision its bounds allow (``decide``), as the judge would read it; with bounds on
    both sides none is."""
    if j.state != "open" or j.pairs < N_MIN or math.isnan(j.lo):
        return None
    lower, upper = j.lower_bounds > 0, j.censored - j.lower_bounds > 0
    if lower and upper:
        return None
    sd = (j.hi - j.lo) / 2 / j.critical * math.sqrt(j.pairs)  # the pairs' standard deviation
    for n in range(j.pairs + 1, up_to + 1):
        half = critical_value(n, max(up_to, n_max), comparisons) * sd / math.sqrt(n)
        if decide(j.log_ratio - half, j.log_ratio + half, margin, lower, upper) != "open":
            return n
    return None


# ----------------------------------------------------------------------------------------------
# whole sequential studies, simulated


@dataclass(frozen=True)
class Outcome:
    """What ``simulate`` measured over its studies."""

    family_error: float
    """Share of studies with any comparison decided wrongly at any look."""
    decided: tuple[float, ...]
    """Per configuration: share of studies in which it ended decided."""
    wrong: tuple[float, ...]
    """Per configuration: share decided wrongly."""
    mean_seeds: float
    """Mean runs a study trained (configurations and baseline)."""
    fixed_seeds: int
    """Runs of the fixed design that trains every configuration ``max`` seeds."""
    fixed_decided: tuple[float, ...]
    """Per configuration: share decided by the fixed design (one look at ``max``, the same
    Bonferroni level across comparisons)."""


def simulate(
    deltas: Sequence[float],
    *,
    plan: SeedPlan | None = None,
    sigma: float = 0.05,
    seed_sd: float = 0.1,
    stall_p: float = 0.0,
    censor_at: float | None = None,
    margin: float = MARGIN,
    studies: int = 2000,
    naive: bool = False,
    seed: int = 0,
) -> Outcome:
    """Simulate ``studies`` sequential studies of ``len(deltas)`` configurations against one
    baseline: log tokens ``mu + delta_j + a_i + e_ij`` (a_i ~ N(0, seed_sd) shared by every
    configuration of seed i, e_ij ~ N(0, sigma)); each run stalls with probability ``stall_p``
    (its pair left out); a run past ``censor_at`` (log tokens over the baseline's mean) is
    censored there. Waves as ``plan`` says (default: 3 seeds, then 2 more up to 10); ``naive``: the intervals of a fixed-n t test
    (t_0.975) at every look instead of the confidence sequence."""
    rng = np.random.default_rng(seed)
    plan = plan if plan is not None else SeedPlan()
    J, N = len(deltas), plan.max
    delta = np.asarray(deltas, dtype=float)
    a = rng.normal(0.0, seed_sd, (studies, 1, N))
    base = a[:, 0, :] + rng.normal(0.0, sigma, (studies, N))
    cfg = delta[None, :, None] + a + rng.normal(0.0, sigma, (studies, J, N))
    ok = (rng.random((studies, J, N)) >= stall_p) & (rng.random((studies, 1, N)) >= stall_p)
    low = np.zeros((studies, J, N), dtype=bool)
    up = np.zeros((studies, J, N), dtype=bool)
    if censor_at is not None:
        low = cfg > censor_at
        up = np.broadcast_to((base > censor_at)[:, None, :], low.shape)
        cfg = np.minimum(cfg, censor_at)
        base = np.minimum(base, censor_at)
    d = cfg - base[:, None, :]
    state = np.full((studies, J), "open", dtype=object)
    used = np.full((studies, J), N)
    wrong = np.zeros((studies, J), dtype=bool)
    for n in plan.looks():
        for s in range(studies):
            for j in range(J):
                if state[s, j] != "open":
                    continue
                m = ok[s, j, :n]
                jd = judge(d[s, j, :n][m], n_max=N, comparisons=J, margin=margin,
                           lower=low[s, j, :n][m], upper=up[s, j, :n][m], naive=naive)  # fmt: skip
                if jd.state != "open":
                    state[s, j], used[s, j] = jd.state, n
                    wrong[s, j] = _wrong(jd.state, delta[j], margin)
    fixed = np.zeros((studies, J), dtype=bool)
    for s in range(studies):
        for j in range(J):
            m = ok[s, j]
            jd = judge(d[s, j][m], n_max=N, comparisons=J, margin=margin, lower=low[s, j][m],
                       upper=up[s, j][m], naive=naive)  # fmt: skip
            fixed[s, j] = jd.state != "open"
    runs = used.sum(axis=1) + used.max(axis=1)  # every configuration's seeds and the baseline's
    return Outcome(
        family_error=float(wrong.any(axis=1).mean()),
        decided=tuple(float(x) for x in (state != "open").mean(axis=0)),
        wrong=tuple(float(x) for x in wrong.mean(axis=0)),
        mean_seeds=float(runs.mean()),
        fixed_seeds=N * (J + 1),
        fixed_decided=tuple(float(x) for x in fixed.mean(axis=0)),
    )


def _wrong(state: str, delta: float, margin: float) -> bool:
    """Whether deciding ``state`` is an error when the true log ratio is ``delta``."""
    if state == "slower":
        return delta <= 0
    if state == "faster":
        return delta >= 0
    if state == "equivalent":
        return abs(delta) >= margin
    return False
