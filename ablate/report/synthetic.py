"""Synthetic studies with known token costs, for the benchmark, the tests and trying the report out.

Every configuration follows the baseline's scaling curve stretched along the token axis by
``1 + cost``, so its true relative token cost is ``cost``:

    loss_base(t) = L_INF + A * (t / T_SCALE) ** -ALPHA
    loss_cfg(t)  = loss_base(t / ((1 + cost) * k_seed)) + eps        k_seed ~ 1 + N(0, seed_spread)

with a small evaluation noise ``eps`` ~ N(0, eval_noise). The configurations follow the MXFP4 paper's
story (FP8 baseline; Fprop, then Dgrad, then Wgrad in MXFP4; interventions on the full set).

For the simulation tests, ``seed_curves`` draws many studies' seeds at once on that model (a
seed's stretch k = r * exp(sigma * z): log-normal seed noise sigma on the tokens to any loss,
true relative token cost and equal-loss ratio r - 1 and r), ``stall_curves`` the same with some
seeds held on a plateau for a while (``ablate.report.stalls``), and ``crossings`` reads their
tokens to a target, as ``ablate.targets.tokens_to_target`` does, for all of them at once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

L_INF, A, ALPHA, T_SCALE = 1.0, 2.2, 0.3, 1e8

# (fp4_gemms, intervention, true relative token cost); the first is the FP8 baseline.
CONFIGS: list[tuple[str, str, float]] = [
    ("", "none", 0.0),
    ("fprop", "none", 0.02),
    ("fprop+dgrad", "none", 0.05),
    ("fprop+dgrad+wgrad", "none", 0.27),
    ("fprop+dgrad+wgrad", "sr", 0.25),
    ("fprop+dgrad+wgrad", "rht16", 0.24),
    ("fprop+dgrad+wgrad", "dht16", 0.085),
    ("fprop+dgrad+wgrad", "sr+rht16", 0.21),
    ("fprop+dgrad+wgrad", "fht16", 0.12),
    ("fprop+dgrad+wgrad", "dht64", 0.07),
]


def base_loss(tokens: np.ndarray) -> np.ndarray:
    """The baseline's noiseless validation loss at ``tokens``."""
    return L_INF + A * (np.maximum(tokens, 1.0) / T_SCALE) ** -ALPHA


def label(
    fp4_gemms: str, intervention: str, fp4_format: str = "mxfp4", base_format: str = "fp8"
) -> str:
    """The config label as the study names it, e.g. ``mxfp4[fprop,dgrad,wgrad]+dht16/fp8``."""
    if not fp4_gemms:
        return base_format
    extra = "" if intervention == "none" else f"+{intervention}"
    return f"{fp4_format}[{fp4_gemms.replace('+', ',')}]{extra}/{base_format}"


def synthetic_study(
    n_configs: int = 6,
    n_seeds: int = 3,
    n_evals: int = 200,
    *,
    tokens_per_step: int = 1 << 20,
    eval_every: int = 10,
    seed_spread: float = 0.02,
    eval_noise: float = 0.002,
    diverge: dict[tuple[int, int], float] | None = None,
    baseline_extend: float = 0.0,
    seed: int = 0,
) -> tuple[Any, Any, float]:
    """``(cells, evals, target_ppl)`` of a study following the input contract of ``metrics``.

    ``n_configs`` <= len(CONFIGS) of the configurations above, ``n_seeds`` seeds each, ``n_evals``
    evaluations per run every ``eval_every`` steps. ``diverge`` maps (config index, seed) to the
    fraction of training after which that run's loss becomes NaN. ``baseline_extend``: the
    baseline's seeds train on that fraction past the budget (more evaluations; ``schedule_steps``
    says where the budget ends). ``target_ppl`` is the baseline's noiseless perplexity at 75% of
    training: every config with cost < 1/3 reaches it.
    """
    if not 1 <= n_configs <= len(CONFIGS):
        raise ValueError(f"n_configs must be between 1 and {len(CONFIGS)}, got {n_configs}")
    rng = np.random.default_rng(seed)
    diverge = diverge or {}
    steps = np.arange(1, n_evals + 1) * eval_every
    tokens = steps.astype(float) * tokens_per_step
    cells, evals = [], []
    for c, (gemms, intervention, cost) in enumerate(CONFIGS[:n_configs]):
        config = label(gemms, intervention)
        n = round(n_evals * (1 + baseline_extend)) if c == 0 else n_evals
        run_steps = np.arange(1, n + 1) * eval_every
        run_tokens = run_steps.astype(float) * tokens_per_step
        for s in range(n_seeds):
            key = f"c{c:02d}s{s}"
            k = (1 + cost) * (1 + rng.normal(0, seed_spread))
            loss = base_loss(run_tokens / k) + rng.normal(0, eval_noise, n)
            status, diverged_at = "finished", math.nan
            if (c, s) in diverge:
                cut = int(diverge[(c, s)] * n_evals)
                loss[cut:] = np.nan
                status, diverged_at = "diverged", float(steps[cut]) if cut < n_evals else math.nan
            cells.append(
                {
                    "key": key,
                    "label": f"{config}/seed{s}",
                    "config": config,
                    "seed": s,
                    "status": status,
                    "diverged_at": diverged_at,
                    "baseline": c == 0,
                    "fp4_gemms": gemms,
                    "intervention": intervention,
                    "fp4_format": "mxfp4",
                    "base_format": "fp8",
                    "backend": "emulated",
                    "tokens_per_step": tokens_per_step,
                    "tokens_per_s": math.nan,
                    "schedule_steps": float(steps[-1]) if n > n_evals else math.nan,
                }
            )
            evals.append(
                pd.DataFrame(
                    {"key": key, "step": run_steps, "tokens": run_tokens, "val_loss": loss}
                )
            )
    target = float(np.exp(base_loss(np.array([0.75 * tokens[-1]]))[0]))
    return pd.DataFrame(cells), pd.concat(evals, ignore_index=True), target


def seed_curves(
    rng: np.random.Generator,
    stretch: np.ndarray,
    budget: float,
    *,
    evals: int = 40,
    noise: float = 0.002,
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (E,), ppl (..., E)): seeds stretched by ``stretch`` (any shape) along the token
    axis, evaluated every ``T_SCALE / evals`` tokens up to ``budget`` (so a budget of 1.5 *
    T_SCALE has 1.5 * evals evaluations, the first ``evals`` of them an ordinary run's), with
    evaluation noise ``noise`` in loss: ``stall_curves`` without a stall."""
    escape = np.zeros(np.shape(stretch))
    return stall_curves(rng, stretch, escape, budget, evals=evals, noise=noise)


def stall_curves(
    rng: np.random.Generator,
    stretch: np.ndarray,
    escape: np.ndarray,
    budget: float,
    *,
    plateau: float = 0.05,
    evals: int = 40,
    noise: float = 0.002,
) -> tuple[np.ndarray, np.ndarray]:
    """``seed_curves`` with stalls: a seed whose ``escape`` (same shape as ``stretch``, tokens) is
    positive sits on a plateau, the loss its curve had at ``plateau`` of ``T_SCALE`` (stretched),
    for ``escape`` tokens, then goes on as before, ``escape`` tokens late: its tokens to any loss
    below the plateau are k * t + escape. Zero escape: an ordinary seed."""
    every = T_SCALE / evals
    tokens = every * np.arange(1, int(round(budget / every)) + 1)
    k = np.asarray(stretch, dtype=float)[..., None]
    e = np.asarray(escape, dtype=float)[..., None]
    enter = plateau * T_SCALE * k
    own = np.where(tokens < enter, tokens, np.where(tokens < enter + e, enter, tokens - e))
    loss = base_loss(own / k) + noise * rng.standard_normal((*k.shape[:-1], len(tokens)))
    return tokens, np.exp(loss)


def crossings(tokens: np.ndarray, ppl: np.ndarray, target: Any) -> np.ndarray:
    """Tokens to ``target`` (broadcast against ppl's leading axes) of each curve in ``ppl``
    (..., E) evaluated at ``tokens`` (E,): the first evaluation at or below it, interpolated
    linearly in log-perplexity from the one before (``tokens_to_target``); NaN where never."""
    target = np.asarray(target, dtype=float)[..., None]
    below = ppl <= target
    first = np.argmax(below, axis=-1)
    hit = below.any(axis=-1)
    prev = np.maximum(first - 1, 0)
    p0 = np.take_along_axis(ppl, prev[..., None], -1)[..., 0]
    p1 = np.take_along_axis(ppl, first[..., None], -1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):  # never-reached curves: NaN anyway
        frac = (np.log(p0) - np.log(target[..., 0])) / (np.log(p0) - np.log(p1))
        t = tokens[prev] + frac * (tokens[first] - tokens[prev])
    return np.where(hit, np.where(first == 0, tokens[first], t), np.nan)
