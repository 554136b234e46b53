"""Hand-built studies for the report tests: every curve is written out, so every answer is known.

``study(runs)`` takes ``{key: dict(config=..., seed=..., ppl=[...], steps=[...], **cell fields)}`` and
returns ``(cells, evals)`` following the contract in ``ablate.report.metrics``. Tokens are
``step * 1000`` unless a run gives ``tokens``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

TOKENS_PER_STEP = 1000


def _cell(key: str, spec: dict[str, Any]) -> dict[str, Any]:
    config = spec["config"]
    return {
        "key": key,
        "label": f"{config}/seed{spec.get('seed', 0)}",
        "config": config,
        "seed": spec.get("seed", 0),
        "status": spec.get("status", "finished"),
        "diverged_at": spec.get("diverged_at", math.nan),
        "baseline": spec.get("baseline", False),
        "fp4_gemms": spec.get("fp4_gemms", ""),
        "intervention": spec.get("intervention", "none"),
        "fp4_format": spec.get("fp4_format", "mxfp4"),
        "base_format": spec.get("base_format", "fp8"),
        "backend": spec.get("backend", "emulated"),
        "tokens_per_step": TOKENS_PER_STEP,
        "tokens_per_s": spec.get("tokens_per_s", math.nan),
        "schedule_steps": spec.get("schedule_steps", math.nan),
    }


def build_study(runs: dict[str, dict[str, Any]]) -> tuple[Any, Any]:
    cells = pd.DataFrame([_cell(k, v) for k, v in runs.items()])
    rows = []
    for key, spec in runs.items():
        ppl = spec.get("ppl", [])
        steps = spec.get("steps", [100 * (i + 1) for i in range(len(ppl))])
        tokens = spec.get("tokens", [s * TOKENS_PER_STEP for s in steps])
        for s, t, p in zip(steps, tokens, ppl, strict=True):
            rows.append(
                {"key": key, "step": s, "tokens": float(t), "val_loss": math.log(p) if p > 0 else p}
            )
    evals = pd.DataFrame(rows, columns=["key", "step", "tokens", "val_loss"])
    return cells, evals


@pytest.fixture
def study():
    return build_study
