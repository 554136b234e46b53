"""The input contract of the report: two tidy DataFrames, checked and cleaned here.

Input contract (the tracking layer builds these from MLflow):

``cells``, one row per cell:
    key str (unique), label str, config str (label without the seed: cells with the same config differ
    only by seed), seed int, status str (finished | diverged | failed | running | interrupted | pending),
    diverged_at float (step, NaN unless diverged), baseline bool (exactly one config is the baseline),
    fp4_gemms str ("", "fprop", "fprop+dgrad", ...), intervention str (none, sr, rht16, dht16, sr+rht64,
    ...), fp4_format str (mxfp4 | nvfp4), base_format str (bf16 | fp8 | mxfp8), backend str
    (emulated | native), tokens_per_step int, tokens_per_s float (measured throughput, NaN if unknown).
    Optional: the provenance columns of ``ablate.report.provenance.PROVENANCE`` (str; "" or missing
    reads as unknown); schedule_steps float, the last step of the cell's learning-rate schedule
    when it trained past it (a baseline under ``baseline_extend``; NaN or missing: it did not):
    the report reads its tokens to target up to there (``budget_steps``); reused_from str, where a
    baseline seed copied from another store (``baseline_from``) was trained ("" or missing: here),
    and reused_run str, its run there; data_config str, the data fields that decide a cell's
    tokens (``frames.data_config``: cells meant to read the same tokens; missing: every cell's
    the same), and data_fingerprint str, the ``data.fingerprint`` its run recorded ("": none;
    missing: the data are not checked, ``provenance.check_data``).

``evals``, one row per (cell, evaluation):
    key, step int, tokens float, val_loss float. Duplicate (key, step) rows keep the last one (a resumed
    run re-logs its evaluations); missing tokens become step * tokens_per_step; a NaN/inf loss marks
    divergence at that step (the curve ends before it), and so does a negative one (a
    cross-entropy never is; MLflow stores -inf as the most negative float); cells may have no rows
    at all.

``check_inputs`` raises ``ReportError`` naming what breaks the contract; ``clean_evals`` returns the
evaluations de-duplicated, sorted and with perplexity, which every later step expects.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from ablate.errors import ReportError

CELL_COLUMNS = (
    "key", "label", "config", "seed", "status", "diverged_at", "baseline", "fp4_gemms",
    "intervention", "fp4_format", "base_format", "backend", "tokens_per_step", "tokens_per_s",
)  # fmt: skip
EVAL_COLUMNS = ("key", "step", "tokens", "val_loss")
STATUSES = ("finished", "diverged", "failed", "running", "interrupted", "pending")
CLEAN = "ablate.report.clean_evals"  # attrs flag: already de-duplicated, sorted, with ppl


def check_inputs(cells: Any, evals: Any) -> None:
    """Raise ReportError naming what is missing or inconsistent in the two DataFrames."""
    missing = [c for c in CELL_COLUMNS if c not in cells.columns]
    if missing:
        raise ReportError(f"cells is missing the column(s) {', '.join(missing)}")
    missing = [c for c in EVAL_COLUMNS if c not in evals.columns]
    if missing and len(evals):  # an empty frame without columns is simply "no evaluations yet"
        raise ReportError(f"evals is missing the column(s) {', '.join(missing)}")
    if len(cells) == 0:
        raise ReportError("the study has no cells to report")
    dup = cells["key"][cells["key"].duplicated()]
    if len(dup):
        raise ReportError(f"cells has duplicate keys: {', '.join(map(str, dup.unique()[:5]))}")
    bad = sorted(set(cells["status"]) - set(STATUSES))
    if bad:
        raise ReportError(
            f"unknown cell status {', '.join(map(str, bad))}; allowed: {', '.join(STATUSES)}"
        )
    if not pd.api.types.is_bool_dtype(cells["baseline"]):
        raise ReportError(
            f"cells column baseline must hold booleans, got dtype {cells['baseline'].dtype}"
        )
    base = sorted(cells.loc[cells["baseline"], "config"].unique())
    if len(base) != 1:
        found = ", ".join(base) if base else "none"
        raise ReportError(f"exactly one config must be the baseline; found {found}")


def clean_evals(cells: Any, evals: Any) -> Any:
    """Evaluations de-duplicated (last row per key and step wins), with tokens filled, sorted by
    (key, step), restricted to known cells, with ``ppl`` = exp(val_loss) (inf when not finite or
    negative)."""
    ev = evals.reindex(columns=list(EVAL_COLUMNS))
    ev = ev[ev["key"].isin(cells["key"])]
    ev = ev.drop_duplicates(["key", "step"], keep="last")
    ev = ev.sort_values(["key", "step"], kind="stable").reset_index(drop=True)
    tokens = ev["tokens"].astype(float)
    if tokens.isna().any():
        per_step = ev["key"].map(cells.set_index("key")["tokens_per_step"]).astype(float)
        tokens = tokens.fillna(ev["step"].astype(float) * per_step)
    loss = ev["val_loss"].astype(float).to_numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        ppl = np.where(np.isfinite(loss) & (loss >= 0), np.exp(loss), np.inf)
    ev = ev.assign(tokens=tokens, val_loss=loss, ppl=ppl)
    ev.attrs[CLEAN] = True
    return ev


def curves(ev: Any) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(key, step, tokens, ppl) per cell from cleaned evaluations, in step order."""
    if len(ev) == 0:
        return
    keys = ev["key"].to_numpy()
    steps, tokens, ppl = (ev[c].to_numpy(dtype=float) for c in ("step", "tokens", "ppl"))
    starts = np.r_[0, np.flatnonzero(keys[1:] != keys[:-1]) + 1, len(keys)]
    for a, b in zip(starts[:-1], starts[1:], strict=False):
        yield str(keys[a]), steps[a:b], tokens[a:b], ppl[a:b]


def budget_steps(cells: Any) -> dict[str, float]:
    """key -> the last step of its schedule, for the cells that trained past it (the optional
    ``schedule_steps`` column)."""
    if "schedule_steps" not in cells:
        return {}
    steps = pd.to_numeric(cells["schedule_steps"], errors="coerce")
    return {str(k): float(v) for k, v in zip(cells["key"], steps, strict=True) if math.isfinite(v)}
