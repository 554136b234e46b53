"""MLflow tracking: the project's only package that talks to MLflow (mlflow is imported lazily;
its errors are ``ablate.errors.TrackingError``).

Modules, by concept:

    vocab    every tag, role and status name ablate writes (spelled there and nowhere else)
    store    the store: URIs, creating it, a retrying client, the one direct SQLite read
    runs     the driver's StudyTracker (experiment, parent and child runs) and CellRun
    lock     the study's driver lock in the store (a claim tag on its experiment, heartbeats)
    logger   MlflowLogger: the trainer's Logger into one run, batched and duplicate-free
    history  read_histories: metric curves for the report and tune
    status   study_status: the study's cells joined with their recorded runs; baseline_curves;
             shared_order_note (seeds recorded when every seed read one batch order)
    adopt    ``ablate adopt``: runs recorded under an older key, taken over knowingly
    ui       ``ablate ui``: the MLflow server on a study's store, opened at ablate's runs view
    server   a study's own MLflow server, for cells on several nodes (``ablate slurm run``)
    places   where a study keeps what it recorded; a path a command writes checked against them
"""

from __future__ import annotations

from ablate.tracking.history import read_histories, read_metric_keys
from ablate.tracking.logger import MlflowLogger
from ablate.tracking.runs import CellRun, StudyTracker, read_cells, read_study_text
from ablate.tracking.status import (
    CellStatus,
    baseline_curves,
    join_runs,
    shared_order_note,
    study_status,
)
from ablate.tracking.store import (
    check_cluster_uri,
    check_store,
    check_uri,
    default_uri,
    is_local_store,
    prepare_store,
)

__all__ = [
    "CellRun",
    "CellStatus",
    "MlflowLogger",
    "StudyTracker",
    "baseline_curves",
    "check_store",
    "check_cluster_uri",
    "check_uri",
    "default_uri",
    "is_local_store",
    "join_runs",
    "shared_order_note",
    "prepare_store",
    "read_cells",
    "read_histories",
    "read_metric_keys",
    "read_study_text",
    "study_status",
]
