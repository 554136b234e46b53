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
    ``runs``: the study's runs by key as the caller read them (default: read from the store)."""
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
    evals = pd.DataFrame(ev, columns=["key", "step", "tokens", "val_loss"])
    return cells.drop(columns=["run_id"]), evals
