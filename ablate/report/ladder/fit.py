"""A ladder's fits on one design of observations: Quartet's law on the baseline and, under it, two
models of each configuration's penalty, for K copies of the data at once (the point fit and its
bootstrap replicates: ``ablate.report.ladder.predict``).

- ``quartet``: the penalty Quartet assumes, constant in N: the configuration's loss is the law's at
  (N effN, D effD).
- ``sloped``: a penalty that may change with size: the law's at (N effN, D effD (N / N0)^k), a data
  efficiency that is a power in N (k = 0 is Quartet's). N0 is the geometric mean of the fitted
  sizes, so effD is the efficiency in the ladder's middle and k what carries it to the target.

Both are fitted on every rung and budget, and each configuration's observation is read against the
baseline's run of the same size, seed and budget: its log loss less that baseline run's residual
from the law. What the law misses at a size (its shape, the seed's shared luck) is then common to
the configuration and the baseline and drops out of the penalty, as a size random effect would,
instead of being read as an efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ablate.report.ladder.law import (
    Law,
    check_frame,
    fit_efficiencies,
    fit_laws,
    laws_from_x,
    token_ratios,
)

MODELS = ("quartet", "sloped")
"""The penalty's models, in the order of ``Fit.eff``'s entries."""
_LAW_FIELDS = ("a", "alpha", "b", "beta", "gamma", "e")


@dataclass
class Design:
    """The ladder's observations in one order: group 0 is the baseline, then the configurations."""

    groups: list[str]
    group: np.ndarray  # (M,) group index of each observation
    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    seed: np.ndarray
    partner: np.ndarray
    """(M,) the baseline observation of the same size, seed and budget (-1: a baseline
    observation, or a configuration's without one)."""
    units: dict[tuple[float, object], dict[int, np.ndarray]] = field(default_factory=dict)
    """(size, seed) -> group -> the indices of that run's observations, by budget."""


def design(frame: pd.DataFrame, baseline: str) -> Design:
    """``frame``'s observations against ``baseline``; ValueError when it has none."""
    f = check_frame(frame)
    if baseline not in set(f["config"]):
        raise ValueError(f"ladder: the baseline {baseline!r} has no evaluations")
    groups = [baseline, *sorted(c for c in f["config"].unique() if c != baseline)]
    f = f.assign(_g=f["config"].map({g: i for i, g in enumerate(groups)}))
    f = f.sort_values(["_g", "params", "seed", "tokens"]).reset_index(drop=True)
    keys = list(zip(f["params"].astype(float), f["seed"], f["tokens"].astype(float), strict=True))
    base = {k: i for i, (g, k) in enumerate(zip(f["_g"], keys, strict=True)) if g == 0}
    partner = [-1 if g == 0 else base.get(k, -1) for g, k in zip(f["_g"], keys, strict=True)]
    d = Design(
        groups=groups,
        group=f["_g"].to_numpy(int),
        params=f["params"].to_numpy(float),
        tokens=f["tokens"].to_numpy(float),
        loss=f["val_loss"].to_numpy(float),
        seed=f["seed"].to_numpy(object),
        partner=np.asarray(partner, dtype=int),
    )
    for (g, n, s), idx in f.groupby(["_g", "params", "seed"]).groups.items():
        d.units.setdefault((float(n), s), {})[int(g)] = np.asarray(idx, dtype=int)
    return d


def _cols(law: Law) -> Law:
    return Law(*(np.asarray(getattr(law, f))[:, None] for f in _LAW_FIELDS))


@dataclass
class Fit:
    """K fits: the law (K, 6 unbounded) and, per configuration's group, each model's efficiencies:
    ``eff[model][g]`` is (K, 2) for ``quartet`` and (K, 3) (effN, effD, k) for ``sloped``."""

    law_x: np.ndarray
    eff: dict[str, dict[int, np.ndarray]]
    n0: float

    def _effs(self, model: str, g: int, params: np.ndarray | float) -> tuple[np.ndarray, ...]:
        """(effN, effD) of group ``g`` under ``model`` at ``params``, each (K, 1) or (K, M)."""
        e = self.eff[model][g]
        en, ed = e[:, :1], e[:, 1:2]
        if model == "sloped":
            ed = ed * (np.asarray(params, float) / self.n0) ** e[:, 2:3]
        return en, ed

    def log_fitted(self, d: Design, model: str = "sloped") -> np.ndarray:
        """log of the fitted loss of every observation under ``model`` (K, M)."""
        law = _cols(laws_from_x(self.law_x))
        out = np.empty((self.law_x.shape[0], len(d.loss)))
        for g in range(len(d.groups)):
            m = d.group == g
            en, ed = (1.0, 1.0) if g == 0 else self._effs(model, g, d.params[m])
            out[:, m] = np.log(law.loss(d.params[m], d.tokens[m], en, ed))
        return out

    def penalty(self, model: str, g: int, params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The model's log loss of group ``g`` over the baseline's at each (params, tokens) (K, M)."""
        law = _cols(laws_from_x(self.law_x))
        en, ed = self._effs(model, g, params)
        return np.log(law.loss(params, tokens, en, ed)) - np.log(law.loss(params, tokens))

    def ratios(self, model: str, g: int, params: float, tokens: float) -> np.ndarray:
        """The token ratio of group ``g`` at (``params``, ``tokens``) under ``model`` (K,)."""
        en, ed = self._effs(model, g, params)
        return token_ratios(laws_from_x(self.law_x), en[:, 0], ed[:, 0], params, tokens)


def penalty_observed(d: Design, log_y: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each of ``rows`` (configuration observations with a partner) as its log loss over its
    baseline partner's (K, len(rows))."""
    return log_y[:, rows] - log_y[:, d.partner[rows]]


def fit(d: Design, log_y: np.ndarray, train: np.ndarray, starts: np.ndarray, n0: float) -> Fit:
    """The law on the baseline's training observations and both models of every configuration's
    penalty, for each row of ``log_y`` (K, M) (see the module docstring)."""
    base = train & (d.group == 0)
    x, _ = fit_laws(d.params[base], d.tokens[base], np.exp(log_y[:, base]), 1.0, starts)
    law = laws_from_x(x)
    cols = _cols(law)
    # each configuration observation less its baseline partner's residual from the law
    y = log_y.copy()
    paired = (d.group > 0) & (d.partner >= 0)
    paired &= train & train[np.where(d.partner >= 0, d.partner, 0)]
    p = d.partner[paired]
    y[:, paired] -= log_y[:, p] - np.log(cols.loss(d.params[p], d.tokens[p]))
    eff: dict[str, dict[int, np.ndarray]] = {m: {} for m in MODELS}
    for g in range(1, len(d.groups)):
        m = train & (d.group == g)
        if m.any():
            obs = (d.params[m], d.tokens[m], np.exp(y[:, m]), 1.0)
            eff["quartet"][g] = fit_efficiencies(law, *obs)
            eff["sloped"][g] = fit_efficiencies(law, *obs, n0=n0)
    return Fit(x, eff, n0)


def middle(d: Design, train: np.ndarray) -> float:
    """N0: the geometric mean of the baseline's training sizes."""
    return float(math.exp(np.mean(np.log(np.unique(d.params[train & (d.group == 0)])))))
