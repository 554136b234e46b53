"""The report's input rows for a study's cells (``ablate.report.inputs`` has the contract), from
what a cell's run recorded: the one place that turns a cell and its outcome into a ``cells`` row.
``report.study`` fills it from MLflow; ``results_frames`` from runs trained in this process
without a tracking store (``ablate.bench.gpu_check``). pandas only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from ablate.data.config import BATCH_FIELDS
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
    fingerprint: str = "",
) -> dict[str, Any]:
    """One ``cells`` row: the cell's labels and recipe axes, its run's status (an unknown one reads
    as running), divergence step, throughput and provenance (``PROVENANCE``, "" where unknown),
    its data configuration (``data_config``) and the ``data.fingerprint`` its run recorded ("":
    none)."""
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
        "data_config": data_config(c.config.data),
        "data_fingerprint": fingerprint,
        **(_ladder(c) if c.rung else {}),
    }


def data_config(data: Any) -> str:
    """A cell's data configuration as the fields that decide its tokens (those its
    ``data.fingerprint`` measures): each field set away from its default, and the corpus always
    (``data.corpus text, data.path corp/a.txt``); cells with the same text are meant to read the
    same tokens. ``BATCH_FIELDS`` are left out."""
    parts: list[str] = []

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name in BATCH_FIELDS:
                continue
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            elif f.name == "corpus" or value != f.default:
                parts.append(f"{prefix}{f.name} {value}")

    walk(data, "data.")
    return ", ".join(parts)


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
                cell,
                status=status,
                diverged_at=diverged,
                tokens_per_s=res.tokens_per_s,
                env=env,
                fingerprint=res.fingerprint,
            )
        )
        ev += [(cell.key, e.step, float(e.tokens), e.val_loss) for e in res.evals]
    return cells_frame(rows), pd.DataFrame(ev, columns=["key", "step", "tokens", "val_loss"])
