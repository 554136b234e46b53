"""The model-free reading of a ladder: a configuration's token ratio measured at each rung, and
its trend in N.

``pair_ratios``: per configuration, size N and seed, the tokens the configuration needed to reach
the baseline's loss at a reference budget of that size, over that budget, read off the
configuration's own budgets (log-log interpolation of its curve, paired with the baseline's run
of the same seed). Where the configuration's budgets never got down to that loss the ratio is
right-censored (``side`` "at least": it is at least its largest budget over the reference); where
its smallest budget already beat it, left-censored ("at most"). Censored pairs are kept.

``trend``: log ratio against log N by maximum likelihood with censoring (a Tobit regression),
its slope and standard error (does the cost change with scale?), and the line carried to a
target N with a 95% interval (Student's t with n - 2 degrees of freedom, from the observed
information).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ablate.report.ladder.law import check_frame
from ablate.report.stats import t975

PAIR_COLUMNS = ("config", "params", "seed", "ref_tokens", "ratio", "side")
SIGMA_FLOOR = 0.01
"""The least spread the trend assumes of a measured log ratio: read between budgets, a ratio errs
by up to about 1% even without seed noise (a straight line between two budgets 2x apart on
Chinchilla's law), so a line through pairs that agree exactly is not exact."""


def reference_tokens(budgets: np.ndarray, params: float, tokens_per_param: float | None) -> float:
    """The budget of a size whose tokens per parameter is nearest ``tokens_per_param`` (in log);
    the largest without one."""
    b = np.sort(np.asarray(budgets, dtype=float))
    if tokens_per_param is None:
        return float(b[-1])
    return float(b[np.argmin(np.abs(np.log(b / params) - math.log(tokens_per_param)))])


def tokens_to_loss(tokens: np.ndarray, losses: np.ndarray, target: float) -> tuple[float, str]:
    """The tokens at which a run's curve over its budgets first reaches ``target``, and "" ; or
    the bound and its side ("at least" the largest budget when it never does, "at most" the
    smallest when its first budget already did). Between budgets the curve is read in log-log
    through the two budgets around the crossing and a third beside them (a parabola: a loss curve
    bends, and a straight line between budgets 2x apart errs by about 1%, by an amount that
    drifts with N), or straight where there are only two."""
    need, side = tokens_to_loss_many(tokens, np.asarray(losses, float)[None], np.array([target]))
    return float(need[0]), SIDES[int(side[0])]


SIDES = {0: "", 1: "at least", -1: "at most"}
"""``tokens_to_loss_many``'s sides: 0 measured, 1 at least, -1 at most."""


def tokens_to_loss_many(
    tokens: np.ndarray, losses: np.ndarray, targets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``tokens_to_loss`` for K curves over the same budgets at once: ``losses`` (K, B),
    ``targets`` (K,) -> (tokens (K,), side (K,): 0 measured, 1 at least, -1 at most)."""
    order = np.argsort(tokens)
    raw = np.asarray(tokens, float)[order]
    d = np.log(raw)
    y = np.log(np.asarray(losses, float)[:, order])
    t = np.log(np.asarray(targets, float))
    k, b = y.shape
    below = y <= t[:, None]
    first = np.where(below.any(axis=1), below.argmax(axis=1), b)  # first budget at or below
    side = np.where(first == 0, -1, np.where(first == b, 1, 0))
    need = np.where(first == 0, raw[0], raw[-1]).astype(float)
    rows = np.flatnonzero(side == 0)
    if rows.size:
        i = first[rows]
        y0, y1 = y[rows, i - 1], y[rows, i]
        straight = d[i - 1] + (y0 - t[rows]) / (y0 - y1) * (d[i] - d[i - 1])
        at = straight
        if b >= 3:  # the parabola through i-1, i and a neighbour
            lo = np.where(i + 1 < b, i - 1, i - 2)
            x = np.stack([d[lo], d[lo + 1], d[lo + 2]], axis=1)
            v = np.stack([y[rows, lo], y[rows, lo + 1], y[rows, lo + 2]], axis=1)
            s01 = (v[:, 1] - v[:, 0]) / (x[:, 1] - x[:, 0])
            s12 = (v[:, 2] - v[:, 1]) / (x[:, 2] - x[:, 1])
            a2 = (s12 - s01) / (x[:, 2] - x[:, 0])
            a1 = s01 - a2 * (x[:, 0] + x[:, 1])
            a0 = v[:, 0] - a2 * x[:, 0] ** 2 - a1 * x[:, 0] - t[rows]
            disc = a1**2 - 4 * a2 * a0
            with np.errstate(invalid="ignore", divide="ignore"):
                r1 = (-a1 + np.sqrt(disc)) / (2 * a2)
                r2 = (-a1 - np.sqrt(disc)) / (2 * a2)
            left, right = d[i - 1], d[i]
            in1 = np.isfinite(r1) & (r1 >= left) & (r1 <= right)
            in2 = np.isfinite(r2) & (r2 >= left) & (r2 <= right)
            at = np.where(in1 ^ in2, np.where(in1, r1, r2), straight)
        need[rows] = np.exp(at)
    return need, side


def pair_ratios(
    frame: pd.DataFrame, baseline: str, *, tokens_per_param: float | None = None
) -> pd.DataFrame:
    """The model-free ratio of every (configuration, size, seed) paired with the baseline's run of
    that size and seed (columns ``PAIR_COLUMNS``; ``side`` "" for a measured ratio, else the side
    of the bound it is)."""
    f = check_frame(frame)
    out = []
    for (cfg, n), runs in f[f["config"] != baseline].groupby(["config", "params"]):
        base = f[(f["config"] == baseline) & (f["params"] == n)]
        if base.empty:
            continue
        ref = reference_tokens(base["tokens"].unique(), float(n), tokens_per_param)
        for seed, run in runs.groupby("seed"):
            b = base[(base["seed"] == seed) & (base["tokens"] == ref)]
            if b.empty:
                continue
            need, side = tokens_to_loss(
                run["tokens"].to_numpy(float),
                run["val_loss"].to_numpy(float),
                float(b["val_loss"].mean()),
            )
            out.append((cfg, float(n), seed, ref, need / ref, side))
    return pd.DataFrame(out, columns=list(PAIR_COLUMNS))


@dataclass(frozen=True)
class Trend:
    """log ratio = intercept + slope * log N (censored pairs by their likelihood)."""

    intercept: float
    slope: float
    slope_se: float
    sigma: float
    cov: np.ndarray
    n: int
    censored: int
    x_mean: float
    sizes: int
    """The sizes the pairs come from: the line's degrees of freedom are sizes - 2 (the seeds of
    one size share what the line misses at that size)."""

    def predict(self, params: float) -> tuple[float, float, float]:
        """The ratio the line gives at ``params`` and its 95% interval."""
        x = math.log(params)
        mu = self.intercept + self.slope * x
        g = np.array([1.0, x])
        se = math.sqrt(max(float(g @ self.cov @ g), 0.0))
        h = t975(max(self.sizes - 2, 1)) * se
        return _exp(mu), _exp(mu - h), _exp(mu + h)

    @property
    def changes(self) -> bool:
        """Whether the slope's 95% interval excludes zero."""
        return abs(self.slope) > t975(max(self.sizes - 2, 1)) * self.slope_se


def _exp(x: float) -> float:
    """exp, inf beyond a float's range (a line of one degree of freedom carried far)."""
    return math.exp(x) if x < 700 else math.inf


_erfc = np.vectorize(math.erfc, otypes=[float])


def _log_normal_sf(z: np.ndarray) -> np.ndarray:
    """log P(Z > z) for a standard normal Z."""
    return np.log(np.maximum(0.5 * _erfc(z / math.sqrt(2)), 1e-300))


def _nll(theta: np.ndarray, x: np.ndarray, y: np.ndarray, side: np.ndarray) -> float:
    """The censored normal regression's negative log likelihood at (a, b, log sigma), x centred."""
    a, b, log_s = theta
    log_s = min(max(log_s, -20.0), 20.0)  # a line through every point: sigma toward 0
    z = (y - a - b * x) / math.exp(log_s)
    ll = np.where(side == "", -0.5 * z**2 - log_s, 0.0)
    ll = ll + np.where(side == "at least", _log_normal_sf(z), 0.0)
    ll = ll + np.where(side == "at most", _log_normal_sf(-z), 0.0)
    return float(-ll.sum())


def _hessian(fn: Callable[[np.ndarray], float], t: np.ndarray, h: float = 1e-4) -> np.ndarray:
    n = len(t)
    e = np.eye(n) * h
    out = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = (
                fn(t + e[i] + e[j])
                - fn(t + e[i] - e[j])
                - fn(t - e[i] + e[j])
                + fn(t - e[i] - e[j])
            ) / (4 * h * h)
    return out


def _minimize(fn: Callable[[np.ndarray], float], t: np.ndarray, iters: int = 100) -> np.ndarray:
    """Damped Newton with finite-difference derivatives and backtracking (a few parameters)."""
    v = fn(t)
    for _ in range(iters):
        g = np.array([(fn(t + e) - fn(t - e)) / 2e-5 for e in np.eye(len(t)) * 1e-5])
        try:
            step = -np.linalg.solve(_hessian(fn, t) + 1e-9 * np.eye(len(t)), g)
        except np.linalg.LinAlgError:
            step = -g
        if not np.all(np.isfinite(step)) or g @ step >= 0:
            step = -g
        for _ in range(40):
            v_new = fn(t + step)
            if v_new < v:
                break
            step = step / 2
        else:
            return t
        t = t + step
        if v - v_new < 1e-12 * max(abs(v), 1.0):
            return t
        v = v_new
    return t


def fit_trend(pairs: pd.DataFrame, config: str) -> Trend | None:
    """The censored regression of ``config``'s log ratios on log N; None with fewer than two
    sizes or fewer than three pairs, or when every pair is censored."""
    r = pairs[pairs["config"] == config]
    if r["params"].nunique() < 2 or len(r) < 3 or (r["side"] != "").all():
        return None
    x = np.log(r["params"].to_numpy(float))
    y = np.log(r["ratio"].to_numpy(float))
    side = r["side"].to_numpy(str)
    xm = float(x.mean())
    exact = side == ""
    if exact.sum() >= 2 and np.ptp(x[exact]) > 0:
        b0, a0 = np.polyfit(x[exact] - xm, y[exact], 1)
    else:
        b0, a0 = 0.0, float(y.mean())
    s0 = max(float(np.std(y[exact])) if exact.sum() > 1 else 0.1, 1e-3)

    def nll(theta: np.ndarray) -> float:
        return _nll(theta, x - xm, y, side)

    t = _minimize(nll, np.array([a0, b0, math.log(s0)]))
    # the residual spread by its unbiased estimate (n - 2 degrees of freedom), not the MLE's
    n = len(r)
    ml_s = math.exp(min(max(float(t[2]), -20.0), 20.0))
    s = max(ml_s * math.sqrt(n / max(n - 2, 1)), SIGMA_FLOOR)
    hess = _hessian(nll, t)[:2, :2]
    try:
        cov_c = np.linalg.inv(hess) * (s / ml_s) ** 2
    except np.linalg.LinAlgError:
        cov_c = np.full((2, 2), np.inf)
    # back from the centred intercept: a = a_c - b * xm
    j = np.array([[1.0, -xm], [0.0, 1.0]])
    cov = j @ cov_c @ j.T
    a_c, b = float(t[0]), float(t[1])
    return Trend(
        intercept=a_c - b * xm,
        slope=b,
        slope_se=math.sqrt(max(cov_c[1, 1], 0.0)),
        sigma=s,
        cov=cov,
        n=n,
        censored=int((side != "").sum()),
        x_mean=xm,
        sizes=int(r["params"].nunique()),
    )
