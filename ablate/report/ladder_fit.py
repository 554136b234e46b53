"""Scaling-ladder fits: what a recipe's token cost will be at a scale no one has run.

Pure functions over a tidy frame of evaluations, one row per (run, budget): the columns ``COLUMNS``
(``config``, ``params`` the non-embedding parameter count N, ``tokens`` the budget D trained,
``seed``, ``val_loss`` at the end of that budget). They can be called on any ladder built by hand.

- ``fit_law``: Quartet's law (Castro et al. 2025) on the baseline's evaluations,
  L(N, D) = (A / N^alpha + B / D^beta)^gamma + E, by Huber loss on log L from several starts
  (L-BFGS in float64, every parameter kept in its bounds by a smooth map).
- ``fit_efficiency``: with that law held fixed, a configuration's parameter efficiency effN and data
  efficiency effD: its loss is the law at (N * effN, D * effD).
- ``token_ratio``: the tokens a configuration needs to reach the baseline's loss at (N, D), over D.
  Under the law a recipe that lowers only effD costs 1/effD - 1 more tokens at every scale; one
  that lowers effN cannot reach the baseline's loss once B / D^beta is small enough, and then the
  ratio is ``inf`` (never a finite number).
- ``rung_ratios``: the model-free form, per configuration and rung N: the log token ratio at equal
  loss, the baseline's tokens to the configuration's final loss read off the baseline's own
  budgets at that N (log-log interpolation); ``trend`` fits it against log N.

Intervals for a prediction are not here yet: a bootstrap over seeds alone came out far too narrow
in a first simulated ladder (it does not carry the fit's trade-off between effN and effD), and an
interval is kept only once simulation shows that it covers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike

COLUMNS = ("config", "params", "tokens", "seed", "val_loss")
BOUNDS = {
    "alpha": (0.05, 1.5),
    "beta": (0.05, 1.5),
    "gamma": (0.25, 4.0),
    "log_a": (-10.0, 40.0),
    "log_b": (-10.0, 40.0),
    "log_e": (-8.0, 3.0),
}
"""The law's parameters and their bounds (A, B and E through their logarithms)."""
EFF_BOUNDS = (0.05, 4.0)


@dataclass(frozen=True)
class Law:
    """L(N, D) = (A / N^alpha + B / D^beta)^gamma + E."""

    a: float
    alpha: float
    b: float
    beta: float
    gamma: float
    e: float

    def loss(
        self, params: ArrayLike, tokens: ArrayLike, eff_n: float = 1.0, eff_d: float = 1.0
    ) -> np.ndarray:
        """The law's loss at ``params`` and ``tokens`` (numbers or arrays), scaled by the
        efficiencies."""
        n = np.asarray(params, dtype=float) * eff_n
        d = np.asarray(tokens, dtype=float) * eff_d
        return (self.a / n**self.alpha + self.b / d**self.beta) ** self.gamma + self.e


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
        v = frame[c].to_numpy(dtype=float)
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"ladder frame: column {c} must be finite and positive")
    return frame


def _squash(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.sigmoid(x)


def _unsquash(v: float, lo: float, hi: float) -> float:
    p = min(max((v - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _huber(r: torch.Tensor, delta: float) -> torch.Tensor:
    a = r.abs()
    return torch.where(a <= delta, 0.5 * r**2, delta * (a - 0.5 * delta)).sum()


def _minimize(
    loss_fn: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, steps: int = 200
) -> tuple[torch.Tensor, float]:
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [x], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe", tolerance_grad=1e-12
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        v = loss_fn(x)
        v.backward()
        return v

    opt.step(closure)
    with torch.no_grad():
        v = float(loss_fn(x))
    return x.detach(), v if math.isfinite(v) else math.inf


_NAMES = ("log_a", "alpha", "log_b", "beta", "gamma", "log_e")


def _law_of(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {n: _squash(x[i], *BOUNDS[n]) for i, n in enumerate(_NAMES)}


def _pred(p: dict[str, torch.Tensor], n: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    inner = torch.exp(p["log_a"] - p["alpha"] * torch.log(n)) + torch.exp(
        p["log_b"] - p["beta"] * torch.log(d)
    )
    return inner ** p["gamma"] + torch.exp(p["log_e"])


def fit_law(
    frame: pd.DataFrame, config: str, *, delta: float = 1e-3, starts: int = 24, seed: int = 0
) -> Law:
    """Quartet's law fitted on ``config``'s evaluations (Huber loss of log L with ``delta``; the best
    of ``starts`` L-BFGS runs from a fixed grid plus random starts drawn from ``seed``)."""
    rows = check_frame(frame)[frame["config"] == config]
    if rows["params"].nunique() < 2 or rows["tokens"].nunique() < 2:
        raise ValueError(
            f"ladder: {config!r} needs at least two sizes and two budgets to fit a law "
            f"(has {rows['params'].nunique()} and {rows['tokens'].nunique()})"
        )
    n = torch.tensor(rows["params"].to_numpy(float), dtype=torch.float64)
    d = torch.tensor(rows["tokens"].to_numpy(float), dtype=torch.float64)
    y = torch.log(torch.tensor(rows["val_loss"].to_numpy(float), dtype=torch.float64))

    def objective(x: torch.Tensor) -> torch.Tensor:
        return _huber(torch.log(_pred(_law_of(x), n, d)) - y, delta)

    gen = np.random.default_rng(seed)
    e0 = float(rows["val_loss"].min()) * 0.5
    best: tuple[float, torch.Tensor] | None = None
    for i in range(starts):
        guess = {
            "log_a": [2.0, 6.0, 10.0][i % 3],
            "alpha": [0.3, 0.5][(i // 3) % 2],
            "log_b": [2.0, 6.0, 10.0][(i // 6) % 3],
            "beta": [0.3, 0.5][(i // 18) % 2],
            "gamma": 1.0,
            "log_e": math.log(max(e0, 1e-3)),
        }
        if i >= 18:  # random starts beyond the grid
            guess = {k: float(gen.uniform(*BOUNDS[k])) for k in _NAMES}
        x0 = torch.tensor([_unsquash(guess[k], *BOUNDS[k]) for k in _NAMES], dtype=torch.float64)
        x, v = _minimize(objective, x0)
        if best is None or v < best[0]:
            best = (v, x)
    assert best is not None
    p = {k: float(t) for k, t in _law_of(best[1]).items()}
    return Law(
        a=math.exp(p["log_a"]),
        alpha=p["alpha"],
        b=math.exp(p["log_b"]),
        beta=p["beta"],
        gamma=p["gamma"],
        e=math.exp(p["log_e"]),
    )


def fit_efficiency(
    frame: pd.DataFrame, law: Law, config: str, *, delta: float = 1e-3
) -> Efficiency:
    """``config``'s effN and effD with ``law`` held fixed (Huber loss of log L, several starts)."""
    rows = check_frame(frame)[frame["config"] == config]
    if rows.empty:
        raise ValueError(f"ladder: no evaluations of {config!r}")
    n = torch.tensor(rows["params"].to_numpy(float), dtype=torch.float64)
    d = torch.tensor(rows["tokens"].to_numpy(float), dtype=torch.float64)
    y = torch.log(torch.tensor(rows["val_loss"].to_numpy(float), dtype=torch.float64))
    fixed = {
        "log_a": torch.tensor(math.log(law.a), dtype=torch.float64),
        "alpha": torch.tensor(law.alpha, dtype=torch.float64),
        "log_b": torch.tensor(math.log(law.b), dtype=torch.float64),
        "beta": torch.tensor(law.beta, dtype=torch.float64),
        "gamma": torch.tensor(law.gamma, dtype=torch.float64),
        "log_e": torch.tensor(math.log(law.e), dtype=torch.float64),
    }

    def objective(x: torch.Tensor) -> torch.Tensor:
        eff = _squash(x, *EFF_BOUNDS)
        return _huber(torch.log(_pred(fixed, n * eff[0], d * eff[1])) - y, delta)

    best: tuple[float, torch.Tensor] | None = None
    for en, ed in ((1.0, 1.0), (0.5, 1.0), (1.0, 0.5), (0.5, 0.5), (2.0, 2.0)):
        x0 = torch.tensor(
            [_unsquash(en, *EFF_BOUNDS), _unsquash(ed, *EFF_BOUNDS)], dtype=torch.float64
        )
        x, v = _minimize(objective, x0)
        if best is None or v < best[0]:
            best = (v, x)
    assert best is not None
    eff = _squash(best[1], *EFF_BOUNDS)
    return Efficiency(config, float(eff[0]), float(eff[1]))


def token_ratio(law: Law, eff: Efficiency, params: float, tokens: float) -> float:
    """The tokens ``eff``'s configuration needs to reach the baseline's loss at (``params``,
    ``tokens``), over ``tokens``; ``inf`` when no budget reaches it (its effN leaves a loss floor
    above the baseline's)."""
    have = law.a / params**law.alpha + law.b / tokens**law.beta
    left = have - law.a / (params * eff.eff_n) ** law.alpha
    if left <= 0:
        return math.inf
    need = (law.b / left) ** (1 / law.beta) / eff.eff_d
    return need / tokens


def rung_ratios(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Model-free: per configuration, rung N and seed, the configuration's largest budget D and the
    baseline's tokens to reach its loss there, read off the baseline's budgets at that N (log-log
    interpolation of its seed-mean curve); ``ratio`` = D / those tokens. ``censored``: the loss
    lies outside what the baseline's budgets at that N cover (the ratio is then a bound: ``ratio``
    holds the bound, ``side`` says which)."""
    f = check_frame(frame)
    out = []
    for (cfg, n, seed), runs in f[f["config"] != baseline].groupby(["config", "params", "seed"]):
        base = f[(f["config"] == baseline) & (f["params"] == n)]
        if base.empty:
            continue
        curve = base.groupby("tokens")["val_loss"].mean().sort_index()
        last = runs.loc[runs["tokens"].idxmax()]
        logd, logl = np.log(curve.index.to_numpy(float)), np.log(curve.to_numpy(float))
        target = math.log(float(last["val_loss"]))
        side = ""
        if target > logl.max():  # worse than the baseline's smallest budget: a cost above
            at, side = logd.min(), "at least"
        elif target < logl.min():  # better than its largest: a cost below
            at, side = logd.max(), "at most"
        else:
            order = np.argsort(logl)
            at = float(np.interp(target, logl[order], logd[order]))
        ratio = float(last["tokens"]) / math.exp(at)
        out.append(
            {
                "config": cfg,
                "params": n,
                "seed": seed,
                "tokens": float(last["tokens"]),
                "ratio": ratio,
                "censored": bool(side),
                "side": side,
            }
        )
    return pd.DataFrame(
        out, columns=["config", "params", "seed", "tokens", "ratio", "censored", "side"]
    )


def trend(ratios: pd.DataFrame, config: str) -> tuple[float, float]:
    """(slope, its standard error) of log ratio against log N for ``config``'s uncensored rungs:
    a cost that changes with scale has a slope away from 0."""
    r = ratios[(ratios["config"] == config) & ~ratios["censored"]]
    if r["params"].nunique() < 3:
        return math.nan, math.nan
    x, y = np.log(r["params"].to_numpy(float)), np.log(r["ratio"].to_numpy(float))
    xm = x - x.mean()
    slope = float((xm * (y - y.mean())).sum() / (xm**2).sum())
    resid = y - y.mean() - slope * xm
    se = math.sqrt(float((resid**2).sum()) / max(len(x) - 2, 1) / float((xm**2).sum()))
    return slope, se
