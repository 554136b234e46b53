"""Reading metric histories back: the validation curves the report and ``ablate tune`` need, and
which metrics a run has (the report's probe section)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ablate.tracking.store import Client, read_only, sqlite_path, sqlite_points

History = dict[str, list[tuple[int, float]]]
"""metric -> [(step, value)] by step."""


def read_histories(
    uri: str, run_ids: Sequence[str], keys: Sequence[str] = ("val_loss", "tokens")
) -> dict[str, History]:
    """run_id -> key -> [(step, value)] by step; a step logged twice keeps its later value.

    On SQLite this reads the store's metrics table (``store.sqlite_points``: ~30x faster than
    ``get_metric_history`` there); elsewhere it asks the tracking server.
    """
    client = Client(uri, must_exist=True)
    path = sqlite_path(uri)
    db = None if path is None else read_only(path)

    def by_step(run_id: str, key: str) -> list[tuple[int, float]]:
        if db is not None:
            rows = [(s, t, v, nan) for _, s, t, v, nan in sqlite_points(db, run_id, key)]
        else:
            rows = [
                (m.step, m.timestamp, m.value, False)
                for m in client.get_metric_history(run_id, key)
            ]
        rows.sort()  # by step, then time: the value logged last wins
        return list({step: math.nan if nan else value for step, _, value, nan in rows}.items())

    try:
        return {run_id: {key: by_step(run_id, key) for key in keys} for run_id in run_ids}
    finally:
        if db is not None:
            db.close()


def read_metric_keys(uri: str, run_ids: Sequence[str], prefix: str = "") -> dict[str, list[str]]:
    """run_id -> the names of the metrics it logged that start with ``prefix``, sorted."""
    client = Client(uri, must_exist=True)
    return {
        rid: sorted(k for k in client.get_run(rid).data.metrics if k.startswith(prefix))
        for rid in run_ids
    }
