"""MLflow tracking against a real SQLite store: runs and statuses, batching, resume, concurrency."""

from __future__ import annotations

import math
import os
import shutil
import socket
import sqlite3
import threading
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
import ranks
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from ablate import tracking
from ablate.errors import TrackingError
from ablate.tracking import MlflowLogger, StudyTracker


@pytest.fixture(scope="session")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("template") / "runs" / "study"  # not there yet
    tracking.prepare_store(tracking.default_uri(out), out)  # MLflow's migrations: seconds, once
    return out / "mlflow.db"


@pytest.fixture
def out(tmp_path: Path, template_db: Path) -> Path:
    """A study output folder holding an already migrated, empty store."""
    d = tmp_path / "out"
    d.mkdir()
    shutil.copy(template_db, d / "mlflow.db")
    return d


@pytest.fixture
def uri(out: Path) -> str:
    return tracking.default_uri(out)


def steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def new_cell(uri: str, key: str = "k1", study: str = "s") -> tuple[StudyTracker, str]:
    tracker = StudyTracker(uri, study)
    parent = tracker.parent_run("name: s\n")
    return tracker, tracker.create_run(parent, key, f"cell {key}", {}, {"lr": 1e-3})


# --- the store ------------------------------------------------------------------------------


def test_default_uri_is_an_absolute_sqlite_path_in_the_output_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tracking.default_uri("runs/a") == f"sqlite:///{tmp_path / 'runs' / 'a' / 'mlflow.db'}"


@pytest.mark.parametrize(
    ("uri", "local"),
    [
        ("sqlite:////x/mlflow.db", True),
        ("file:///x/mlruns", True),
        ("/x/mlruns", True),
        ("http://host:5000", False),
        ("https://mlflow.example.com", False),
    ],
)
def test_is_local_store(uri, local):
    assert tracking.is_local_store(uri) is local


def test_check_uri_refuses_a_sqlite_file_when_workers_run_on_several_nodes():
    tracking.check_uri("sqlite:////x/mlflow.db", multi_node=False)
    tracking.check_uri("http://host:5000", multi_node=True)
    with pytest.raises(TrackingError) as e:
        tracking.check_uri("sqlite:////x/mlflow.db", multi_node=True)
    msg = str(e.value)
    assert "other nodes cannot reach it" in msg and "mlflow server" in msg
    assert "--tracking-uri http://" in msg and "tracking.uri" in msg


def test_prepare_store_creates_the_database_and_is_idempotent(template_db, out, uri):
    assert template_db.is_file()  # made by prepare_store, folders included
    eid = MlflowClient(tracking_uri=uri).create_experiment("kept")
    tracking.prepare_store(uri, out)
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("kept").experiment_id == eid


def test_prepare_store_rejects_unreachable_servers_and_other_schemes(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        TrackingError, match=f"no MLflow tracking server answers at http://127.0.0.1:{port}"
    ):
        tracking.prepare_store(f"http://127.0.0.1:{port}", tmp_path)
    with pytest.raises(TrackingError, match=r"unsupported.*sqlite:///.*http\(s\)://"):
        tracking.prepare_store("postgresql://db/mlflow", tmp_path)


# --- the driver -----------------------------------------------------------------------------


def test_artifacts_go_to_the_output_dir_and_nothing_to_the_cwd(out, uri, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    tracker, run_id = new_cell(uri)
    exp = MlflowClient(tracking_uri=uri).get_experiment(tracker.experiment_id)
    assert exp.artifact_location == (out / "artifacts").as_uri()
    parent = tracker.parent_run("name: s\n")
    assert (out / "artifacts" / parent / "artifacts" / "study.yaml").read_text() == "name: s\n"
    config = out / "artifacts" / run_id / "artifacts" / "config.json"
    assert config.read_text() == '{\n  "lr": 0.001\n}'
    assert list(cwd.iterdir()) == []


def test_a_second_tracker_finds_the_parent_run_and_overwrites_the_study_text(out, uri, capfd):
    first = StudyTracker(uri, "s").parent_run("v: 1\n")
    tracker = StudyTracker(uri, "s")
    tracker.set_status(first, "finished", {"cells": 2})
    assert tracker.parent_run("v: 2\n") == first
    run = MlflowClient(tracking_uri=uri).get_run(first)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.cells"] == "2"
    assert (out / "artifacts" / first / "artifacts" / "study.yaml").read_text() == "v: 2\n"
    capfd.readouterr()
    assert tracking.read_study_text(uri, "s") == "v: 2\n"
    # without MLflow's progress bar on stderr, and the environment left as it was
    assert "Downloading artifacts" not in capfd.readouterr().err
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ


def test_cell_runs_and_status_transitions(uri):
    tracker, run_id = new_cell(uri, "k1")
    parent = tracker.parent_run("name: s\n")
    other = tracker.create_run(parent, "k2", "cell k2", {"ablate.seed": "1"}, {})
    cells = tracker.cell_runs()
    assert set(cells) == {"k1", "k2"}
    assert cells["k1"].run_id == run_id and cells["k1"].label == "cell k1"
    assert cells["k2"].status == "pending" and cells["k2"].tags["ablate.seed"] == "1"
    assert cells["k2"].tags["mlflow.parentRunId"] == parent and cells["k2"].last_step is None
    client = MlflowClient(tracking_uri=uri)
    for status, mlflow_status in [
        ("running", "RUNNING"),
        ("interrupted", "KILLED"),
        ("running", "RUNNING"),
        ("diverged", "FINISHED"),
        ("failed", "FAILED"),
        ("finished", "FINISHED"),
    ]:
        tracker.set_status(other, status, {"steps": 7})
        run = client.get_run(other)
        assert run.info.status == mlflow_status, status
        assert run.data.tags["ablate.status"] == status and run.data.tags["ablate.steps"] == "7"
    with pytest.raises(ValueError, match="unknown run status 'done'"):
        tracker.set_status(other, "done")


def test_a_key_with_two_runs_keeps_the_newest(uri):
    tracker, _ = new_cell(uri, "k1")
    newer = tracker.create_run(tracker.parent_run(""), "k1", "again", {}, {})
    assert tracker.cell_runs()["k1"].run_id == newer


def test_last_step_and_latest_metrics_follow_the_logger(uri):
    tracker, run_id = new_cell(uri)
    log = MlflowLogger(uri, run_id)
    for step in range(1, 6):
        log.log_metrics({"train_loss": 10.0 - step, "tokens": 64.0 * step}, step)
    log.close()
    assert tracker.cell_runs()["k1"].last_step == 5
    assert tracker.latest_metrics([run_id]) == {
        run_id: {"train_loss": (5, 5.0), "tokens": (5, 320.0)}
    }


# --- the workers' logger --------------------------------------------------------------------


def test_params_are_logged_once_and_a_changed_value_is_refused(uri):
    _, run_id = new_cell(uri)
    params = {"model.d_model": 64, "train.lr": 1e-3, "note": "x" * 7000}
    MlflowLogger(uri, run_id).log_params(params)
    MlflowLogger(uri, run_id).log_params(params)  # a resumed cell logs the same again
    logged = MlflowClient(tracking_uri=uri).get_run(run_id).data.params
    assert logged["model.d_model"] == "64" and logged["train.lr"] == "0.001"
    assert len(logged["note"]) == 6000  # MLflow's limit
    with pytest.raises(TrackingError, match=r"'train.lr' was '0.001', now '0.002'"):
        MlflowLogger(uri, run_id).log_params({**params, "train.lr": 2e-3})


def test_metrics_are_buffered_until_flush_or_close(uri):
    _, run_id = new_cell(uri)
    log = MlflowLogger(uri, run_id, flush_points=1000, flush_interval_s=1e9)
    for step in range(50):
        log.log_metrics({"train_loss": 1.0, "lr": 0.1}, step)
    assert steps(uri, run_id, "train_loss") == []
    log.close()
    assert steps(uri, run_id, "train_loss") == list(range(50))
    assert steps(uri, run_id, "lr") == list(range(50))

    _, run_id = new_cell(uri, "k2")
    log = MlflowLogger(uri, run_id, flush_points=10, flush_interval_s=1e9)
    for step in range(23):
        log.log_metrics({"train_loss": 1.0}, step)
    assert steps(uri, run_id, "train_loss") == list(range(20))  # two full batches of 10
    log.flush()
    assert steps(uri, run_id, "train_loss") == list(range(23))


def test_a_resumed_run_has_each_step_once(uri):
    _, run_id = new_cell(uri)
    a = MlflowLogger(uri, run_id, flush_points=1000, flush_interval_s=1e9)
    for step in range(14):
        a.log_metrics({"train_loss": float(step), "tokens": 64.0 * step}, step)
        if step == 10:
            a.flush()  # steps 0..10 reach the store; 11..13 die with the worker
    del a
    b = MlflowLogger(uri, run_id, flush_points=1000, flush_interval_s=1e9)
    for step in range(8, 21):  # resumed from a checkpoint at step 8
        b.log_metrics({"train_loss": 100.0 + step, "tokens": 64.0 * step}, step)
    b.close()
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "train_loss")
    assert sorted(m.step for m in history) == list(range(21))
    values = {m.step: m.value for m in history}
    assert values[10] == 10.0 and values[11] == 111.0  # the first logger's points are kept
    assert steps(uri, run_id, "tokens") == list(range(21))


def test_nan_and_inf_are_logged_so_a_diverged_run_shows_them(uri):
    _, run_id = new_cell(uri)
    log = MlflowLogger(uri, run_id)
    log.log_metrics({"train_loss": math.nan, "grad_norm": math.inf}, 3)
    log.log_status("diverged", {"step": 3, "reason": "non-finite loss"})
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert math.isnan(run.data.metrics["train_loss"]) and run.data.metrics["grad_norm"] > 1e300
    assert run.data.tags["ablate.status"] == "diverged" and run.info.status == "RUNNING"
    assert run.data.tags["ablate.reason"] == "non-finite loss"


def _write_cell(uri: str, run_id: str, start: Barrier) -> None:
    log = MlflowLogger(uri, run_id, flush_points=100, flush_interval_s=1e9)
    start.wait(60)  # every writer is ready: the writes overlap
    for step in range(300):
        log.log_metrics({f"m{i}": step + i / 10 for i in range(5)}, step)
    log.close()


@pytest.mark.slow
def test_concurrent_writers_lose_no_point_and_write_none_twice(out, uri):
    tracker = StudyTracker(uri, "s")
    parent = tracker.parent_run("")
    run_ids = [tracker.create_run(parent, f"k{i}", f"c{i}", {}, {}) for i in range(6)]
    # Fresh processes like Ray's workers. The suite's forkserver, which has imported MLflow once,
    # rather than spawn, saves each writer the ~5 s import (30 s of this test on two cores); like
    # spawn it forks nothing that holds a database connection.
    ctx = ranks.context()
    start = ctx.Barrier(6)
    procs = [ctx.Process(target=_write_cell, args=(uri, r, start)) for r in run_ids]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 6
    with sqlite3.connect(out / "mlflow.db") as db:
        rows = db.execute("SELECT run_uuid, key, step, COUNT(*) FROM metrics GROUP BY 1, 2, 3")
        counts = {(r, k, s): n for r, k, s, n in rows}
    assert set(counts.values()) == {1}
    assert len(counts) == 6 * 5 * 300
    histories = tracking.read_histories(uri, run_ids, [f"m{i}" for i in range(5)])
    assert histories[run_ids[0]]["m4"][299] == (299, 299.4)


def test_a_locked_database_is_retried_until_it_frees(out):
    holder = sqlite3.connect(out / "mlflow.db", check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the file
    threading.Timer(0.5, holder.rollback).start()

    def write() -> int:
        with sqlite3.connect(out / "mlflow.db", timeout=0) as db:
            return db.execute("UPDATE experiments SET name = name").rowcount

    t0 = time.monotonic()
    assert tracking.store._retry("writing", write) == 1
    assert time.monotonic() - t0 >= 0.5
    holder.close()


def test_a_store_error_that_retrying_cannot_fix_is_reported_at_once(uri):
    log = MlflowLogger(uri, new_cell(uri)[1])
    log.run_id = "f" * 32
    log.log_metrics({"train_loss": 1.0}, 1)
    with pytest.raises(
        TrackingError, match=f"MLflow's log_batch on {uri} failed: Run .* not found"
    ):
        log.flush()


def test_logger_on_a_missing_store_refuses_and_creates_nothing(tmp_path):
    with pytest.raises(TrackingError, match="no MLflow store at"):
        MlflowLogger(tracking.default_uri(tmp_path / "none"), "0" * 32)
    assert not (tmp_path / "none").exists()


# --- reading back ---------------------------------------------------------------------------


def test_reading_a_missing_store_raises_and_creates_nothing(tmp_path):
    missing = tracking.default_uri(tmp_path / "none")
    with pytest.raises(TrackingError, match=r"no MLflow store at .*none.*ablate run"):
        tracking.read_cells(missing, "s")
    with pytest.raises(TrackingError, match="no MLflow store at"):
        tracking.read_histories(missing, ["0" * 32])
    assert not (tmp_path / "none").exists()


def test_reading_a_missing_study_names_the_experiments_there(uri):
    new_cell(uri, study="alpha")
    with pytest.raises(TrackingError, match=r"study 'beta' has no MLflow experiment.*'alpha'"):
        tracking.read_cells(uri, "beta")


def test_a_study_without_a_parent_run_has_no_text(uri):
    StudyTracker(uri, "s")
    with pytest.raises(TrackingError, match="study 's' has no parent run"):
        tracking.read_study_text(uri, "s")


def test_read_cells_lists_the_cells_by_key(uri):
    tracker, first = new_cell(uri, "b")
    second = tracker.create_run(tracker.parent_run(""), "a", "cell a", {}, {})
    cells = tracking.read_cells(uri, "s")
    assert [(c.key, c.run_id) for c in cells] == [("a", second), ("b", first)]
    assert tracking.read_cells(uri, "other", experiment="s") == cells


def test_read_histories_keeps_the_last_value_logged_for_a_step(uri):
    _, run_id = new_cell(uri)
    points = [
        Metric("val_loss", 3.0, 2000, 5),
        Metric("val_loss", 4.0, 1000, 5),  # logged earlier: superseded
        Metric("val_loss", 9.0, 1000, 0),
        Metric("val_loss", math.nan, 3000, 7),
        Metric("tokens", 64.0, 1000, 5),
    ]
    MlflowClient(tracking_uri=uri).log_batch(run_id, metrics=points)
    h = tracking.read_histories(uri, [run_id], ["val_loss", "tokens", "absent"])[run_id]
    assert h["val_loss"][:2] == [(0, 9.0), (5, 3.0)]
    assert h["val_loss"][2][0] == 7 and math.isnan(h["val_loss"][2][1])
    assert h["tokens"] == [(5, 64.0)] and h["absent"] == []


def test_the_direct_sqlite_read_returns_what_mlflow_returns(uri, out):
    """Pins MLflow's SQL schema under ``store.sqlite_points`` (the one read around the client): the
    metrics table has the columns it reads, and every point equals get_metric_history's."""
    import contextlib

    from ablate.tracking.store import read_only, sqlite_points

    _, run_id = new_cell(uri)
    points = [Metric(k, float(i) * 0.5, 1000 + i, i) for i in range(7) for k in ("a", "b")]
    points.append(Metric("a", math.nan, 5000, 9))
    MlflowClient(tracking_uri=uri).log_batch(run_id, metrics=points)
    with contextlib.closing(read_only(out / "mlflow.db")) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(metrics)")}
        assert {"run_uuid", "key", "step", "timestamp", "value", "is_nan"} <= columns
        direct = sqlite_points(db, run_id)
        only_a = sqlite_points(db, run_id, "a")
    client = MlflowClient(tracking_uri=uri)
    public = [
        (m.key, m.step, m.timestamp, m.value, math.isnan(m.value))
        for k in ("a", "b")
        for m in client.get_metric_history(run_id, k)
    ]

    def canon(rows):  # NaN != NaN: compare it as a flag
        return sorted((k, s, t, 0.0 if nan else v, nan) for k, s, t, v, nan in rows)

    assert canon(direct) == canon(public) and len(direct) == 15
    assert [r[1] for r in only_a] == sorted(r[1] for r in only_a)  # by step
    assert {r[0] for r in only_a} == {"a"} and len(only_a) == 8


def test_latest_points_give_each_metrics_step_and_value(uri):
    from ablate.tracking.runs import latest_points

    tracker, run_id = new_cell(uri)
    batch = [Metric("loss", 3.0, 1, 1), Metric("loss", 2.0, 2, 4), Metric("ppl", 9.0, 1, 2)]
    MlflowClient(tracking_uri=uri).log_batch(run_id, metrics=batch)
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert latest_points(run) == {"loss": (4, 2.0), "ppl": (2, 9.0)}
    assert tracker.latest_metrics([run_id]) == {run_id: {"loss": (4, 2.0), "ppl": (2, 9.0)}}


_KILLED_WORKER = """
import os, signal, sys
from ablate.tracking import MlflowLogger
from ablate.train import RunConfig
from ablate.train.loop import train

cfg = RunConfig.from_dict(__import__("json").loads(sys.argv[3]))

class DiesAtStep13(MlflowLogger):
    def log_metrics(self, metrics, step):
        super().log_metrics(metrics, step)
        if step == 13:  # after the checkpoint of step 10, before that of step 15
            os.kill(os.getpid(), signal.SIGKILL)

# buffered until a flush: nothing reaches the store by size or time
train(cfg, DiesAtStep13(sys.argv[1], sys.argv[2], flush_points=10**6, flush_interval_s=1e9))
"""


def test_a_worker_killed_between_checkpoints_loses_no_step_on_resume(uri, tmp_path):
    import json
    import signal
    import subprocess
    import sys

    from ablate.data import DataConfig
    from ablate.train import RunConfig, TrainConfig
    from ablate.train.checkpoint import checkpoint_info
    from ablate.train.loop import train

    _, run_id = new_cell(uri)
    cfg = RunConfig(
        data=DataConfig(val_tokens=4096),
        train=TrainConfig(
            steps=16,
            batch_size=4,
            seq_len=32,
            eval_every=4,
            checkpoint_every=5,
            warmup_steps=2,
            eval_batches=4,  # of 32: the steps, not the evaluations, are what is checked
        ),
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    args = [sys.executable, "-c", _KILLED_WORKER, uri, run_id, json.dumps(cfg.to_dict())]
    res = subprocess.run(args, capture_output=True, text=True)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert checkpoint_info(tmp_path / "ckpt")["step"] == 10
    # the steps up to the checkpoint were stored before it was written
    assert steps(uri, run_id, "train_loss") == list(range(1, 11))
    result = train(cfg, MlflowLogger(uri, run_id))  # the retried worker resumes from step 10
    assert result.status == "finished"
    for key in ("train_loss", "lr", "tokens"):
        assert steps(uri, run_id, key) == list(range(0 if key == "tokens" else 1, 17)), key
    assert steps(uri, run_id, "val_loss") == [0, 4, 8, 12, 16]


def test_run_names_are_short_lead_with_what_differs_and_tell_every_cell_apart(monkeypatch):
    from ablate.study import load_study
    from ablate.tracking.vocab import cell_params, short_name

    root = Path(__file__).resolve().parents[3] / "studies"
    monkeypatch.chdir(root.parent)  # the studies' data paths are the repository root's
    qs = load_study(root / "quickstart.yaml")
    by_label = {c.label: c for c in qs.cells}
    cell = by_label["mxfp4[fprop,dgrad,wgrad]+dht16/fp8/seed1"]
    assert short_name(cell) == "dht16·fdw/fp8·s1"
    assert short_name(cell, seed=False) == "dht16·fdw/fp8"
    assert short_name(by_label["fp8/seed0"]) == "fp8·s0"
    paper = {c.label: c for c in load_study(root / "mxfp4_wgrad.yaml").cells}
    assert short_name(paper["mxfp4[fprop]/fp8/seed0"]) == "f/fp8·s0"
    assert cell_params(cell) == {
        "recipe": "mxfp4[fprop,dgrad,wgrad]+dht16/fp8",
        "fp4_gemms": "fprop+dgrad+wgrad",
        "intervention": "dht16",
        "fp4_format": "mxfp4",
        "base_format": "fp8",
    }
    recipes = load_study(root / "recipes.yaml")
    assert "nvidia_nvfp4·s2" in {short_name(c) for c in recipes.cells}
    assert "nvidia_nvfp4~wgrad.hadamard=none·s0" in {short_name(c) for c in recipes.cells}
    # a ladder's size axes move together (zipped): the first of them names the size
    ladder = {short_name(c) for c in load_study(root / "ladder.yaml").cells}
    assert {"sr·w/fp8·dim=64·steps=96·s0", "fp8·dim=128·steps=3077·s1"} <= ladder
    for path in sorted(root.glob("*.yaml")):
        study = load_study(path)
        names = [short_name(c) for c in study.cells]
        assert len(set(names)) == len(names), path.name
        # a variant of a named recipe says what changed (nvidia_nvfp4~wgrad.hadamard=none)
        assert max(map(len, names)) <= 48, path.name


def test_a_ctrl_c_inside_a_store_write_is_given_back_at_once_not_retried():
    """CI caught `ablate tune` interrupted inside MLflow's metrics INSERT: SQLAlchemy's rollback
    then failed with "database is locked" (the interrupted connection held the lock), that error
    took the Ctrl-C's place, and the store's retries spent 120 s on it, the lock held all along,
    before the interrupt handler's own writes failed the same way."""
    from ablate.tracking.store import _retry

    calls = []

    def write() -> None:
        calls.append(time.monotonic())
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise sqlite3.OperationalError("database is locked") from None

    with pytest.raises(KeyboardInterrupt):
        _retry("MLflow's log_batch", write)
    assert len(calls) == 1  # given back, not retried
