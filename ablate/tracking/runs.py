"""A study's runs in MLflow: the driver's ``StudyTracker`` (experiment, parent run, a run per cell
or trial, statuses) and ``CellRun``, a recorded run as the runner, the report and ``status`` read it.

Layout of a study in MLflow: one experiment per study (its name defaults to the study's), artifacts
inside the study's output folder on a SQLite store rather than ``./mlruns`` in whatever directory the
process happens to run in, and where a tracking server puts them (its ``--artifacts-destination``,
``mlflow-artifacts:/``) on a server; one parent run holding ``study.yaml`` and the report; one child run per cell (and per tune
trial) holding ``config.json``, the flattened config as params and metrics per step. The tags are
``ablate.tracking.vocab``'s. The driver prepares the store and creates the runs before any worker
starts; workers log into their run through ``MlflowLogger``.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.errors import AblateError, MissingStoreError, TrackingError
from ablate.tracking import vocab
from ablate.tracking.lock import Holder, StoreLock, holders
from ablate.tracking.store import (
    MAX_METRICS,
    MAX_PARAM_LEN,
    MAX_PARAMS,
    MAX_TAG_LEN,
    Client,
    chunks,
    sqlite_move_artifacts,
    sqlite_path,
)

if TYPE_CHECKING:
    from mlflow.entities import Run

    from ablate.study import Cell


@dataclass
class CellRun:
    """One cell's (or trial's) MLflow run."""

    run_id: str
    key: str
    label: str
    status: str
    """pending, running, finished, diverged, failed, interrupted, stopped."""
    last_step: int | None
    """Highest step of metric train_loss; None before the first one."""
    tags: dict[str, str]
    data: dict[str, str] = field(default_factory=dict)
    """The prepared data it trained on, as the trainer logged it (``data.fingerprint`` and
    ``data.prepared`` params; empty before its first step was logged)."""

    @property
    def reason(self) -> str:
        """Why it failed or diverged ("" when it did not)."""
        return self.tags.get(vocab.REASON, "")

    @property
    def diverged_at(self) -> float:
        return vocab.number(self.tags, vocab.DIVERGED_AT)

    @property
    def tokens_per_s(self) -> float:
        """Training throughput recorded when the run ended (NaN before)."""
        return vocab.number(self.tags, vocab.TOKENS_PER_S)

    @property
    def family(self) -> str:
        """The family of decay branches the cell belongs to ("": none)."""
        return self.tags.get(vocab.FAMILY, "")

    @property
    def trunk(self) -> str:
        """A decay branch's trunk, by cell key ("": not a branch)."""
        return self.tags.get(vocab.TRUNK, "")

    @property
    def branch_of(self) -> str:
        """The run whose curve up to ``branch_step`` a decay branch copied: its trunk's run, where
        it started from the trunk's checkpoint ("": it trained from step 0)."""
        return self.tags.get(vocab.BRANCH_OF, "")

    @property
    def branch_step(self) -> int | None:
        """The step a decay branch started from, its trunk's (None: from step 0)."""
        step = vocab.number(self.tags, vocab.BRANCH_STEP)
        return None if math.isnan(step) else int(step)

    @property
    def node(self) -> str:
        """The SLURM node that trained it last ("" outside SLURM)."""
        return self.tags.get(vocab.NODE, "")

    @property
    def reused_from(self) -> str:
        """Where a baseline seed copied from another store was trained: that study and store
        ("": trained in this study; ``reused_run`` is its run there)."""
        return self.tags.get(vocab.REUSED_FROM, "")

    @property
    def reused_run(self) -> str:
        """The run a reused baseline seed was copied from, in the store ``reused_from`` names."""
        return self.tags.get(vocab.REUSED_RUN, "")


DATA_PARAMS = ("data.fingerprint", "data.prepared")
"""The params that name the prepared data a run trained on (``ablate.train.loop``)."""


def latest_points(run: Run) -> dict[str, tuple[int, float]]:
    """metric -> (step, value) of its latest point. MLflow keeps each metric's value at its highest
    step with the run; ``RunData.metrics`` drops the step, the run's proto form keeps it."""
    return {m.key: (m.step, m.value) for m in run.data.to_proto().metrics}


def log_details(client: Client, run_id: str, info: Mapping[str, Any]) -> None:
    """Tag ``ablate.<k>`` = str(v) for each item (``vocab``), in batches MLflow accepts."""
    from mlflow.entities import RunTag

    tags = [RunTag(vocab.tag(k), str(v)[:MAX_TAG_LEN]) for k, v in info.items()]
    for batch in chunks(tags, MAX_PARAMS):
        client.log_batch(run_id, tags=batch)


def log_status(client: Client, run_id: str, status: str, info: Mapping[str, Any]) -> None:
    """Tag a run's ablate status and its details (``vocab``), leaving its MLflow status alone."""
    if status not in vocab.STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {list(vocab.STATUSES)}")
    log_details(client, run_id, {"status": status, **info})


def _search(client: Client, experiment_id: str, role: vocab.Role) -> list[Run]:
    """The experiment's runs of one role, newest first."""
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs(
            [experiment_id],
            vocab.role_filter(role),
            order_by=["start_time DESC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _cells(client: Client, experiment_id: str) -> dict[str, CellRun]:
    cells: dict[str, CellRun] = {}
    for run in _search(client, experiment_id, "cell"):
        tags = run.data.tags
        key = tags.get(vocab.KEY, "")
        if key and key not in cells:  # newest first: an older run with the same key is ignored
            label, status = tags.get(vocab.LABEL, key), tags.get(vocab.STATUS, "pending")
            loss = latest_points(run).get("train_loss")
            step = loss[0] if loss else None
            data = {k: v for k, v in run.data.params.items() if k in DATA_PARAMS}
            cells[key] = CellRun(run.info.run_id, key, label, status, step, dict(tags), data)
    return cells


def _parent_id(client: Client, experiment_id: str, study: str) -> str | None:
    runs = _search(client, experiment_id, "study")
    return next((r.info.run_id for r in runs if r.data.tags.get(vocab.STUDY) == study), None)


def _experiment_id(client: Client, name: str) -> str | None:
    found = client.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage != "active":
        raise TrackingError(
            f"the MLflow experiment {name!r} in {client.uri} is deleted; restore it (`mlflow "
            f"experiments restore --experiment-id {found.experiment_id}`) or use another name"
        )
    return None if found is None else str(found.experiment_id)


def _study_experiment(client: Client, study: str, experiment: str | None) -> str:
    name = experiment or study
    found = _experiment_id(client, name)
    if found is None:
        names = sorted(e.name for e in client.search_experiments() if e.name != "Default")
        raise TrackingError(
            f"study {study!r} has no MLflow experiment {name!r} in {client.uri}; the store has "
            f"{', '.join(map(repr, names)) or 'no experiments'}"
        )
    return found


def repair_artifacts(uri: str, location: str | None) -> str | None:
    """If a SQLite store's experiment keeps its artifacts at ``location`` (a file URI) that no
    longer exists while the store's folder has ``artifacts/`` (the study folder was moved), point
    the experiment and its runs there (``store.sqlite_move_artifacts``) and say so on stderr;
    returns that message (None when nothing needed repair). A copied folder whose original still
    exists keeps linking into the original."""
    db = sqlite_path(uri)
    if db is None or not location or not location.startswith("file://"):
        return None
    here = db.parent / "artifacts"
    old = Path(urllib.parse.urlparse(location).path)
    if old.exists() or not here.is_dir() or old == here.resolve():
        return None
    n = sqlite_move_artifacts(db, location, here.resolve().as_uri())
    msg = f"ablate: the study folder moved: artifact locations {old} -> {here} ({n} runs repaired)"
    print(msg, file=sys.stderr)
    return msg


class StudyTracker:
    """The driver's handle on one study's experiment: the parent run, the cells' runs, statuses."""

    def __init__(
        self,
        uri: str,
        study: str,
        *,
        experiment: str | None = None,
        artifact_root: str | Path | None = None,
    ) -> None:
        self.uri, self.study = uri, study
        self._client = Client(uri)
        name = experiment or study
        found = _experiment_id(self._client, name)
        if found is None:
            if artifact_root is None and (db := sqlite_path(uri)) is not None:
                artifact_root = db.parent / "artifacts"  # without it MLflow writes ./mlruns
            location = str(artifact_root) if artifact_root is not None else None
            if location is not None and "://" not in location:
                location = Path(location).resolve().as_uri()
            try:
                found = self._client.create_experiment(name, artifact_location=location)
            except TrackingError:  # another driver created it meanwhile
                found = _experiment_id(self._client, name)
                if found is None:
                    raise
        self.experiment_id: str = found
        info = self._client.get_experiment(found)
        repair_artifacts(uri, info.artifact_location)
        # MLflow 3 opens an experiment without this tag in its GenAI view (traces, no runs)
        kind = info.tags.get(vocab.EXPERIMENT_KIND)
        if kind != vocab.TRAINING_KIND:
            self._client.set_experiment_tag(found, vocab.EXPERIMENT_KIND, vocab.TRAINING_KIND)

    def driver_lock(
        self,
        lock: str,
        *,
        command: str,
        output: str | Path,
        error: type[AblateError] = TrackingError,
        note: Callable[[str], None] | None = None,
    ) -> StoreLock:
        """The study's lock ``lock`` (``run``, ``tune``) in this store, for a ``with`` block: one
        driver at a time, whatever its output folder (``ablate.tracking.lock``)."""
        return StoreLock(
            self._client,
            self.experiment_id,
            lock,
            study=self.study,
            command=command,
            output=str(output),
            error=error,
            note=note,
        )

    def drivers(self, lock: str) -> list[Holder]:
        """The drivers that hold (or are claiming) the study's lock ``lock`` now."""
        return holders(self._client, self.experiment_id, lock)

    def parent_run(
        self,
        spec_text: str,
        *,
        description: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> str:
        """Find or create the study's parent run, (re)store ``study.yaml``, return its id.

        ``description`` becomes the run's description in the UI; ``params`` (the study's base
        config, flattened) are logged where the run does not have them yet: a param cannot change
        in MLflow, so a study whose base changed later keeps the first values there, and
        ``study.yaml`` (always the latest) is the record."""
        from mlflow.entities import Param, RunTag

        run_id = _parent_id(self._client, self.experiment_id, self.study)
        if run_id is None:
            tags = vocab.study_tags(self.study)
            run = self._client.create_run(self.experiment_id, tags=tags, run_name=self.study)
            run_id = str(run.info.run_id)
        self._client.log_text(run_id, spec_text, "study.yaml")
        if description:
            self._client.log_batch(run_id, tags=[RunTag(vocab.DESCRIPTION, description)])
        if params:
            have = self._client.get_run(run_id).data.params
            new = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items() if k not in have]
            for batch in chunks(new, MAX_PARAMS):
                self._client.log_batch(run_id, params=batch)
        return run_id

    def cell_runs(self) -> dict[str, CellRun]:
        """Every cell's run in this experiment, by key (the newest if a key has several)."""
        return _cells(self._client, self.experiment_id)

    def create_run(
        self,
        parent_id: str,
        key: str,
        label: str,
        tags: Mapping[str, str],
        config: Mapping[str, Any],
        *,
        role: vocab.Role = "cell",
        name: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> str:
        """A pending child run for one cell (or tune trial), its resolved config as ``config.json``;
        ``name`` is its name in the UI (default: the label), ``params`` the study's axes as params."""
        from mlflow.entities import Param

        all_tags = {**vocab.run_tags(role, key, label, parent_id), **tags}
        run = self._client.create_run(self.experiment_id, tags=all_tags, run_name=name or label)
        run_id = str(run.info.run_id)
        if params:
            self._client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
        text = json.dumps(config, sort_keys=True, indent=2, default=str)
        self._client.log_text(run_id, text, "config.json")
        return run_id

    def set_status(self, run_id: str, status: str, info: Mapping[str, Any] | None = None) -> None:
        """Tag a run's ablate status (plus details) and end or reopen its MLflow run to match."""
        log_status(self._client, run_id, status, info or {})
        mlflow_status = vocab.STATUSES[status]
        if mlflow_status == "RUNNING":
            self._client.update_run(run_id, status="RUNNING")
        elif mlflow_status is not None:
            self._client.set_terminated(run_id, mlflow_status)

    def delete_run(self, run_id: str) -> None:
        """Delete a run (MLflow keeps it, deleted, out of every search)."""
        self._client.delete_run(run_id)

    def set_tags(self, run_id: str, info: Mapping[str, Any]) -> None:
        """Tag ``ablate.<k>`` = str(v) for each item, leaving the run's status alone."""
        log_details(self._client, run_id, info)

    def set_raw_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set tags by their full names (``vocab``'s constants), e.g. a run's key on adoption."""
        from mlflow.entities import RunTag

        self._client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        """Log metrics at one step (a later call at the same step supersedes: MLflow shows the
        newest point of the highest step)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for batch in chunks(points, MAX_METRICS):
            self._client.log_batch(run_id, metrics=batch)

    def create_cell_run(self, parent_id: str, cell: Cell) -> str:
        """A pending run for a study's cell: its tags, axis params and resolved config."""
        return self.create_run(
            parent_id,
            cell.key,
            cell.label,
            vocab.cell_tags(cell),
            cell.config.to_dict(),
            name=vocab.short_name(cell),
            params=vocab.cell_params(cell),
        )

    def copy_run(self, uri: str, source_id: str, run_id: str, *, reused_from: str) -> None:
        """Copy run ``source_id`` of the store at ``uri`` into ``run_id`` (a cell's run the driver
        created, its tags this study's): the params it lacks, every metric's whole history, the
        other tags (provenance, status details; not another study's axes, family or branches),
        the artifacts but ``config.json``; ``reused_from`` and the source run as tags (a source
        run that is itself a copy keeps its own: the study and run where the seed trained), and
        the source's status last, so that a copy cut short stays ``pending`` (``driver.reuse``)."""
        from mlflow.entities import Param, RunTag

        src = Client(uri, must_exist=True)
        run = src.get_run(source_id)
        have = self._client.get_run(run_id).data
        params = [Param(k, v) for k, v in run.data.params.items() if k not in have.params]
        for batch in chunks(params, MAX_PARAMS):
            self._client.log_batch(run_id, params=batch)
        for name in run.data.metrics:
            history = src.get_metric_history(source_id, name)
            for batch in chunks(history, MAX_METRICS):
                self._client.log_batch(run_id, metrics=batch)
        skip = (vocab.tag("axis."), vocab.FAMILY, vocab.TRUNK, vocab.BRANCH_POINT, vocab.BRANCH_OF,
                vocab.BRANCH_STEP, vocab.STATUS, "mlflow.")  # fmt: skip
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith(skip)}
        tags = {k: v for k, v in tags.items() if k not in have.tags}
        if not (run.data.tags.get(vocab.REUSED_FROM) and run.data.tags.get(vocab.REUSED_RUN)):
            tags |= {vocab.REUSED_FROM: reused_from, vocab.REUSED_RUN: source_id}
        self._client.log_batch(run_id, tags=[RunTag(k, v[:MAX_TAG_LEN]) for k, v in tags.items()])
        with tempfile.TemporaryDirectory() as tmp:
            for f in src.list_artifacts(source_id):  # the top level: files and folders
                if f.path == "config.json":
                    continue
                local = src.download_artifacts(source_id, f.path, tmp)
                if f.is_dir:
                    self._client.log_artifacts(run_id, local, f.path)
                else:
                    self._client.log_artifact(run_id, local)
        self.set_status(run_id, run.data.tags.get(vocab.STATUS, "finished"))

    def statuses(self, run_ids: Iterable[str]) -> dict[str, str]:
        """run_id -> the run's ablate status (``vocab.STATUSES``)."""
        runs = {rid: self._client.get_run(rid).data.tags for rid in run_ids}
        return {rid: tags.get(vocab.STATUS, "pending") for rid, tags in runs.items()}

    def latest_metrics(self, run_ids: Iterable[str]) -> dict[str, dict[str, tuple[int, float]]]:
        """run_id -> {metric: (step, latest value)}, cheap enough for a progress display."""
        return {run_id: latest_points(self._client.get_run(run_id)) for run_id in run_ids}

    def log_files(
        self, run_id: str, root: str | Path, files: Iterable[Path], artifact_path: str
    ) -> None:
        """Attach ``files`` (each under ``root``) to the run under ``artifact_path``, each at its
        path relative to ``root``: only these, not whatever else lies in ``root``."""
        base = Path(root).resolve()
        for f in files:
            rel = Path(f).resolve().parent.relative_to(base).as_posix()
            where = artifact_path if rel == "." else f"{artifact_path}/{rel}"
            self._client.log_artifact(run_id, str(f), where)


def read_cells(uri: str, study: str, *, experiment: str | None = None) -> list[CellRun]:
    """The study's cells as the store has them, in key order."""
    client = Client(uri, must_exist=True)
    experiment_id = _study_experiment(client, study, experiment)
    return sorted(_cells(client, experiment_id).values(), key=lambda c: c.key)


def check_study(uri: str, study: str, *, experiment: str | None = None) -> None:
    """``TrackingError`` unless the store at ``uri`` holds the study's experiment (its runs are not
    read)."""
    _study_experiment(Client(uri, must_exist=True), study, experiment)


def read_study_text(uri: str, study: str, *, experiment: str | None = None) -> str:
    """The ``study.yaml`` kept with the study's parent run (to report without the file at hand);
    ``MissingStoreError`` when the study has no parent run there, or the run keeps no
    study.yaml."""
    client = Client(uri, must_exist=True)
    run_id = _parent_id(client, _study_experiment(client, study, experiment), study)
    if run_id is None:
        raise MissingStoreError(
            f"study {study!r} has no parent run in {uri}: it was never run there"
        )
    if "study.yaml" not in {a.path for a in client.list_artifacts(run_id)}:
        raise MissingStoreError(
            f"study {study!r}: its parent run {run_id} in {uri} keeps no study.yaml (its "
            "artifacts were removed or never written); report it with its study file"
        )
    with tempfile.TemporaryDirectory() as tmp:
        return Path(client.download_artifacts(run_id, "study.yaml", tmp)).read_text()
