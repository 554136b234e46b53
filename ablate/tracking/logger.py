"""The workers' side: ``MlflowLogger``, the trainer's ``Logger`` writing into one MLflow run."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ablate.errors import TrackingError
from ablate.tracking import vocab
from ablate.tracking.runs import log_details, log_status
from ablate.tracking.store import (
    MAX_METRICS,
    MAX_PARAM_LEN,
    MAX_PARAMS,
    MAX_TAG_LEN,
    Client,
    chunks,
    read_only,
    sqlite_path,
    sqlite_points,
    sqlite_start_clock,
)

if TYPE_CHECKING:
    from mlflow.entities import Metric


_BY_TOKENS = "_by_tokens"
"""The metrics the trainer logs against the tokens seen instead of the step (``ablate.train.loop``:
``val_loss_by_tokens``, ``val_ppl_by_tokens``)."""


class MlflowLogger:
    """``ablate.train.logger.Logger`` into one MLflow run: batched, retried, duplicate-free.

    A resumed cell logs into the same run, and the trainer re-reports the steps after its last
    checkpoint; the (metric, step) pairs the run already has are skipped, so that each step appears
    once however often the cell was interrupted.
    """

    def __init__(
        self, uri: str, run_id: str, *, flush_points: int = 200, flush_interval_s: float = 5.0
    ) -> None:
        self._client = Client(uri, must_exist=True)
        self.run_id = run_id
        self.flush_points, self.flush_interval_s = flush_points, flush_interval_s
        keys = self._client.get_run(run_id).data.metrics  # also checks that the run is there
        if (path := sqlite_path(uri)) is not None:  # one indexed query (see store.sqlite_points)
            with contextlib.closing(read_only(path)) as db:
                self._seen = {(k, step) for k, step, *_ in sqlite_points(db, run_id)}
        else:
            get = self._client.get_metric_history
            self._seen = {(k, m.step) for k in keys for m in get(run_id, k)}
        self._buffer: list[Metric] = []
        self._last_flush = time.monotonic()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        old = self._client.get_run(self.run_id).data.params
        new: list[Param] = []
        changed: list[str] = []
        same_tokens = old.get("data.fingerprint") == str(params.get("data.fingerprint"))
        for k, v in params.items():  # flat already (Logger protocol)
            value = str(v)[:MAX_PARAM_LEN]
            if k == "data.prepared" and same_tokens and k in old:
                # the set's key follows its files' modification times: files touched since, the
                # same tokens (data.fingerprint) -> the run goes on, keeping the key it logged
                continue
            if k not in old:
                new.append(Param(k, value))
            elif old[k] != value:
                changed.append(f"{k!r} was {old[k]!r}, now {value!r}")
        if changed:
            raise TrackingError(
                f"run {self.run_id} was logged with another configuration: param "
                f"{'; '.join(changed[:5])}. A resumed cell must keep its config; remove the cell's "
                "output and run (or use a new output folder) to start it afresh."
            )
        for batch in chunks(new, MAX_PARAMS):
            self._client.log_batch(self.run_id, params=batch)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for k, v in metrics.items():
            if (k, step) not in self._seen:  # NaN and inf are kept: a diverged run shows them
                self._seen.add((k, step))
                self._buffer.append(Metric(k, float(v), now, step))
        if (
            len(self._buffer) >= self.flush_points
            or time.monotonic() - self._last_flush >= self.flush_interval_s
        ):
            self.flush()

    def copy_curve(self, source: str, *, step: int, tokens: int) -> int:
        """A decay branch that starts from its trunk's checkpoint: copy every metric point of run
        ``source`` (the trunk's) up to ``step`` (those logged against the tokens seen,
        ``*_by_tokens``: up to ``tokens``) that this run lacks, with its time, and tag the run
        ``branch_of`` and ``branch_step`` (``vocab.branch_details``). Returns the points copied;
        copying again copies nothing."""
        from mlflow.entities import Metric

        if (path := sqlite_path(self._client.uri)) is not None:
            with contextlib.closing(read_only(path)) as db:
                rows = [
                    (k, s, t, math.nan if nan else v)
                    for k, s, t, v, nan in sqlite_points(db, source)
                ]
        else:
            keys = self._client.get_run(source).data.metrics
            get = self._client.get_metric_history
            rows = [(k, m.step, m.timestamp, m.value) for k in keys for m in get(source, k)]
        n = 0
        for k, s, t, v in rows:
            if s <= (tokens if k.endswith(_BY_TOKENS) else step) and (k, s) not in self._seen:
                self._seen.add((k, s))
                self._buffer.append(Metric(k, float(v), t, s))
                n += 1
        self.flush()
        log_details(self._client, self.run_id, vocab.branch_details(source, step))
        return n

    def log_environment(self, env: Mapping[str, str]) -> None:
        """Record the run's provenance as ``env.<name>`` tags: the first attempt's values stay; a
        resumed attempt whose value differs is recorded beside it as ``env.<name>.resumed``."""
        from mlflow.entities import RunTag

        old = self._client.get_run(self.run_id).data.tags
        tags = []
        for name, value in env.items():
            t = vocab.env_tag(name)
            if t not in old:
                tags.append(RunTag(t, str(value)[:MAX_TAG_LEN]))
            elif old[t] != str(value):
                tags.append(RunTag(vocab.env_tag(name, resumed=True), str(value)[:MAX_TAG_LEN]))
        for batch in chunks(tags, MAX_PARAMS):
            self._client.log_batch(self.run_id, tags=batch)

    def mark_started(self) -> None:
        """A cell starts from step 0: its run's start time becomes now (on a SQLite store; a
        server's runs keep the time the driver created them, queueing included)."""
        if self._seen:  # resumed: the run started before
            return
        if (path := sqlite_path(self._client.uri)) is not None:
            sqlite_start_clock(path, self.run_id, int(time.time() * 1000))

    def log_status(self, status: str, info: Mapping[str, Any]) -> None:
        """Record how the trainer ended; the runner ends the MLflow run."""
        self.flush()
        log_status(self._client, self.run_id, status, info)

    def flush(self) -> None:
        # Retrying a batch that was in fact written is harmless: MLflow's SQL store skips points
        # whose (key, timestamp, step, value) it already has, and a point keeps the timestamp
        # that log_metrics gave it until it is written.
        while self._buffer:
            batch = self._buffer[:MAX_METRICS]
            self._client.log_batch(self.run_id, metrics=batch)
            del self._buffer[: len(batch)]
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
