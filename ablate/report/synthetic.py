"""Synthetic studies with known token costs, for the benchmark, the tests and trying the report out.

Every configuration follows the baseline's scaling curve stretched along the token axis by
``1 + cost``, so its true relative token cost is ``cost``:

    loss_base(t) = L_INF + A * (t / T_SCALE) ** -ALPHA
    loss_cfg(t)  = loss_base(t / ((1 + cost) * k_seed)) + eps        k_seed ~ 1 + N(0, seed_spread)

with a small evaluation noise ``eps`` ~ N(0, eval_noise). The configurations follow the MXFP4 paper's
story (FP8 baseline; Fprop, then Dgrad, then Wgrad in MXFP4; interventions on the full set).
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
    seed: int = 0,
) -> tuple[Any, Any, float]:
    """``(cells, evals, target_ppl)`` of a study following the input contract of ``metrics``.

    ``n_configs`` <= len(CONFIGS) of the configurations above, ``n_seeds`` seeds each, ``n_evals``
    evaluations per run every ``eval_every`` steps. ``diverge`` maps (config index, seed) to the
    fraction of training after which that run's loss becomes NaN. ``target_ppl`` is the baseline's
    noiseless perplexity at 75% of training: every config with cost < 1/3 reaches it.
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
        for s in range(n_seeds):
            key = f"c{c:02d}s{s}"
            k = (1 + cost) * (1 + rng.normal(0, seed_spread))
            loss = base_loss(tokens / k) + rng.normal(0, eval_noise, n_evals)
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
                }
            )
            evals.append(
                pd.DataFrame({"key": key, "step": steps, "tokens": tokens, "val_loss": loss})
            )
    target = float(np.exp(base_loss(np.array([0.75 * tokens[-1]]))[0]))
    return pd.DataFrame(cells), pd.concat(evals, ignore_index=True), target
