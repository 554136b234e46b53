"""The equal-loss token ratio: how many tokens a configuration needs for the validation loss the
baseline reaches with one token (numpy only).

For an evaluation of a configuration's seed i at tokens t with loss L, baseline seed k needed
t_k(L) tokens to first reach L (``ablate.targets.tokens_to_target`` on its curve, the same
interpolation as tokens to target). The ratio

    r_ik = t / t_k(L)

is > 1 when the configuration needs more tokens than the baseline for the same loss (a ratio of
1.26 is a +26% token cost), and it is defined at every evaluation, also for a configuration that
never reaches the report's target: the measure the NVFP4 pretraining paper reports.

The report gives it at the end of training (each finished, non-diverged seed's last evaluation)
as the geometric mean over all (configuration seed, baseline seed) pairs, with a 95% interval
that counts the noise of both sides, the way a two-sample comparison does: with M_ik = log r_ik,
a_i the mean over k and b_k the mean over i,

    log R = mean(M)      se^2 = var(a) / n_cfg + var(b) / n_base      Welch-Satterthwaite df

and R's interval is exp(log R -/+ t_{0.975, df} se). When a configuration ends *below* a baseline
seed's lowest loss, that seed never needed "t_k(L)" tokens: the pair uses the seed's whole budget
instead, which makes the ratio an upper bound (kind ``bound``: the configuration is at least that
good).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..targets import Curve, tokens_to_target
from .censored import NONE, Estimate
from .stats import t975


def _pair(t: float, ppl: float, base: Curve) -> tuple[float, bool]:
    """(log ratio, bounded) of one evaluation against one baseline seed."""
    tb = tokens_to_target(base.tokens, base.ppl, ppl)
    if tb is None:
        return math.log(t / base.budget), True
    return math.log(t / max(tb, 1e-300)), False


def final_ratio(ends: Sequence[tuple[float, float]], base: Sequence[Curve]) -> Estimate:
    """The ratio at the end of training from each configuration seed's last evaluation
    ``(tokens, ppl)`` and the baseline seeds' curves (module docstring)."""
    ends = [(t, p) for t, p in ends if t > 0 and math.isfinite(p)]
    base = [c for c in base if len(c.tokens)]
    if not ends or not base:
        return NONE
    pairs = [[_pair(t, p, c) for c in base] for t, p in ends]
    m = np.array([[lr for lr, _ in row] for row in pairs])
    bounded = any(b for row in pairs for _, b in row)
    kind = "bound" if bounded else "observed"
    est = float(m.mean())
    n_c, n_b = m.shape
    if n_c < 2 or n_b < 2:
        return Estimate(math.exp(est), math.nan, math.nan, kind)
    a = m.mean(axis=1).var(ddof=1) / n_c
    b = m.mean(axis=0).var(ddof=1) / n_b
    if a + b == 0:  # no spread at all: nothing known about the noise, not an exact result
        return Estimate(math.exp(est), math.nan, math.nan, kind)
    df = (a + b) ** 2 / (a**2 / (n_c - 1) + b**2 / (n_b - 1))
    half = t975(max(df, 1.0)) * math.sqrt(a + b)
    return Estimate(math.exp(est), math.exp(est - half), math.exp(est + half), kind, df=df)


def ratio_curve(seeds: Sequence[Curve], base: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, ratio) at the configuration's evaluations (tokens > 0): the geometric mean of the
    ratio over every (seed, baseline seed) pair evaluated at those tokens, for the figure."""
    base = [c for c in base if len(c.tokens)]
    logs: dict[float, list[float]] = {}
    for s in seeds:
        for t, p in zip(s.tokens, s.ppl, strict=True):
            if t > 0:
                logs.setdefault(float(t), []).extend(_pair(t, p, c)[0] for c in base)
    tokens = np.array(sorted(logs))
    return tokens, np.exp([np.mean(logs[t]) for t in tokens]) if len(tokens) else np.array([])
