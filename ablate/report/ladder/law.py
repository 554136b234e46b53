"""Quartet's scaling law and a recipe's efficiencies under it: pure functions over a ladder's tidy
frame of evaluations.

The frame has one row per (run, budget), the columns ``COLUMNS``: ``config``, ``params`` (N, the
non-embedding parameter count), ``tokens`` (D, the tokens trained to that budget), ``seed`` and
``val_loss`` (at the end of that budget). Any ladder built by hand can be passed.

- ``fit_law``: L(N, D) = (A / N^alpha + B / D^beta)^gamma + E (Castro et al. 2025, "Quartet") on
  one configuration's evaluations (the baseline's), by Huber loss on log L from a grid of starts,
  every parameter inside its bounds (``BOUNDS``, through a smooth map).
- ``fit_efficiency``: with the law held fixed, a configuration's parameter efficiency effN and data
  efficiency effD: its loss is the law's at (N * effN, D * effD).
- ``token_ratio``: the tokens a configuration needs to reach the baseline's loss at (N, D), over D.
  A recipe that lowers only effD costs 1/effD - 1 more tokens at every scale; one that lowers effN
  cannot reach the baseline's loss once B / D^beta is small enough: the ratio is then ``inf``.

``fit_laws`` and ``fit_efficiencies`` are the same fits for K weighted copies of the data at once
(one per bootstrap replicate: ``ablate.report.ladder.predict``), with ``LawArrays`` of K laws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ablate.report.ladder.solver import solve, squash, unsquash

COLUMNS = ("config", "params", "tokens", "seed", "val_loss")
NAMES = ("log_a", "alpha", "log_b", "beta", "gamma", "log_e")
BOUNDS = {
    "log_a": (-10.0, 40.0),
    "alpha": (0.05, 1.5),
    "log_b": (-10.0, 40.0),
    "beta": (0.05, 1.5),
    "gamma": (0.25, 4.0),
    "log_e": (-8.0, 3.0),
}
"""The law's parameters and their bounds (A, B and E through their logarithms)."""
EFF_BOUNDS = (0.02, 4.0)
"""Bounds of effN and effD."""
DELTA = 1e-3
"""Huber's delta on log L (Quartet's and Chinchilla's choice)."""


@dataclass(frozen=True)
class Law:
    """L(N, D) = (A / N^alpha + B / D^beta)^gamma + E. The fields are floats, or arrays of K laws
    (``LawArrays``)."""

    a: Any
    alpha: Any
    b: Any
    beta: Any
    gamma: Any
    e: Any

    def loss(
        self, params: ArrayLike, tokens: ArrayLike, eff_n: ArrayLike = 1.0, eff_d: ArrayLike = 1.0
    ) -> np.ndarray:
        """The law's loss at ``params`` and ``tokens``, scaled by the efficiencies."""
        n = np.asarray(params, dtype=float) * eff_n
        d = np.asarray(tokens, dtype=float) * eff_d
        return (self.a / n**self.alpha + self.b / d**self.beta) ** self.gamma + self.e

    def take(self, i: int) -> Law:
        """Law ``i`` of arrays of laws."""
        return Law(*(float(np.asarray(getattr(self, f))[i]) for f in _FIELDS))


_FIELDS = ("a", "alpha", "b", "beta", "gamma", "e")
LawArrays = Law
"""A ``Law`` whose fields are arrays of shape (K,)."""


@dataclass(frozen=True)
class Efficiency:
    """A configuration's efficiencies under a fixed law."""

    config: str
    eff_n: float
    eff_d: float


def check_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the columns ``COLUMNS``, finite positive N, D and losses; ValueError naming
    what is missing or wrong."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"ladder frame: missing columns {missing}; needs {list(COLUMNS)}")
    for c in ("params", "tokens", "val_loss"):
        v = pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"ladder frame: column {c} must be finite and positive")
    return frame


def _law_of(x: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Parameters (K,) per name from the unbounded ``x`` (K, 6), and d parameter / d x."""
    vals, ders = {}, {}
    for i, name in enumerate(NAMES):
        vals[name], ders[name] = squash(x[:, i], *BOUNDS[name])
    return vals, ders


def _law_model(
    logn: np.ndarray, logd: np.ndarray
) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """log L and its Jacobian in the unbounded parameters, at the design (log N, log D) (M,)."""

    def model(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, dp = _law_of(x)
        u = np.exp(p["log_a"][:, None] - p["alpha"][:, None] * logn)  # A / N^alpha   (K, M)
        v = np.exp(p["log_b"][:, None] - p["beta"][:, None] * logd)  # B / D^beta    (K, M)
        s = u + v
        g = p["gamma"][:, None]
        pw = s**g
        e = np.exp(p["log_e"])[:, None]
        loss = pw + e
        common = g * pw / s / loss  # d log L / d s
        jac = np.stack(
            [
                common * u,
                common * u * -logn,
                common * v,
                common * v * -logd,
                pw * np.log(s) / loss,
                e / loss,
            ],
            axis=-1,
        )
        jac = jac * np.stack([dp[n] for n in NAMES], axis=-1)[:, None, :]
        return np.log(loss), jac

    return model


def start_grid(min_loss: float) -> np.ndarray:
    """The fit's starts, unbounded (S, 6): a grid over A, alpha, B and beta with gamma 1 and E
    half the lowest loss seen, and the same with gamma 0.5 and 2."""
    rows = []
    for log_a in (2.0, 6.0, 12.0):
        for alpha in (0.2, 0.45):
            for log_b in (2.0, 6.0, 12.0):
                for beta in (0.2, 0.45):
                    for gamma in (0.5, 1.0, 2.0):
                        e = max(min_loss * 0.5, 1e-3)
                        rows.append((log_a, alpha, log_b, beta, gamma, math.log(e)))
    return np.array(
        [[unsquash(v, *BOUNDS[n]) for n, v in zip(NAMES, r, strict=True)] for r in rows]
    )


def laws_from_x(x: np.ndarray) -> Law:
    """Laws (arrays of K) from unbounded parameters (K, 6)."""
    p, _ = _law_of(np.atleast_2d(x))
    return Law(
        a=np.exp(p["log_a"]),
        alpha=p["alpha"],
        b=np.exp(p["log_b"]),
        beta=p["beta"],
        gamma=p["gamma"],
        e=np.exp(p["log_e"]),
    )


def fit_laws(
    params: np.ndarray,
    tokens: np.ndarray,
    loss: np.ndarray,
    weights: ArrayLike,
    starts: np.ndarray,
    *,
    delta: float = DELTA,
) -> tuple[np.ndarray, np.ndarray]:
    """K fits of the law at once: observations ``params``, ``tokens`` (M,), ``loss`` and
    ``weights`` (K, M) (a bootstrap replicate's weights count how often each observation was
    drawn), each from every start of ``starts`` (S, 6) or (K, S, 6). Returns the best unbounded
    parameters (K, 6) and their Huber loss (K,)."""
    loss = np.atleast_2d(loss)
    weights = np.broadcast_to(np.atleast_2d(weights), loss.shape)
    k, m = loss.shape
    starts = np.broadcast_to(starts, (k, *starts.shape[-2:]))
    s = starts.shape[1]
    model = _law_model(np.log(params), np.log(tokens))
    y = np.repeat(np.log(loss), s, axis=0)
    w = np.repeat(weights, s, axis=0)
    x, obj = solve(model, starts.reshape(k * s, 6), y, w, delta=delta)
    obj = obj.reshape(k, s)
    best = np.argmin(np.where(np.isfinite(obj), obj, np.inf), axis=1)
    return x.reshape(k, s, 6)[np.arange(k), best], obj[np.arange(k), best]


def _rows(frame: pd.DataFrame, config: str) -> pd.DataFrame:
    rows = check_frame(frame)[frame["config"] == config]
    if rows.empty:
        raise ValueError(f"ladder: no evaluations of {config!r}")
    return rows


def fit_law(frame: pd.DataFrame, config: str, *, delta: float = DELTA) -> Law:
    """Quartet's law fitted on ``config``'s evaluations (Huber loss of log L with ``delta``; the
    best of ``start_grid``'s starts)."""
    rows = _rows(frame, config)
    if rows["params"].nunique() < 2 or rows["tokens"].nunique() < 2:
        raise ValueError(
            f"ladder: {config!r} needs at least two sizes and two budgets to fit a law "
            f"(has {rows['params'].nunique()} and {rows['tokens'].nunique()})"
        )
    y = rows["val_loss"].to_numpy(float)
    x, _ = fit_laws(
        rows["params"].to_numpy(float),
        rows["tokens"].to_numpy(float),
        y[None],
        np.ones((1, len(y))),
        start_grid(float(y.min())),
        delta=delta,
    )
    return laws_from_x(x).take(0)


EFF_STARTS = ((1.0, 1.0), (0.5, 1.0), (1.0, 0.5), (0.5, 0.5), (2.0, 2.0), (0.1, 1.0))
SLOPE_BOUNDS = (-1.0, 1.0)
"""Bounds of a sloped fit's k: effD times (N / N0)^k (``fit_efficiencies`` with ``n0``)."""


class _EffModel:
    """log L of laws (arrays of K) at (N effN, D effD) and its Jacobian in the unbounded
    efficiencies (K, 2); with ``slope``, at (N effN, D effD (N / N0)^k) and (K, 3), ``slope``
    being log(N / N0) of each observation."""

    def __init__(
        self,
        cols: dict[str, np.ndarray],
        logn: np.ndarray,
        logd: np.ndarray,
        slope: np.ndarray | None = None,
    ):
        self.cols, self.logn, self.logd, self.slope = cols, logn, logd, slope

    def subset(self, rows: np.ndarray) -> _EffModel:
        cols = {f: v[rows] for f, v in self.cols.items()}
        return _EffModel(cols, self.logn, self.logd, self.slope)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        col = self.cols
        en, den = squash(x[:, 0], *EFF_BOUNDS)
        ed, ded = squash(x[:, 1], *EFF_BOUNDS)
        logd = self.logd + np.log(ed)[:, None]
        if self.slope is not None:
            k, dk = squash(x[:, 2], *SLOPE_BOUNDS)
            logd = logd + k[:, None] * self.slope
        u = col["a"] * np.exp(-col["alpha"] * (self.logn + np.log(en)[:, None]))
        v = col["b"] * np.exp(-col["beta"] * logd)
        s = u + v
        pw = s ** col["gamma"]
        loss = pw + col["e"]
        common = col["gamma"] * pw / s / loss
        dv = common * v * -col["beta"]  # d log L / d log D
        parts = [common * u * -col["alpha"] * (den / en)[:, None], dv * (ded / ed)[:, None]]
        if self.slope is not None:
            parts.append(dv * self.slope * dk[:, None])
        return np.log(loss), np.stack(parts, axis=-1)


def fit_efficiencies(
    law: Law,
    params: np.ndarray,
    tokens: np.ndarray,
    loss: np.ndarray,
    weights: ArrayLike,
    *,
    delta: float = DELTA,
    n0: float | None = None,
) -> np.ndarray:
    """K fits of (effN, effD) at once, fit k under law k (``law``'s fields arrays of K, or one
    law for all): observations as ``fit_laws``'. Returns (K, 2). With ``n0``, the sloped fit: a
    data efficiency that is a power in N, effD (N / ``n0``)^k, and (K, 3) of (effN, effD, k)."""
    loss = np.atleast_2d(loss)
    weights = np.broadcast_to(np.atleast_2d(weights), loss.shape)
    k = loss.shape[0]
    s = len(EFF_STARTS)
    cols = {
        f: np.repeat(np.broadcast_to(np.asarray(getattr(law, f), float), (k,)), s)[:, None]
        for f in _FIELDS
    }
    logn = np.log(params)
    slope = None if n0 is None else logn - math.log(n0)
    model = _EffModel(cols, logn, np.log(tokens), slope)
    x0: list[list[float]] = [
        [float(unsquash(a, *EFF_BOUNDS)), float(unsquash(b, *EFF_BOUNDS))] for a, b in EFF_STARTS
    ]
    if slope is not None:
        x0 = [[*r, 0.0] for r in x0]  # k = 0: the middle of SLOPE_BOUNDS
    p = len(x0[0])
    x, obj = solve(
        model,
        np.tile(np.array(x0), (k, 1)),
        np.repeat(np.log(loss), s, axis=0),
        np.repeat(weights, s, axis=0),
        delta=delta,
    )
    obj = obj.reshape(k, s)
    best = np.argmin(np.where(np.isfinite(obj), obj, np.inf), axis=1)
    x = x.reshape(k, s, p)[np.arange(k), best]
    out = [squash(x[:, 0], *EFF_BOUNDS)[0], squash(x[:, 1], *EFF_BOUNDS)[0]]
    if slope is not None:
        out.append(squash(x[:, 2], *SLOPE_BOUNDS)[0])
    return np.stack(out, axis=1)


def fit_efficiency(
    frame: pd.DataFrame, law: Law, config: str, *, delta: float = DELTA
) -> Efficiency:
    """``config``'s effN and effD with ``law`` held fixed (Huber loss of log L, several starts)."""
    rows = _rows(frame, config)
    y = rows["val_loss"].to_numpy(float)
    eff = fit_efficiencies(
        law,
        rows["params"].to_numpy(float),
        rows["tokens"].to_numpy(float),
        y[None],
        np.ones((1, len(y))),
        delta=delta,
    )
    return Efficiency(config, float(eff[0, 0]), float(eff[0, 1]))


def token_ratios(
    law: Law, eff_n: ArrayLike, eff_d: ArrayLike, params: float, tokens: float
) -> np.ndarray:
    """``token_ratio`` for arrays of laws and efficiencies (elementwise)."""
    have = law.a / params**law.alpha + law.b / tokens**law.beta
    left = np.asarray(have - law.a / (params * np.asarray(eff_n)) ** law.alpha, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        need = (law.b / left) ** (1 / np.asarray(law.beta)) / np.asarray(eff_d)
    return np.where(left > 0, need / tokens, np.inf)


def token_ratio(law: Law, eff: Efficiency, params: float, tokens: float) -> float:
    """The tokens ``eff``'s configuration needs to reach the baseline's loss at (``params``,
    ``tokens``), over ``tokens``; ``inf`` when no budget reaches it (its effN leaves a loss floor
    above the baseline's)."""
    return float(token_ratios(law, eff.eff_n, eff.eff_d, params, tokens))
