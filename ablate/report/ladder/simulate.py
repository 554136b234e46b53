"""Synthetic ladders drawn from a known law, to prove by simulation that the ladder's intervals
hold (the suite's tests and ``python -m ablate.bench.ladder``), and to say before a ladder runs how
wide its design is expected to leave them (``expected_width``, for ``ablate plan``).

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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ablate.report.ladder.law import COLUMNS, Law, check_frame, fit_law
from ablate.report.ladder.predict import fit_ladder

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


def sloped_truth(
    law: Law,
    ratios: dict[str, tuple[float, float]],
    sizes: tuple[float, float],
    name: str = "sloped",
) -> Truth:
    """Configurations whose penalty changes with size, in Quartet's form: each at (N, D effD(N))
    of ``law`` with effD(N) a power in N, its token ratio going from ``ratios[c][0]`` at
    ``sizes[0]`` to ``ratios[c][1]`` at ``sizes[1]`` (the same at every budget)."""

    def cfg(r0: float, r1: float) -> LossFn:
        k = math.log(r0 / r1) / math.log(sizes[1] / sizes[0])
        return lambda n, d: law.loss(n, d, 1.0, (n / sizes[0]) ** k / r0)

    return Truth(name, lambda n, d: law.loss(n, d), {c: cfg(*r) for c, r in ratios.items()})


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
    """One ladder's tidy frame (``ablate.report.ladder.law.COLUMNS``) whose every size trains the
    same ``tokens_per_param``; the baseline is named "baseline"."""
    budgets = {n: tuple(m * n for m in tokens_per_param) for n in sizes}
    return draw_design(
        truth, budgets, seeds, sigma_run=sigma_run, sigma_eval=sigma_eval, rho=rho, rng=rng
    )


def draw_design(
    truth: Truth,
    budgets: dict[float, tuple[float, ...]],
    seeds: int,
    *,
    sigma_run: float,
    sigma_eval: float,
    rho: float = 0.5,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """One ladder's tidy frame of any design: ``budgets`` gives each size N its tokens D."""
    rows = []
    for n, tokens in budgets.items():
        for s in range(seeds):
            z_base = rng.normal(0, sigma_run)
            for cfg, fn in (("baseline", truth.baseline), *truth.configs.items()):
                z = z_base
                if cfg != "baseline":
                    z = rho * z_base + math.sqrt(1 - rho**2) * rng.normal(0, sigma_run)
                for d in tokens:
                    loss = float(fn(np.float64(n), np.float64(d))) * math.exp(
                        z + rng.normal(0, sigma_eval)
                    )
                    rows.append((cfg, n, d, s, loss))
    return pd.DataFrame(rows, columns=list(COLUMNS))


MAX_POINTS_BYTES = 64 * 2**20
"""The largest ``ladder_points.csv`` read: a row per run and budget is a few dozen bytes."""


def measured(points: str | Path, baseline: str) -> tuple[Law, float] | None:
    """The baseline's law and the run-to-run spread of log loss (pooled over every configuration,
    size and budget with two seeds or more) of a ladder report's ``ladder_points.csv``; None when
    no rung has two seeds. ValueError (or OSError) when the file is damaged, too large to be a
    ladder's points (``MAX_POINTS_BYTES``) or has no evaluations of ``baseline``."""
    size = Path(points).stat().st_size
    if size > MAX_POINTS_BYTES:
        raise ValueError(f"{size:,} bytes, more than a ladder's points ({MAX_POINTS_BYTES:,})")
    f = check_frame(pd.read_csv(points))
    spread = f.groupby(["config", "params", "tokens"])["val_loss"].agg(
        lambda v: float(np.std(np.log(v), ddof=1)) if len(v) > 1 else np.nan
    )
    if not spread.notna().any():
        return None
    return fit_law(f, baseline), float(np.sqrt(np.nanmean(spread.to_numpy(float) ** 2)))


def expected_width(
    law: Law,
    budgets: dict[float, tuple[float, ...]],
    seeds: int,
    target: tuple[float, float],
    noise: float,
    *,
    ladders: int = 16,
    boot: int = 100,
    eff_d: float = 0.8,
) -> tuple[float, float]:
    """What a ladder of this design is expected to say at ``target``: the median over
    ``ladders`` synthetic ladders (``law``, a configuration at ``eff_d``, a run-to-run spread
    ``noise`` in loss and a third of it per evaluation) of its 95% interval's width (hi / lo),
    and the share of them whose interval held the truth."""
    truth = quartet_truth(law, {"config": (1.0, eff_d)})
    widths, held = [], []
    for i in range(ladders):
        f = draw_design(
            truth, budgets, seeds, sigma_run=noise, sigma_eval=noise / 3,
            rng=np.random.default_rng(i),
        )  # fmt: skip
        fit = fit_ladder(f, "baseline", boot=boot, seed=i, scored=False)
        _, lo, hi = fit.interval("config", *target)
        widths.append(math.log(hi / lo) if lo > 0 else math.inf)
        held.append(lo <= 1 / eff_d <= hi)
    return math.exp(float(np.median(widths))), float(np.mean(held))
