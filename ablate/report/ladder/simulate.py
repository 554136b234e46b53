"""Synthetic ladders drawn from a known law, to prove by simulation that the ladder's intervals
hold (the suite's tests and ``python -m ablate.bench.ladder``).

A ladder is every (configuration, size, seed) run evaluated at each budget of its size. The noise
is a run's: a seed shifts the log loss of its whole run (``sigma_run``; budgets of one size branch
off one run, so they share it), the configuration's run of a seed shares a fraction ``rho`` of the
baseline's shift (same data order and initialization), and each evaluation adds its own
``sigma_eval``. ``true_ratio`` solves the truth for the tokens a configuration needs to reach the
baseline's loss, so any law can be the truth, Quartet's form or not (``TRUTHS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ablate.report.ladder.law import COLUMNS, Law

LossFn = Callable[[Any, Any], Any]
"""(N, D) -> loss."""

CHINCHILLA = Law(a=406.4, alpha=0.34, b=410.7, beta=0.28, gamma=1.0, e=1.69)
"""Hoffmann et al. (2022), approach 3."""


@dataclass(frozen=True)
class Truth:
    """A ladder's true losses: the baseline's and each configuration's, by name."""

    name: str
    baseline: LossFn
    configs: dict[str, LossFn]


def quartet_truth(law: Law, effs: dict[str, tuple[float, float]], name: str = "quartet") -> Truth:
    """Configurations at (N effN, D effD) of ``law``."""
    return Truth(
        name,
        lambda n, d: law.loss(n, d),
        {c: _scaled(law, en, ed) for c, (en, ed) in effs.items()},
    )


def _scaled(law: Law, eff_n: float, eff_d: float) -> LossFn:
    return lambda n, d: law.loss(n, d, eff_n, eff_d)


def additive_truth(name: str = "additive") -> Truth:
    """A law not of Quartet's form: the baseline with an interaction term, E + A/N^a + B/D^b +
    C/(N^(a/2) D^(b/2)); configurations pay an additive penalty: ``shrinking`` one that shrinks
    with N alone, ``chen`` one of Chen et al.'s (2025) form k D^gD / N^gN, whose token ratio grows
    with N (1.12 at 2M parameters and 20 tokens each, 1.21 at 600M) until, near 8B, no budget
    reaches the baseline's loss."""

    def base(n: np.ndarray, d: np.ndarray) -> np.ndarray:
        return 1.8 + 380 / n**0.32 + 420 / d**0.29 + 90 / (n**0.16 * d**0.145)

    return Truth(
        name,
        base,
        {
            "shrinking": lambda n, d: base(n, d) + 0.9 / n**0.18,
            "chen": lambda n, d: base(n, d) + 1.5 * d**0.05 / n**0.25,
        },
    )


def true_ratio(truth: Truth, config: str, params: float, tokens: float) -> float:
    """The tokens ``config`` needs to reach the baseline's loss at (params, tokens), over tokens:
    ``inf`` when it never does (solved by bisection in log D)."""
    goal = float(truth.baseline(np.float64(params), np.float64(tokens)))
    f = truth.configs[config]
    lo, hi = math.log(tokens) - 30, math.log(tokens) + 60
    if float(f(np.float64(params), np.float64(math.exp(hi)))) > goal:
        return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(f(np.float64(params), np.float64(math.exp(mid)))) > goal:
            lo = mid
        else:
            hi = mid
    return math.exp(hi) / tokens


def draw_ladder(
    truth: Truth,
    sizes: tuple[float, ...],
    tokens_per_param: tuple[float, ...],
    seeds: int,
    *,
    sigma_run: float,
    sigma_eval: float,
    rho: float = 0.5,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """One ladder's tidy frame (``ablate.report.ladder.law.COLUMNS``); the baseline is named
    "baseline"."""
    rows = []
    for n in sizes:
        for s in range(seeds):
            z_base = rng.normal(0, sigma_run)
            for cfg, fn in (("baseline", truth.baseline), *truth.configs.items()):
                z = z_base
                if cfg != "baseline":
                    z = rho * z_base + math.sqrt(1 - rho**2) * rng.normal(0, sigma_run)
                for m in tokens_per_param:
                    d = m * n
                    loss = float(fn(np.float64(n), np.float64(d))) * math.exp(
                        z + rng.normal(0, sigma_eval)
                    )
                    rows.append((cfg, n, d, s, loss))
    return pd.DataFrame(rows, columns=list(COLUMNS))
