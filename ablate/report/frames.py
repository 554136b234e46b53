"""The report's input rows for a study's cells (``ablate.report.inputs`` has the contract), from
what a cell's run recorded: the one place that turns a cell and its outcome into a ``cells`` row.
``report.study`` fills it from MLflow; ``results_frames`` from runs trained in this process
without a tracking store (``ablate.bench.gpu_check``). pandas only."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from ablate.report.provenance import PROVENANCE

if TYPE_CHECKING:
    from ablate.study import Cell
    from ablate.train import RunResult

STATUSES = {"finished", "diverged", "failed", "running", "interrupted", "pending"}


def cell_row(
    cell: Cell,
    *,
    status: str,
    diverged_at: float,
    tokens_per_s: float,
    env: Mapping[str, str],
) -> dict[str, Any]:
    """One ``cells`` row: the cell's labels and recipe axes, its run's status (an unknown one reads
    as running), divergence step, throughput and provenance (``PROVENANCE``, "" where unknown)."""
    c = cell
    return {
        "key": c.key,
        "label": c.label,
        "config": c.config_label,
        "seed": c.seed,
        "status": status if status in STATUSES else "running",
        "diverged_at": diverged_at,
        "baseline": c.baseline,
        "fp4_gemms": c.recipe_axes.get("fp4_gemms", ""),
        "intervention": c.recipe_axes.get("intervention", "none"),
        "fp4_format": c.recipe_axes.get("fp4_format", "mxfp4"),
        "base_format": c.recipe_axes.get("base_format", "bf16"),
        "phases": c.recipe_axes.get("phases", ""),
        "backend": c.config.backend,
        "tokens_per_step": c.config.train.tokens_per_step,
        # a baseline trained past the budget (baseline_extend)
        "schedule_steps": c.config.train.schedule_end if c.extra_steps else math.nan,
        "tokens_per_s": tokens_per_s,
        **{k: env.get(k, "") for k in PROVENANCE},
        **(_ladder(c) if c.rung else {}),
    }


def _ladder(cell: Cell) -> dict[str, Any]:
    """A ladder cell's rung, its configuration across rungs, and its (N, D) for the fits."""
    from ablate.model import non_embedding_params

    t = cell.config.train
    return {
        "rung": cell.rung,
        "ladder_config": cell.ladder_config,
        "params": float(non_embedding_params(cell.config.model)),
        "budget_tokens": float(t.schedule_end * t.tokens_per_step),
    }


def cells_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    cells = pd.DataFrame(list(rows))
    cells["baseline"] = cells["baseline"].astype(bool)
    return cells


def results_frames(
    results: Sequence[tuple[Cell, RunResult, Mapping[str, str]]],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, evals) of cells trained in this process: each with its ``RunResult`` and the
    provenance of its run (``ablate.train.provenance.environment``)."""
    rows, ev = [], []
    for cell, res, env in results:
        status = res.status if res.status in ("finished", "diverged") else "failed"
        diverged = float(res.diverged_at) if res.diverged_at is not None else math.nan
        rows.append(
            cell_row(
                cell, status=status, diverged_at=diverged, tokens_per_s=res.tokens_per_s, env=env
            )
        )
        ev += [(cell.key, e.step, float(e.tokens), e.val_loss) for e in res.evals]
    return cells_frame(rows), pd.DataFrame(ev, columns=["key", "step", "tokens", "val_loss"])
