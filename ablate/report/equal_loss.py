"""The equal-loss token ratio: how many tokens a configuration needs for the validation loss the
baseline reaches with one token (numpy only).

Pairs. For a configuration seed i's evaluation at tokens t_i with loss L_i, baseline seed k
needed t_k(L_i) tokens to first reach L_i (``ablate.targets.tokens_to_target`` on its curve, the
same interpolation as tokens to target). The pair's log ratio is

    M_ik = log(t_i / t_k(L_i))

(> 0 when the configuration needs more tokens than the baseline for the same loss: a ratio of
1.26 is a +26% token cost). It is defined at every evaluation, also for a configuration that never
reaches the report's target: the measure the NVFP4 pretraining paper reports. When the
configuration ended *below* baseline seed k's lowest loss, t_k(L_i) lies beyond that seed's last
evaluation T_k: the pair is *censored*, all it says is M_ik < log(t_i / T_k). A baseline trained
past the budget (``baseline_extend``) keeps such pairs rare.

Model. Seeds are shifted copies of their configuration on the log-token axis, the model of the
tokens-to-target estimate (``censored``): M_ik = D + a_i - b_k, with a_i the configuration seed's
offset from its configuration's mean and b_k the baseline seed's (each summing to zero), and the
ratio R = exp(D). The report gives it at the end of training (each finished, non-diverged seed's
last evaluation), with a 95% interval that counts the seed noise of both sides as a two-sample
comparison does (Welch-Satterthwaite degrees of freedom):

    observed   no pair censored: log R = mean(M); with r_i the row means of M and c_k its column
               means, se^2 = var(r) / n_cfg + var(c) / n_base, R's interval exp(log R -/+ t se)
    censored   some pairs censored: the offsets are read from each side's own curves (two seeds
               of the configuration compared at the higher of their final losses, which both
               reached; two baseline seeds at the configuration's median final loss, or the lowest
               loss both reached). Every observed pair then gives D = M_ik - a_i + b_k, every
               censored one D < v_ik = log(t_i / T_k) - a_i + b_k. Seed offsets are independent
               of D under normal seed noise, so this is one normal observation of D, censored at
               min v (a Tobit likelihood): observed here, log R = the mean of the observed pairs'
               D, and the interval is the two-sided one above with se^2 = var(a) / n_cfg +
               var(b) / n_base. Nothing is imputed.
    bound      every pair censored (each configuration seed ended below every baseline seed's
               lowest loss): D < min v only. ``hi`` = exp(min v + t se) is a 95% upper bound (D
               itself lies below min v); ``lo`` is 0. ``value`` is the bias-reduced point of that
               likelihood, exp(min v - 0.81 se) (Firth's Jeffreys-penalized maximum, the usual
               answer to separated data); the report shows the bound.

Paired (``paired_ratio``, the report's method when the configuration and the baseline share two
or more seeds). A seed starts every configuration of a study from the same weights, data order and
random streams, so seed i of the configuration and seed i of the baseline share whatever seed i
does to training: its effect cancels in their ratio and only the two runs' own noise is left. Each
shared seed gives one ratio, read at the higher of the two runs' final losses, which both reached
(the one that ended there at its last tokens, the other where it first got down to it; under the
model above the ratio is the same at every loss), so no pair is censored:

    M_i = log(t_i(L) / t_bi(L)),   L = max(final loss of seed i, final loss of baseline seed i)

log R = mean(M), and its 95% interval the one-sample t interval, se^2 = var(M) / n on n - 1
degrees of freedom. With fewer than two shared seeds the unpaired estimate above is the report's
(``Estimate.method`` says which).

The tests (``tests/ablate/report/test_equal_loss.py``) check coverage and bias by simulation: the
unpaired ratio with equal budgets and with a baseline trained 1.5x longer, the paired one with
seed effects shared by both sides.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ablate.report.censored import NONE, Estimate
from ablate.report.stats import t975
from ablate.targets import Curve, tokens_to_target

FIRTH_SHIFT = 0.8115
"""Where the Jeffreys-penalized likelihood of one normal observation known only to lie below a
point peaks: that many standard errors below it (argmax of log Phi(a) + log I(a) / 2)."""


def _crossing(curve: Curve, ppl: float) -> float:
    """Tokens at which ``curve`` first reached ``ppl``; NaN when it never did (or at 0 tokens)."""
    t = tokens_to_target(curve.tokens, curve.ppl, ppl)
    return t if t is not None and t > 0 else math.nan


def _pairs(ends: Sequence[tuple[float, float]], base: Sequence[Curve]) -> tuple[Any, Any]:
    """(M, censored): the pairs' log ratios, or for a censored pair its upper limit."""
    m = np.empty((len(ends), len(base)))
    cens = np.zeros(m.shape, dtype=bool)
    for i, (t, ppl) in enumerate(ends):
        for k, c in enumerate(base):
            tb = _crossing(c, ppl)
            cens[i, k] = math.isnan(tb)
            m[i, k] = math.log(t / (c.budget if cens[i, k] else tb))
    return m, cens


def _log_stretch(a: Curve, b: Curve) -> float:
    """log(tokens of ``a`` / tokens of ``b``) at the higher of their two final losses, which both
    reached: the one that ended there at its last tokens, the other where it first got down to it
    (NaN where that crossing is unknown)."""
    if float(a.ppl[-1]) >= float(b.ppl[-1]):
        return math.log(a.budget / _crossing(b, float(a.ppl[-1])))
    return math.log(_crossing(a, float(b.ppl[-1])) / b.budget)


def _quiet_nanmean(x: Any, axis: Any) -> Any:
    """``np.nanmean`` that is NaN without a warning where a slice is all NaN (an evaluation that
    no pair reads)."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def seed_offsets(seeds: Sequence[Curve]) -> Any:
    """Each seed's offset from its configuration's mean on the log-token axis (summing to zero),
    from the seeds' own curves: two seeds compared at the higher of their last losses (the one
    ending there at its last tokens, the other where it first reached it). NaN where a curve is
    empty. Used by the equal-loss ratio and by the lower bound on a configuration's token cost
    when none of its seeds reached the target."""
    n = len(seeds)
    d = np.full((n, n), math.nan)
    for i in range(n):
        d[i, i] = 0.0
        for j in range(i + 1, n):
            a, b = seeds[i], seeds[j]
            if not (len(a.tokens) and len(b.tokens)):
                continue
            d[i, j] = _log_stretch(a, b)
            d[j, i] = -d[i, j]
    with np.errstate(all="ignore"):
        out = np.nanmean(d, axis=1) if n else np.zeros(0)
    return out - np.nanmean(out) if n and np.isfinite(out).any() else out


def _base_offsets(base: Sequence[Curve], level: float) -> Any:
    """The baseline seeds' offsets, compared at ``level`` (the configuration's median final
    perplexity) or the lowest perplexity both reached, whichever is higher."""
    n = len(base)
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            at = max(level, float(base[i].ppl.min()), float(base[j].ppl.min()))
            d[i, j] = math.log(_crossing(base[i], at) / _crossing(base[j], at))
            d[j, i] = -d[i, j]
    return d.mean(axis=1)


def _welch(var_a: float, n_a: int, var_b: float, n_b: int) -> tuple[float, float]:
    """(se, df) of a difference of two means with these variances (NaN without spread)."""
    a, b = var_a / n_a, var_b / n_b
    if not (a + b > 0):
        return math.nan, math.nan
    df = (a + b) ** 2 / (a**2 / (n_a - 1) + b**2 / (n_b - 1))
    return math.sqrt(a + b), max(df, 1.0)


@dataclass(frozen=True)
class Pairing:
    """What the ratio at one evaluation rests on, for the report's notes: per configuration seed,
    the baseline seeds whose curves never got down to its loss (their indices)."""

    off_curve: tuple[tuple[int, ...], ...]
    n_base: int = 0

    @property
    def censored(self) -> int:
        return sum(len(k) for k in self.off_curve)


def final_ratio(seeds: Sequence[Curve], base: Sequence[Curve]) -> Estimate:
    """The ratio at the end of training, from each configuration seed's curve (its last
    evaluation is its end) and the baseline seeds' curves (module docstring)."""
    return ratio_at(seeds, base)[0]


def ratio_at(seeds: Sequence[Curve], base: Sequence[Curve]) -> tuple[Estimate, Pairing]:
    """``final_ratio`` with the pairs it censored."""
    seeds = [c for c in seeds if len(c.tokens) and c.tokens[-1] > 0]
    base = [c for c in base if len(c.tokens)]
    if not seeds or not base:
        return NONE, Pairing((), len(base))
    m, cens = _pairs([(c.budget, float(c.ppl[-1])) for c in seeds], base)
    pairing = Pairing(tuple(tuple(np.flatnonzero(row).tolist()) for row in cens), len(base))
    n_c, n_b = m.shape
    if not cens.any():
        est = float(m.mean())
        if n_c < 2 or n_b < 2:
            return Estimate(math.exp(est), math.nan, math.nan, "observed"), pairing
        se, df = _welch(m.mean(axis=1).var(ddof=1), n_c, m.mean(axis=0).var(ddof=1), n_b)
        if math.isnan(se):  # no spread at all: nothing known about the noise, not an exact result
            return Estimate(math.exp(est), math.nan, math.nan, "observed"), pairing
        half = t975(df) * se
        return Estimate(math.exp(est), math.exp(est - half), math.exp(est + half), "observed",
                        df=df), pairing  # fmt: skip
    a = seed_offsets(seeds)
    b = _base_offsets(base, float(np.median([c.ppl[-1] for c in seeds])))
    d = m - a[:, None] + b[None, :]  # D of an observed pair, the upper limit of a censored one
    se, df = (
        _welch(float(a.var(ddof=1)), n_c, float(b.var(ddof=1)), n_b)
        if n_c > 1 and n_b > 1
        else (math.nan, math.nan)
    )
    half = t975(df) * se if math.isfinite(se) else math.nan
    if not cens.all():
        est = float(d[~cens].mean())
        return Estimate(math.exp(est), math.exp(est - half), math.exp(est + half), "censored",
                        df=df), pairing  # fmt: skip
    top = float(d.min())
    if math.isnan(half):  # no noise estimate: the observed limit itself
        return Estimate(math.nan, 0.0, math.exp(top), "bound"), pairing
    point = math.exp(top - FIRTH_SHIFT * se)
    return Estimate(point, 0.0, math.exp(top + half), "bound", df=df), pairing


def pair_logs(seeds: Mapping[int, Curve], base: Mapping[int, Curve]) -> Any:
    """The log ratios M_i of the seeds the configuration shares with the baseline (both by seed
    number), each pair read at the higher of its two final losses (module docstring)."""
    logs = []
    for s in sorted(set(seeds) & set(base)):
        c, b = seeds[s], base[s]
        if not (len(c.tokens) and len(b.tokens)) or c.budget <= 0 or b.budget <= 0:
            continue
        logs.append(_log_stretch(c, b))
    m = np.asarray(logs, dtype=float)
    return m[np.isfinite(m)]


def paired_ratio(seeds: Mapping[int, Curve], base: Mapping[int, Curve]) -> Estimate | None:
    """The paired ratio of one configuration (module docstring): the geometric mean of its
    ``pair_logs`` and the one-sample t interval with their own variance (n - 1 degrees of
    freedom); None with fewer than two shared seeds. The variance is the comparison's own, never
    pooled over the study's configurations: they share the baseline's runs, and a pooled
    variance covered 82-84% for a configuration three times noisier than the rest and 91-92%
    under a baseline three times noisier (Bartlett's test rarely sees either at 3-5 seeds)."""
    m = pair_logs(seeds, base)
    if len(m) < 2:
        return None
    est, sd, df = float(m.mean()), float(m.std(ddof=1)), len(m) - 1
    if not sd > 0:  # identical pairs say nothing about the noise: no interval, not an exact one
        return Estimate(math.exp(est), math.nan, math.nan, "observed", df=df, method="paired")
    half = t975(df) * sd / math.sqrt(len(m))
    return Estimate(
        math.exp(est), math.exp(est - half), math.exp(est + half), "observed",
        sigma=sd, df=df, method="paired",
    )  # fmt: skip


def _first_crossings(curve: Curve, ppl: Any) -> Any:
    """Tokens at which ``curve`` first reached each perplexity in ``ppl`` (NaN where it never
    did): ``tokens_to_target`` for many targets at once, through the curve's running minimum."""
    t, p = curve.tokens, curve.ppl
    ppl = np.asarray(ppl, dtype=float)
    if not len(t):
        return np.full(ppl.shape, np.nan)
    envelope = np.minimum.accumulate(p)  # non-increasing: the first index at or below a level
    i = np.searchsorted(-envelope, -ppl, side="left")
    hit = i < len(t)
    j = np.minimum(i, len(t) - 1)
    prev = np.maximum(j - 1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (np.log(p[prev]) - np.log(ppl)) / (np.log(p[prev]) - np.log(p[j]))
        out = np.where(j == 0, t[0], t[prev] + frac * (t[j] - t[prev]))
    return np.where(hit & (out > 0), out, np.nan)


def ratio_curve(seeds: Sequence[Curve], base: Sequence[Curve]) -> tuple[Any, Any, Any]:
    """(tokens, ratio, bounded) at the configuration's evaluations (tokens > 0): ``final_ratio``
    of the curves up to there of the seeds evaluated there, for the figure; ``bounded`` marks an
    evaluation where every pair was censored (its ratio is the bias-reduced point below the
    upper bound). Where no pair is censored the ratio is the geometric mean over the pairs,
    computed for every evaluation at once."""
    seeds = [c for c in seeds if len(c.tokens)]
    base = [c for c in base if len(c.tokens)]
    tokens = np.unique(np.concatenate([c.tokens for c in seeds])) if seeds else np.array([])
    tokens = tokens[tokens > 0]
    if not len(tokens) or not base:
        return tokens, np.full(len(tokens), np.nan), np.zeros(len(tokens), dtype=bool)
    # ppl (seed, evaluation) of every seed at every evaluation it has (NaN where it has none)
    at = np.full((len(seeds), len(tokens)), np.nan)
    for i, c in enumerate(seeds):
        idx = np.searchsorted(tokens, c.tokens)
        ok = (idx < len(tokens)) & (tokens[np.minimum(idx, len(tokens) - 1)] == c.tokens)
        at[i, idx[ok]] = c.ppl[ok]
    tb = np.stack([_first_crossings(b, at) for b in base], axis=-1)  # (seed, evaluation, base)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(tokens[None, :, None] / tb)
    present = np.isfinite(at)
    censored = (present[..., None] & np.isnan(tb)).any(axis=(0, 2))
    mean = _quiet_nanmean(np.where(present[..., None], logs, np.nan), axis=(0, 2))
    ratios, bounded = np.exp(mean), np.zeros(len(tokens), dtype=bool)
    for e in np.flatnonzero(censored):  # the censored evaluations: the estimator itself
        t = tokens[e]
        cut = [Curve(c.tokens[c.tokens <= t], c.ppl[c.tokens <= t]) for c in seeds if t in c.tokens]
        est = final_ratio(cut, base)
        ratios[e], bounded[e] = est.value, est.kind == "bound"
    return tokens, ratios, bounded


def paired_ratio_curve(seeds: Mapping[int, Curve], base: Mapping[int, Curve]) -> Any:
    """``ratio_curve`` read as ``paired_ratio`` reads the end: each seed the configuration shares
    with the baseline (both by seed number) against that baseline seed only, the geometric mean
    over the pairs at each evaluation, ``bounded`` where every pair there is; None with fewer than
    two shared seeds (the figure then crosses every pair, as the unpaired ratio does)."""
    parts = [
        ratio_curve([seeds[s]], [base[s]])
        for s in sorted(set(seeds) & set(base))
        if len(seeds[s].tokens) and len(base[s].tokens)
    ]
    if len(parts) < 2:
        return None
    tokens = np.unique(np.concatenate([t for t, _, _ in parts]))
    logs = np.full((len(parts), len(tokens)), np.nan)
    bounded = np.ones((len(parts), len(tokens)), dtype=bool)  # a pair absent bounds nothing
    for i, (t, r, b) in enumerate(parts):
        idx = np.searchsorted(tokens, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs[i, idx] = np.log(r)
        bounded[i, idx] = b
    mean = _quiet_nanmean(logs, axis=0)
    return tokens, np.exp(mean), bounded.all(axis=0) & np.isfinite(mean)
