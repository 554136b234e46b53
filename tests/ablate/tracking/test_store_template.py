"""A new SQLite store is a copy of the empty store MLflow built once (``store.new_sqlite_store``):
the copy holds what MLflow's own creation holds, table for table and row for row (the default
experiment's location and times set as MLflow sets them), and a template that is damaged, of
another schema revision or not a store is rebuilt, never copied."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ablate.tracking import store


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # MLflow puts the default experiment's artifacts under the cwd
    return tmp_path / "cache"


def _contents(path: Path) -> tuple[dict[str, object], tuple[int, int]]:
    """Every table's definition (its lines as a set: MLflow's migrations write a table's
    constraints in an order that varies from one process to the next) and rows, the default
    experiment's times apart; and those times."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = db.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY 1, 2"
        ).fetchall()
        out: dict[str, object] = {
            "schema": [
                (kind, name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
                for kind, name, sql in tables
            ]
        }
        for kind, name, _ in tables:
            if kind == "table" and name != "experiments":
                out[name] = sorted(map(repr, db.execute(f'SELECT * FROM "{name}"').fetchall()))
        out["experiments"] = db.execute(
            "SELECT experiment_id, name, artifact_location, lifecycle_stage, workspace "
            "FROM experiments"
        ).fetchall()
        times = db.execute(
            "SELECT creation_time, last_update_time FROM experiments WHERE experiment_id = 0"
        ).fetchone()
    return out, times


def test_a_new_store_holds_what_mlflow_creates_itself(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with monkeypatch.context() as m:  # the template is built from another working directory
        m.chdir(elsewhere)
        store.new_sqlite_store(tmp_path / "first.db")
    assert (cache / "mlflow-store").is_dir()
    started = int(time.time() * 1000)
    ours = tmp_path / "ours" / "mlflow.db"
    ours.parent.mkdir()
    store.new_sqlite_store(ours)
    theirs = tmp_path / "theirs" / "mlflow.db"
    theirs.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{theirs}").search_experiments()
    (a, ours_times), (b, theirs_times) = _contents(ours), _contents(theirs)
    assert a["experiments"] == b["experiments"]  # location <cwd>/mlruns/0, name, stage
    assert a == b  # every table, its definition and its rows
    for created, updated in (ours_times, theirs_times):
        assert started <= created == updated <= int(time.time() * 1000)
    client = MlflowClient(tracking_uri=f"sqlite:///{ours}")  # MLflow opens and writes it
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "loss", 1.5, step=1)
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == [1.5]


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "not a database",
        "another schema revision",
        "a store with runs in it",
    ],
)
def test_a_template_that_fails_its_checks_is_rebuilt_not_copied(
    cache: Path, tmp_path: Path, damage: str
) -> None:
    first = tmp_path / "first.db"
    store.new_sqlite_store(first)
    (template,) = (cache / "mlflow-store").rglob("empty.db")
    if damage == "truncated":
        template.write_bytes(template.read_bytes()[:3000])
    elif damage == "not a database":
        template.write_text("print('never run')\n")
    else:
        with contextlib.closing(sqlite3.connect(template)) as db, db:
            if damage == "another schema revision":
                db.execute("UPDATE alembic_version SET version_num = '0000old'")
            else:
                db.execute(
                    "INSERT INTO runs (run_uuid, experiment_id, lifecycle_stage, status) "
                    "VALUES ('r', 0, 'active', 'FINISHED')"
                )
    again = tmp_path / "again.db"
    store.new_sqlite_store(again)
    assert _contents(again)[0] == _contents(first)[0]
    assert _contents(template)[0] == _contents(first)[0]  # rebuilt in place


def test_an_empty_cache_dir_is_the_default_not_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ABLATE_CACHE_DIR", "")  # as ABLATE_DATA_CACHE="": unset
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    store.new_sqlite_store(tmp_path / "s.db")
    assert (tmp_path / "home" / ".cache" / "ablate" / "mlflow-store").is_dir()
    assert not (work / "mlflow-store").exists()
