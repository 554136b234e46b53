"""Paired token costs: configuration effects plus seed blocks, the design the trainer runs (numpy).

A seed starts every configuration of a study from the same initial weights, the same data order and
the same base of the quantizer's random streams: seed i is a block, and the configurations are
compared within it (common random numbers). The unpaired estimate (``censored.relative_cost``)
ignores that: a seed that is slow for every configuration widens every interval. Here, for the runs
that did not stall (``stalls``):

    log T_ij = mu_j + a_i + e_ij,      e_ij ~ Normal(0, sigma^2)

mu_j the configuration's effect, a_i seed i's (shared by every configuration), sigma the residual
noise, pooled over the configurations (a two-way model; Tobit where some seeds are censored: a seed
that did not reach the target contributes P(log T > log c), c the tokens it trained). The relative
token cost is exp(mu_c - mu_b) - 1, as in ``censored``.

Interval, with df = (runs) - (configurations) - (seeds) + 1 residual degrees of freedom:
    no censored run   the two-way least-squares contrast, delta_hat +/- t_{0.975, df} se: exact
                      under the model, for any pattern of missing runs (unbalanced designs too)
    censored runs     the profile deviance of delta with sigma fixed at its small-sample estimate
                      sigma_hat * sqrt(R / df_R), cut at t_{0.975, df_R}^2, with R the reached
                      runs and df_R = R - (configurations + seeds - 1): the likelihood
                      generalisation, as ``censored`` builds it for two configurations, with the
                      degrees of freedom of the runs that reached. A censored run carries less
                      than a reached one, and the seed effects are many parameters for a few
                      runs: counted as full runs (df from all N runs, as ``censored`` counts them
                      for two configurations) the interval covered 88-90% in simulation at a
                      third of the runs censored; counted this way, 94-96%

Which runs, and which variance (``Estimate.method``):
    paired            the model over every configuration with a reached seed: sigma pooled, df
                      (J - 1)(n - 1) in a complete design of J configurations and n seeds
    paired-own        the configurations' residual variances differ (Bartlett's test over the
                      configurations, p < 0.05): the comparison's own two configurations only,
                      df n - 1 (the paired t interval on the seed-by-seed differences)
    unpaired          the configuration and the baseline share fewer than two seeds
                      (``MIN_MATCHED``), the seeds carry no numbers, or too few runs reached to
                      leave a degree of freedom beside the seed effects: ``censored.relative_cost``
                      (its kinds, its bound)

Seeds or configurations without a single reached run carry no information on their own effect
(their maximum-likelihood effect is infinite) and are left out of the fit; a configuration with
none is only bounded (``censored._cost_bound``). The coverage of each method is proven by
simulation in ``tests/ablate/report/test_paired.py`` and tabled in docs/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ablate.report.censored import (
    LOG_SIGMA_RANGE,
    NONE,
    Estimate,
    Seeds,
    golden_max,
    log_ndtr,
    mills,
    profile_interval,
    relative_cost,
)
from ablate.report.stats import chi2_sf, t975

MIN_MATCHED = 2
"""Seeds a configuration shares with the baseline for a paired estimate (one pairs through the
other configurations' seed effects alone: in simulation with stalls in every arm its intervals
covered 88-90%, against 92-96% at two or more)."""
HETEROGENEITY_P = 0.05
"""Bartlett's test below this p-value: a comparison uses its own configurations' variance."""


@dataclass(frozen=True)
class Design:
    """The runs of a fit: configuration and seed index, log tokens, reached."""

    configs: tuple[str, ...]
    seeds: tuple[int, ...]
    j: np.ndarray
    i: np.ndarray
    y: np.ndarray
    reached: np.ndarray

    @classmethod
    def of(cls, groups: Mapping[str, Seeds]) -> Design:
        """The runs of ``groups`` less every seed and configuration without a reached run
        (repeatedly: leaving one out can leave another without one)."""
        runs = [(c, s, math.log(t), ok) for c, g in groups.items() for s, t, ok in g.runs()]
        while True:
            good_c = {c for c, _, _, ok in runs if ok}
            good_s = {s for _, s, _, ok in runs if ok}
            kept = [r for r in runs if r[0] in good_c and r[1] in good_s]
            if len(kept) == len(runs):
                break
            runs = kept
        configs = tuple(c for c in groups if c in good_c)
        seeds = tuple(sorted(good_s))
        cix, six = {c: k for k, c in enumerate(configs)}, {s: k for k, s in enumerate(seeds)}
        return cls(
            configs,
            seeds,
            np.array([cix[c] for c, *_ in runs], dtype=int),
            np.array([six[s] for _, s, *_ in runs], dtype=int),
            np.array([y for *_, y, _ in runs], dtype=float),
            np.array([ok for *_, ok in runs], dtype=bool),
        )

    @property
    def n(self) -> int:
        return len(self.y)

    def matrix(self, merge: tuple[int, int] | None = None) -> np.ndarray:
        """The design matrix: one column per configuration, one per seed but the first. With
        ``merge = (c, b)`` configuration c's column is folded into b's (mu_c = mu_b + offset)."""
        x = np.zeros((self.n, len(self.configs) + len(self.seeds) - 1))
        x[np.arange(self.n), self.j] = 1.0
        rest = self.i > 0
        x[np.flatnonzero(rest), len(self.configs) + self.i[rest] - 1] = 1.0
        if merge is not None:
            c, b = merge
            x[:, b] += x[:, c]
            x = np.delete(x, c, axis=1)
        return x

    @cached_property
    def full_matrix(self) -> np.ndarray:
        """``matrix()``, made once."""
        return self.matrix()

    @cached_property
    def df(self) -> int:
        """Residual degrees of freedom: runs less the rank of the design (J + n - 1 when the
        seeds connect every configuration)."""
        if not self.n:
            return 0
        return self.n - int(np.linalg.matrix_rank(self.full_matrix))

    @cached_property
    def least_squares(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(coefficients, (X'X)^+, residual sd) of the fit without censoring."""
        x = self.full_matrix
        beta, *_ = np.linalg.lstsq(x, self.y, rcond=None)
        resid = self.y - x @ beta
        return beta, np.linalg.pinv(x.T @ x), math.sqrt(float(resid @ resid) / self.df)

    @cached_property
    def sigma(self) -> float:
        """sigma's maximum-likelihood estimate under censoring (``_fit_sigma``), made once."""
        return _fit_sigma(self)


class _Tobit:
    """The censored-normal log-likelihood of a design at a fixed sigma, as a function of the
    linear predictor's coefficients (concave: Newton converges from anywhere)."""

    def __init__(self, d: Design, x: np.ndarray, sigma: float, offset: np.ndarray) -> None:
        self.d, self.x, self.s, self.offset = d, x, sigma, offset
        self._ok = np.flatnonzero(d.reached)
        self._cens = np.flatnonzero(~d.reached)
        self._log_s_ok = len(self._ok) * math.log(sigma)

    def _ll(self, beta: np.ndarray) -> tuple[float, tuple[np.ndarray, list[float], list[float]]]:
        """The log-likelihood at ``beta`` (-inf where it is not finite: a trial step far out) and
        what ``_derivatives`` takes there. Under ``np.errstate(over="ignore", invalid="ignore")``
        (``maximize``)."""
        z = (self.d.y - (self.x @ beta + self.offset)) / self.s
        ll = float(-0.5 * (z[self._ok] ** 2).sum()) - self._log_s_ok
        if not math.isfinite(ll):
            return -math.inf, (z, [], [])
        zc = (-z[self._cens]).tolist()  # log P(log T > log c) = log Phi((eta - c) / s)
        logs = list(map(log_ndtr, zc))
        return ll + sum(logs), (z, zc, logs)

    def _derivatives(
        self, at: tuple[np.ndarray, list[float], list[float]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(gradient, Hessian) at the point ``_ll`` returned ``at`` for."""
        z, zc, logs = at
        s, ok = self.s, self._ok
        g, h = np.empty(self.d.n), np.empty(self.d.n)
        g[ok] = z[ok] / s
        h[ok] = -1 / s**2
        for k, v, lv in zip(self._cens.tolist(), zc, logs, strict=True):
            m = mills(v, lv)
            g[k] = m / s
            h[k] = -m * (v + m) / s**2
        return self.x.T @ g, (self.x.T * h) @ self.x

    def maximize(self, beta: np.ndarray) -> tuple[np.ndarray, float]:
        """The coefficients that maximize the log-likelihood from ``beta``, and the maximum: damped
        Newton steps, each halved until the log-likelihood does not fall (a step that cannot be
        made to rise within 60 halvings ends the search where it is)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self._maximize(beta)

    def _maximize(self, beta: np.ndarray) -> tuple[np.ndarray, float]:
        f, at = self._ll(beta)
        if not math.isfinite(f):
            return beta, f
        g, h = self._derivatives(at)
        for _ in range(100):
            try:
                step = np.linalg.solve(-h, g)
            except np.linalg.LinAlgError:
                step = np.linalg.lstsq(-h, g, rcond=None)[0]
            if not np.isfinite(step).all():  # a Hessian too near singular to solve
                step = np.linalg.lstsq(-h, g, rcond=None)[0]
            for _ in range(60):
                trial = beta + step
                nf, at = self._ll(trial)
                if nf >= f - 1e-12 or float(np.abs(step).max()) < 1e-12:
                    break
                step = step / 2
            else:
                break
            beta, f = trial, nf
            if not math.isfinite(f):
                break
            g, h = self._derivatives(at)
            if float(np.abs(step).max()) < 1e-9:
                break
        return beta, f


def _start(d: Design, x: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Least squares on every run's log tokens (a censored one at its limit)."""
    return np.linalg.lstsq(x, d.y - offset, rcond=None)[0]


def _fit_sigma(d: Design) -> float:
    """sigma's maximum-likelihood estimate (0 when the runs leave no spread)."""
    x, zero = d.full_matrix, np.zeros(d.n)
    beta = [_start(d, x, zero)]

    def profile(log_s: float) -> float:
        beta[0], f = _Tobit(d, x, math.exp(log_s), zero).maximize(beta[0])
        return f

    lo, hi = LOG_SIGMA_RANGE
    log_s = golden_max(profile, lo, hi, tol=1e-6)
    return 0.0 if log_s <= lo + 1e-3 else math.exp(log_s)


def _least_squares(d: Design, c: int, b: int) -> tuple[float, float, float]:
    """(delta_hat, se, residual sd) of mu_c - mu_b without censoring."""
    beta, cov, s = d.least_squares
    contrast = np.zeros(len(beta))
    contrast[c], contrast[b] = 1.0, -1.0
    return float(beta[c] - beta[b]), s * math.sqrt(float(contrast @ cov @ contrast)), s


def _profile(d: Design, c: int, b: int, s: float, df: int) -> tuple[float, float, float]:
    """(delta_hat, lo, hi) of mu_c - mu_b by the profile deviance at sigma = s, cut at
    t_{0.975, df}^2."""
    x, zero = d.full_matrix, np.zeros(d.n)
    beta, top = _Tobit(d, x, s, zero).maximize(_start(d, x, zero))
    d_hat = float(beta[c] - beta[b])
    merged = d.matrix((c, b))
    in_c = (d.j == c).astype(float)
    start = [np.delete(beta, c)]

    def dev(delta: float) -> float:
        start[0], f = _Tobit(d, merged, s, delta * in_c).maximize(start[0])
        return 2 * (top - f)

    lo, hi = profile_interval(dev, d_hat, t975(df) ** 2, s, tol=1e-7)
    return d_hat, lo, hi


def _contrast(d: Design, c: str, b: str, method: str) -> Estimate:
    """The relative token cost of ``c`` against ``b`` in the two-way model of design ``d``."""
    if d.df < 1:
        return NONE
    ci, bi = d.configs.index(c), d.configs.index(b)
    censored = not d.reached.all()
    kind = "censored" if censored else "observed"
    if not censored:
        delta, se, s = _least_squares(d, ci, bi)
        if not s > 0:
            return Estimate(_cost(delta), math.nan, math.nan, kind, 0.0, d.df, method)
        half = t975(d.df) * se
        return Estimate(
            _cost(delta), _cost(delta - half), _cost(delta + half), kind, s, d.df, method
        )
    sigma = d.sigma
    df = int(d.reached.sum()) - (d.n - d.df)  # the reached runs' residual degrees of freedom
    if df < 1:
        return NONE  # too few reached runs for the seed effects: the unpaired estimate instead
    if not sigma > 0:
        return Estimate(math.nan, math.nan, math.nan, kind, sigma, df, method)
    s = sigma * math.sqrt(int(d.reached.sum()) / df)
    delta, lo, hi = _profile(d, ci, bi, s, df)
    return Estimate(_cost(delta), _cost(lo), _cost(hi), kind, s, df, method)


def _cost(log_ratio: float) -> float:
    """exp(x) - 1, +inf past what a float holds (an interval end that far says only "unbounded")."""
    return math.expm1(log_ratio) if log_ratio < 700 else math.inf


def heterogeneity_p(d: Design) -> float:
    """Bartlett's test that the configurations' residual variances are equal, on the reached
    runs' residuals of the pooled least-squares fit (each configuration's degrees of freedom its
    share of the residual ones, by leverage); NaN where it cannot be computed."""
    ok = d.reached
    x = d.full_matrix[ok]
    y, j = d.y[ok], d.j[ok]
    df = len(y) - np.linalg.matrix_rank(x)
    if df < 2:
        return math.nan
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    lev = np.einsum("ij,ji->i", x, np.linalg.pinv(x.T @ x) @ x.T)
    dfs = np.array([float((1 - lev[j == k]).sum()) for k in range(len(d.configs))])
    ss = np.array([float((resid[j == k] ** 2).sum()) for k in range(len(d.configs))])
    keep = dfs > 0.5
    if keep.sum() < 2 or not (ss[keep] > 0).all():
        return math.nan
    dfs, ss = dfs[keep], ss[keep]
    total = float(dfs.sum())
    pooled = float(ss.sum()) / total
    stat = total * math.log(pooled) - float((dfs * np.log(ss / dfs)).sum())
    corr = 1 + (float((1 / dfs).sum()) - 1 / total) / (3 * (len(dfs) - 1))
    return chi2_sf(stat / corr, len(dfs) - 1)


def matched(cfg: Seeds, base: Seeds) -> int:
    """How many seed numbers the configuration and the baseline share."""
    return len(set(cfg.ids) & set(base.ids))


def paired_costs(
    groups: Mapping[str, Seeds],
    baseline: str,
    offsets: Mapping[str, Sequence[float] | None] | None = None,
) -> dict[str, Estimate]:
    """Every configuration's relative token cost against ``baseline`` (module docstring); the
    baseline itself is left out. ``groups``: each configuration's seeds with their ids (the
    runs that stalled already removed); ``offsets``: per configuration, what
    ``censored.relative_cost`` takes for its lower bound when none of its seeds reached."""
    offsets = offsets or {}
    base = groups[baseline]
    full = Design.of(groups)
    p = heterogeneity_p(full) if len(full.configs) > 2 else math.nan
    pooled = not p < HETEROGENEITY_P
    out = {}
    for name, seeds in groups.items():
        if name == baseline:
            continue
        unpaired = _unpaired(seeds, base, offsets.get(name))
        if not seeds.reached or not base.reached or matched(seeds, base) < MIN_MATCHED:
            out[name] = unpaired
            continue
        d = full if pooled else Design.of({baseline: base, name: seeds})
        if name not in d.configs or baseline not in d.configs:
            out[name] = unpaired
            continue
        est = _contrast(d, name, baseline, "paired" if pooled else "paired-own")
        out[name] = est if est.kind != "none" else unpaired
    return out


def _unpaired(cfg: Seeds, base: Seeds, offsets: Sequence[float] | None = None) -> Estimate:
    e = relative_cost(cfg, base, offsets)
    return Estimate(e.value, e.lo, e.hi, e.kind, e.sigma, e.df, "unpaired")
