"""A study's runs as the report reads them: its cells and their evaluations from its MLflow store,
in the report's input contract (``ablate.report.inputs``), each run's provenance and where a
reused baseline seed was trained with it. Read by the report (``report.study``), the sequential
waves' replay (``report.waves``) and ``ablate plan --noise-from``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from ablate.errors import DamagedStoreError, MissingStoreError, ReportError, TrackingError
from ablate.report.frames import cell_row, cells_frame
from ablate.tracking import CellRun, join_runs, read_histories, study_status
from ablate.tracking.vocab import env_of

if TYPE_CHECKING:
    from ablate.study import Study


def study_frames(
    study: Study, runs: Mapping[str, CellRun] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, evals) in the report's input contract (``ablate.report.inputs``), the cells with
    each run's provenance (``ablate.report.provenance.PROVENANCE``) and ``data.fingerprint`` (""
    where none was recorded).
    ``runs``: the study's runs by key as the caller read them (default: read from the store).
    ``ReportError`` for an evaluation at a negative step or token count (``_check_points``)."""
    try:
        statuses = study_status(study) if runs is None else join_runs(study, runs)
    except (DamagedStoreError, MissingStoreError):  # refusals of their own (exit 2)
        raise
    except TrackingError as e:
        raise ReportError(str(e)) from None
    rows: list[dict[str, Any]] = []
    for cs in statuses:
        c, run = cs.cell, cs.run
        row = cell_row(
            c,
            status=run.status if run else "pending",
            diverged_at=run.diverged_at if run else math.nan,
            tokens_per_s=run.tokens_per_s if run else math.nan,
            env=env_of(run.tags) if run else {},
            fingerprint=run.data.get("data.fingerprint", "") if run else "",
        )
        # a baseline seed copied from another store: where from
        reused = {"reused_from": run.reused_from, "reused_run": run.reused_run} if run else {}
        rows.append({**row, "run_id": run.run_id if run else None, **reused})
    cells = cells_frame(rows)
    run_ids = [r for r in cells["run_id"] if r]
    hist = (
        read_histories(study.tracking_uri, run_ids, keys=("val_loss", "tokens")) if run_ids else {}
    )
    key_of = {r: k for k, r in zip(cells["key"], cells["run_id"], strict=True) if r}
    ev: list[tuple[str, int, float, float]] = []
    for rid, h in hist.items():
        tokens = dict(h.get("tokens", []))
        ev.extend((key_of[rid], s, tokens.get(s, math.nan), v) for s, v in h.get("val_loss", []))
        _check_points(study, rid, key_of[rid], h)
    evals = pd.DataFrame(ev, columns=["key", "step", "tokens", "val_loss"])
    return cells.drop(columns=["run_id"]), evals


def _check_points(study: Study, run_id: str, key: str, hist: Mapping[str, Any]) -> None:
    """``ReportError`` naming the cell, its run and the point when its evaluations hold a negative
    step or a negative token count (a run counts both from 0: the store was written by something
    else, and the point would pass for the target reached before training started)."""
    for name in ("val_loss", "tokens"):
        for step, value in hist.get(name, []):
            if step >= 0 and not (name == "tokens" and value < 0):
                continue
            label = next((c.label for c in study.cells if c.key == key), key)
            what = f"step {step}" if step < 0 else f"step {step} with tokens {value:g}"
            raise ReportError(
                f"cell {label}: its run {run_id} in {study.tracking_uri} has {name} at {what}; a "
                "run counts steps and tokens from 0, so this one was not logged by ablate: delete "
                "the run (or the point) and report again"
            )
