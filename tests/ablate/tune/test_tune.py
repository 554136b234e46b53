"""``ablate tune`` on real Optuna and real MLflow (SQLite under tmp_path): searches finish, the two
stores agree, a second invocation continues, diverged and failed trials are recorded and the
search goes on, bad search spaces are refused before anything is written, best.yaml plugs into a
study."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import math
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from ablate.cli import main
from ablate.driver.planning import plan
from ablate.errors import StudyError, TuneError
from ablate.study import Study, parse_study
from ablate.study.tune import plan_searches
from ablate.tune import optuna_name, run_tune, storage_url, tune_summary

TRAIN = {
    "steps": 4,
    "batch_size": 4,
    "seq_len": 32,
    "eval_every": 2,
    "warmup_steps": 1,
    "eval_batches": 2,
}


def raw_study(name: str = "tn", train: dict[str, Any] | None = None, **tune: Any) -> dict:
    return {
        "name": name,
        "base": {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 4096},
            "train": {**TRAIN, **(train or {})},
        },
        "grid": {"fp4_gemms": [[], ["fprop", "dgrad", "wgrad"]], "seed": [0, 1]},
        "tune": {
            "per": ["fp4_gemms"],
            "trials": 3,
            "sampler": {"seed": 0, "startup_trials": 2},
            "space": {
                "train.lr": {"low": 1.0e-3, "high": 1.0e-2, "log": True},
                "train.warmup_steps": {"low": 0, "high": 2},
            },
            **tune,
        },
    }


def optuna_studies(study: Study) -> dict[str, optuna.Study]:
    storage = storage_url(study)
    return {
        s.label: optuna.load_study(study_name=optuna_name(study, s), storage=storage)
        for s in plan_searches(study.file.tune, study)  # type: ignore[arg-type]
    }


def trial_runs(study: Study) -> dict[tuple[str, int], Any]:
    """(search, trial number) -> the MLflow run."""
    client = MlflowClient(tracking_uri=study.tracking_uri)
    exp = client.get_experiment_by_name(study.name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'")
    return {(r.data.tags["ablate.search"], int(r.data.tags["ablate.trial"])): r for r in runs}


def final_val_loss(study: Study, run_id: str) -> float:
    history = MlflowClient(tracking_uri=study.tracking_uri).get_metric_history(run_id, "val_loss")
    return max(history, key=lambda m: m.step).value


# --- bad search spaces -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("space", "where"),
    [
        (
            {"train.lr": {"low": 1.0e-2, "high": 1.0e-3}},
            "tune.space.train.lr.low: 0.01 is not below",
        ),
        ({"train.lr": {"low": 0.0, "high": 1.0e-2, "log": True}}, "tune.space.train.lr.low: a log"),
        (
            {"train.lrate": {"low": 1e-4, "high": 1e-2}},
            "tune.space.train.lrate: train has no field",
        ),
        ({"intervention": {"choices": []}}, "tune.space.intervention.choices: empty"),
        ({"intervention": {"choices": ["none", "dth"]}}, "tune.space.intervention.choices[1]:"),
        (
            {"train.lr": {"low": -1.0, "high": 1.0e-2}},
            "tune.space.train.lr.low: must be a positive",
        ),
        (
            {"train.warmup_steps": {"low": 0.5, "high": 4}},
            "warmup_steps.low: 0.5 is not an integer",
        ),
        ({"train.lr": {"high": 1.0e-2}}, "tune.space.train.lr.low: required"),
        ({"fp4_gemms": {"choices": [["wgrad"]]}}, "tune.space.fp4_gemms: also in tune.per"),
        ({"seed": {"low": 0, "high": 3}}, "tune.space.seed: seed is not a hyperparameter"),
        (
            {"train.steps": {"type": "float", "low": 4, "high": 8}},
            "tune.space.train.steps.type: float, but train.steps is an int field",
        ),
    ],
)
def test_a_bad_search_space_is_refused_naming_its_yaml_path(tmp_path, space, where):
    raw = raw_study()
    raw["tune"]["space"] = space
    with pytest.raises(StudyError) as e:
        parse_study(raw, output=tmp_path / "out")
    assert where in str(e.value)
    assert not (tmp_path / "out").exists()


def test_the_rest_of_a_bad_tune_section_is_refused_naming_its_yaml_path(tmp_path):
    raw = raw_study(
        per=["fp4_gemm"],
        objective="tokens_to_target",
        pruner={"kind": "threshold"},
        enqueue=[{"train.lr": 1.0}],
    )
    with pytest.raises(StudyError) as e:
        parse_study(raw, output=tmp_path / "out")
    msg = str(e.value)
    assert "tune.per[0]: 'fp4_gemm' is not an axis of this study" in msg
    assert "tune.objective: tokens_to_target needs the study's target" in msg
    assert "tune.pruner.max_val_loss: the threshold pruner needs a positive ceiling" in msg
    raw = raw_study(enqueue=[{"train.lr": 1.0, "train.wd": 0.1}], trials=0)
    with pytest.raises(StudyError) as e:
        parse_study(raw, output=tmp_path / "out")
    msg = str(e.value)
    assert "tune.trials: Input should be greater than or equal to 1" in msg
    raw = raw_study(enqueue=[{"train.lr": 1.0, "train.wd": 0.1}])
    with pytest.raises(StudyError) as e:
        parse_study(raw, output=tmp_path / "out")
    assert "tune.enqueue[0].train.lr: 1.0 is outside [0.001, 0.01]" in str(e.value)
    assert "tune.enqueue[0].train.wd: not in tune.space" in str(e.value)


def test_cli_refuses_a_bad_tune_section_with_status_2_before_writing(tmp_path):
    raw = raw_study()
    raw["tune"]["space"]["train.lr"]["low"] = 0.0
    raw["output"] = str(tmp_path / "out")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["tune", str(path), "--executor", "local"])
    assert res.exit_code == 2, res.output
    assert "tune.space.train.lr.low: a log range must be positive" in res.output
    del raw["tune"]
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["tune", str(path), "--executor", "local"])
    assert res.exit_code == 2 and "has no tune: section" in res.output
    assert not (tmp_path / "out").exists()


def test_an_int_range_on_a_float_field_is_still_accepted(tmp_path):
    raw = raw_study()
    raw["tune"]["space"]["train.warmup_steps"]["type"] = "int"
    raw["tune"]["space"]["train.grad_clip"] = {"type": "int", "low": 1, "high": 3}
    s = parse_study(raw, output=tmp_path / "out")
    assert s.file.tune is not None and s.file.tune.space["train.grad_clip"].type == "int"


def test_searches_split_the_cells_per_axis_and_start_from_the_lowest_seed(tmp_path):
    s = parse_study(raw_study(), output=tmp_path)
    searches = plan_searches(s.file.tune, s)  # type: ignore[arg-type]
    assert [x.label for x in searches] == ["bf16", "mxfp4[fprop,dgrad,wgrad]/bf16"]
    assert [x.cell.seed for x in searches] == [0, 0]
    assert searches[1].slug == "mxfp4-fprop-dgrad-wgrad-bf16"
    one = parse_study(raw_study(per=[]), output=tmp_path)
    assert [x.label for x in plan_searches(one.file.tune, one)] == ["all"]  # type: ignore[arg-type]


# --- a tiny search, end to end -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow store for the module's end-to-end studies (each has its own experiment and
    output folder): creating a store takes seconds."""
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def e2e_study(raw: dict[str, Any], store: str, output: Path) -> Study:
    raw["tracking"] = {"uri": store}
    return parse_study(raw, output=output, text="# tiny search\n")


@pytest.fixture(scope="module")
def searched(store, tmp_path_factory) -> dict[str, Any]:
    """Two searches x 3 trials; a driver killed mid-trial; a second invocation up to 4 trials."""
    study = e2e_study(raw_study(), store, tmp_path_factory.mktemp("searched") / "out")
    first = run_tune(study, executor="local")
    before = {k: (r.info.run_id, r.info.end_time) for k, r in trial_runs(study).items()}
    # a driver killed while trial 3 of the bf16 search ran: Optuna has it RUNNING, and its
    # checkpoint is there
    killed = optuna_studies(study)["bf16"].ask()
    ckpt = study.output_dir / "tune" / "bf16" / f"trial{killed.number}" / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"a killed trial's checkpoint")
    (ckpt.parent / "checkpoint.tmp").write_bytes(b"a write cut short by the kill")
    # and a finished trial's checkpoint written after the driver had removed its folder (a
    # cancelled worker's last write)
    late = study.output_dir / "tune" / "bf16" / "trial0" / "checkpoint.pt"
    late.parent.mkdir(parents=True, exist_ok=True)
    late.write_bytes(b"written as the worker died")
    second = run_tune(study, executor="local", trials=4)
    return {
        "study": study,
        "first": first,
        "second": second,
        "before": before,
        "killed": killed.number,
        "killed_checkpoint": ckpt,
        "late_checkpoint": late,
    }


def parent_tags(study: Study) -> dict[str, str]:
    client = MlflowClient(tracking_uri=study.tracking_uri)
    exp = client.get_experiment_by_name(study.name)
    assert exp is not None
    (parent,) = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'study'")
    return parent.data.tags


@pytest.mark.slow
def test_a_tiny_search_finishes_and_optuna_agrees_with_mlflow(searched):
    study, first = searched["study"], searched["first"]
    assert first.ran == 6 and not first.interrupted
    assert {(r["search"], r["n_trials"]) for r in first.summary} == {
        ("bf16", 3),
        ("mxfp4[fprop,dgrad,wgrad]/bf16", 3),
    }
    runs = trial_runs(study)
    for label, ostudy in optuna_studies(study).items():
        for t in ostudy.get_trials():
            if t.user_attrs.get("interrupted"):
                continue
            assert t.state == TrialState.COMPLETE
            run = runs[(label, t.number)]
            tags = run.data.tags
            assert tags["ablate.label"] == f"{label}/trial{t.number}"
            assert tags["ablate.status"] == "finished" and tags["ablate.tune_state"] == "COMPLETE"
            assert t.value == final_val_loss(study, run.info.run_id) == float(tags["ablate.value"])
            assert float(run.data.params["train.lr"]) == t.params["train.lr"]
            assert tags["ablate.param.train.warmup_steps"] == str(t.params["train.warmup_steps"])
            assert t.user_attrs["mlflow_run_id"] == run.info.run_id
    # trials are invisible to `ablate run`: every cell still has to run
    assert [p.action for p in plan(study)] == ["run"] * len(study.cells)


@pytest.mark.slow
def test_a_second_invocation_continues_the_searches(searched):
    study, second = searched["study"], searched["second"]
    studies = optuna_studies(study)
    bf16 = {t.number: t for t in studies["bf16"].get_trials()}
    killed = bf16[searched["killed"]]
    assert killed.state == TrialState.FAIL and killed.user_attrs["reason"].startswith("interrupted")
    # nothing resumes a trial: no folder of an ended one stays, nor a file a killed write left
    assert not searched["killed_checkpoint"].parent.exists()
    assert not searched["late_checkpoint"].parent.exists()
    assert not list((study.output_dir / "tune").glob("*/trial*"))
    assert sorted(bf16) == [0, 1, 2, 3, 4]  # numbers go on; the killed trial does not count
    assert [t.number for t in studies["mxfp4[fprop,dgrad,wgrad]/bf16"].get_trials()] == [0, 1, 2, 3]
    assert second.ran == 2
    runs = trial_runs(study)
    assert len(runs) == 8  # the killed trial never got a run
    for key, (run_id, end_time) in searched["before"].items():
        assert (runs[key].info.run_id, runs[key].info.end_time) == (run_id, end_time)
    rows = {r["search"]: r for r in second.summary}
    assert rows["bf16"]["complete"] == 4 and rows["bf16"]["n_trials"] == 5
    for row in rows.values():
        assert row["best_value"] == min(
            t.value for t in studies[row["search"]].get_trials() if t.value is not None
        )
        assert set(row["importance"]) == {"train.lr", "train.warmup_steps"}  # 4 complete, 2 params
    assert tune_summary(study) == second.summary


@pytest.mark.slow
def test_a_search_whose_space_or_start_changed_is_refused_not_mixed(searched):
    study = searched["study"]
    raw = raw_study(trials=6)
    raw["tune"]["space"]["train.warmup_steps"] = {"choices": [0, 1]}
    changed = e2e_study(raw, study.tracking_uri, study.output_dir)
    with pytest.raises(TuneError, match=r"tune.space.train.warmup_steps: Cannot set different"):
        run_tune(changed, executor="local")
    raw = raw_study(trials=6, train={"steps": 5})
    with pytest.raises(TuneError, match="its start configuration changed"):
        run_tune(e2e_study(raw, study.tracking_uri, study.output_dir), executor="local")
    assert sum(r["n_trials"] for r in tune_summary(study)) == 9  # nothing ran


@pytest.mark.slow
def test_best_yaml_plugs_into_a_study(searched, tmp_path):
    study, second = searched["study"], searched["second"]
    assert second.best_path == study.output_dir / "tune" / "best.yaml"
    fragment = yaml.safe_load(second.best_path.read_text())
    raw = raw_study(name="tuned")
    del raw["tune"]
    raw["grid"] = [{**entry, "seed": [0, 1]} for entry in fragment["grid"]]
    tuned = parse_study(raw, output=tmp_path)
    assert len(tuned.cells) == 4
    for row in second.summary:
        for c in tuned.cells:
            if c.config.recipe.short() == row["search"]:
                assert c.config.train.lr == row["best_params"]["train.lr"]
                assert c.config.train.warmup_steps == row["best_params"]["train.warmup_steps"]


@pytest.mark.slow
def test_cli_tune_prints_the_best_parameters_per_search(searched, tmp_path):
    study = searched["study"]
    raw = raw_study(trials=4)
    raw["output"] = str(study.output_dir)
    raw["tracking"] = {"uri": study.tracking_uri}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["tune", str(path), "--executor", "local"])
    assert res.exit_code == 0, res.output
    assert "0 to run" in res.output
    assert "bf16: 5 trials (4 complete, 0 pruned, 0 failed); best final_val_loss" in res.output
    # the parent's count is the searches' (4 + 4 that count), not this invocation's 0
    assert parent_tags(study)["ablate.tune_trials"] == "8"


# --- a damaged or foreign optuna.db ------------------------------------------------------------------


def spoil(db: Path, kind: str) -> bytes:
    """Write a file at ``db`` that is no Optuna storage; its bytes."""
    db.parent.mkdir(parents=True, exist_ok=True)
    if kind == "damaged":
        db.write_bytes(bytes(range(256)) * 12)
    else:  # another SQLite database, as a copy of mlflow.db would be
        with contextlib.closing(sqlite3.connect(db)) as c, c:
            c.execute("CREATE TABLE runs (run_uuid TEXT)")
    return db.read_bytes()


SPOILED = {"damaged": "is damaged or not a SQLite database", "foreign": "is not an Optuna storage"}


@pytest.mark.parametrize("kind", ["damaged", "foreign"])
def test_cli_tune_refuses_a_damaged_or_foreign_optuna_db_untouched(tmp_path, kind):
    raw = raw_study(per=[], trials=1)
    raw.update(grid={"fp4_gemms": [[]]}, output=str(tmp_path / "out"))
    db = tmp_path / "out" / "optuna.db"
    before = spoil(db, kind)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["tune", str(path), "--executor", "local"])
    assert res.exit_code == 2, res.output
    assert f"{db.resolve()} {SPOILED[kind]}" in res.output
    assert db.read_bytes() == before
    assert sorted(p.name for p in db.parent.iterdir()) == ["optuna.db"]  # no mlflow.db either


@pytest.mark.slow
def test_report_leaves_out_the_tuning_of_a_damaged_or_foreign_optuna_db(store, tmp_path):
    from ablate.driver.runner import run_study
    from ablate.report.study import report_study

    raw = raw_study("reported", per=[], trials=1)
    raw.update(grid={"fp4_gemms": [[]], "seed": [0]}, baseline={"fp4_gemms": []})
    raw["target"] = {"val_ppl": 200.0}
    study = e2e_study(raw, store, tmp_path / "out")
    run_study(study, executor="local", progress=False, stream=io.StringIO())
    for kind in ("damaged", "foreign"):
        db = study.output_dir / "optuna.db"
        before = spoil(db, kind)
        report_study(study, out_dir=tmp_path / kind, attach=False)
        md = (tmp_path / kind / "report.md").read_text()
        assert f"No tuning section: the Optuna storage {db.resolve()}" in md or (
            f"No tuning section: {db.resolve()} is not an Optuna storage" in md
        )
        assert SPOILED[kind] in md
        assert db.read_bytes() == before
        db.unlink()


# --- Ctrl-C ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_fails_the_trial_in_flight_and_deletes_its_checkpoint(store, tmp_path):
    raw = raw_study("ctrlc", per=[], trials=2)
    raw["grid"] = {"fp4_gemms": [[]]}
    raw["base"]["train"].update(steps=400, eval_every=200, checkpoint_every=2)
    study = e2e_study(raw, store, tmp_path / "out")
    ckpt = study.output_dir / "tune" / "all" / "trial0" / "checkpoint.pt"
    stop = threading.Event()

    def ctrl_c_once_checkpointed() -> None:
        while not stop.is_set() and not ckpt.exists():
            time.sleep(0.01)
        if not stop.is_set():
            # as if Ctrl-C came while the driver started the next trial: Optuna has it RUNNING
            optuna_studies(study)["all"].ask()
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    watcher = threading.Thread(target=ctrl_c_once_checkpointed)
    watcher.start()
    try:
        res = run_tune(study, executor="local", stream=io.StringIO())
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGINT, before)
    assert res.interrupted and res.ran == 0
    for t in optuna_studies(study)["all"].get_trials():  # none left RUNNING
        assert t.state == TrialState.FAIL and t.user_attrs["reason"] == "interrupted: Ctrl-C"
    assert not ckpt.parent.exists()  # nothing resumes an interrupted trial
    assert [r["n_trials"] for r in res.summary] == [2] and res.summary[0]["failed"] == 0
    assert parent_tags(study)["ablate.tune_status"] == "interrupted"


# --- failing trials ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_diverged_and_invalid_trials_are_recorded_and_the_search_goes_on(store, tmp_path):
    lr = {"choices": [3.0e-3, 50.0]}
    raw = raw_study(
        "failing",
        per=[],
        trials=3,
        space={
            "train.lr": lr,
            "train.batch_size": {"choices": [4, 6]},
            "train.grad_accum": {"choices": [1, 4]},  # each fine alone, 4 does not divide 6
        },
        enqueue=[
            {"train.lr": 50.0, "train.batch_size": 4, "train.grad_accum": 1},  # diverges
            {"train.lr": 3.0e-3, "train.batch_size": 6, "train.grad_accum": 4},  # invalid
            {"train.lr": 3.0e-3, "train.batch_size": 4, "train.grad_accum": 1},
        ],
    )
    raw["grid"] = {"fp4_gemms": [[]]}
    study = e2e_study(raw, store, tmp_path / "out")
    res = run_tune(study, executor="local")
    assert res.ran == 3
    trials = optuna_studies(study)["all"].get_trials()
    runs = trial_runs(study)
    diverged, invalid, good = trials
    assert diverged.state == TrialState.PRUNED
    assert diverged.user_attrs["reason"].startswith("diverged at step")
    tags = runs[("all", 0)].data.tags
    assert tags["ablate.status"] == "diverged" and tags["ablate.tune_state"] == "PRUNED"
    assert tags["ablate.reason"] == diverged.user_attrs["reason"]
    assert invalid.state == TrialState.FAIL and "grad_accum" in invalid.user_attrs["reason"]
    assert runs[("all", 1)].data.tags["ablate.tune_state"] == "FAIL"
    assert good.state == TrialState.COMPLETE and math.isfinite(good.value)
    assert res.summary[0]["best_trial"] == 2


@pytest.mark.slow
def test_the_threshold_pruner_judges_a_local_trial_after_it_ends(store, tmp_path):
    raw = raw_study("pruned", per=[], trials=1, pruner={"kind": "threshold", "max_val_loss": 1.0})
    raw["grid"] = {"fp4_gemms": [[]]}
    study = e2e_study(raw, store, tmp_path / "out")
    run_tune(study, executor="local")
    (t,) = optuna_studies(study)["all"].get_trials()
    assert t.state == TrialState.PRUNED
    assert t.user_attrs["reason"].startswith("pruned by the threshold pruner at step 0")
    tags = trial_runs(study)[("all", 0)].data.tags
    assert tags["ablate.status"] == "finished" and tags["ablate.tune_state"] == "PRUNED"
    assert not (study.output_dir / "tune" / "all" / "trial0" / "checkpoint.pt").exists()


@pytest.mark.slow
def test_tokens_to_target_scores_reached_and_missed_targets(store, tmp_path):
    tokens = TRAIN["steps"] * TRAIN["batch_size"] * TRAIN["seq_len"]
    values = {}
    # a perplexity target and a loss target (nats: log 1.01), as a study may write either
    for name, target in (("reached", {"val_ppl": 200.0}), ("missed", {"val_loss": 0.00995})):
        raw = raw_study(name, per=[], trials=1, objective="tokens_to_target")
        raw.update(grid={"fp4_gemms": [[]]}, target=target)
        study = e2e_study(raw, store, tmp_path / name)
        res = run_tune(study, executor="local")
        (t,) = optuna_studies(study)["all"].get_trials()
        assert t.state == TrialState.COMPLETE and res.summary[0]["best_value"] == t.value
        values[name] = (t.value, t.user_attrs["reached_target"])
    assert 0 < values["reached"][0] <= tokens and values["reached"][1] is True
    assert values["missed"] == (2 * tokens, False)  # NOT_REACHED_FACTOR x the trial's tokens


def test_tokens_to_target_from_a_baseline_without_results_is_refused_before_writing(tmp_path):
    raw = raw_study(objective="tokens_to_target")
    raw["baseline"] = {"fp4_gemms": []}
    study = parse_study(raw, output=tmp_path / "out")
    with pytest.raises(
        TuneError, match=r"derived from the baseline \(slowest\), but the study has no"
    ):
        run_tune(study, executor="local")
    assert not (tmp_path / "out").exists()


# --- Ray ------------------------------------------------------------------------------------------------


def _cancel_returns_once_the_worker_ended(study: Study, trial: Any, folder: Path) -> bool:
    """Whether ``RayExecutor.cancel`` of a task that trains (the study's cell, a checkpoint every
    step) and of one queued behind it, at once (as Ctrl-C cancels a search's trials), leaves the
    first task's worker process ended (gone, or a zombie) and the other never started. Ray reports
    a force-cancelled task ended once its worker has been told to exit, which it does within
    moments (a busy machine delays it): ended within ``KILLED_S`` of cancel's return."""
    from ablate.executor import RayExecutor
    from ablate.executor.task import Task
    from ablate.tracking import StudyTracker

    parent = trial.data.tags["mlflow.parentRunId"]
    tracker = StudyTracker(study.tracking_uri, study.name)
    folder.mkdir()  # as a study's cells/ is: each task's folder is made in it
    ex = RayExecutor(max_concurrent=1)
    try:
        rid = ""
        for key in ("late", "queued"):
            cfg = dataclasses.replace(
                study.cells[0].config,
                checkpoint_dir=str(folder / key),
                data_cache=str(study.data_cache()),
            ).to_dict()
            rid = rid or tracker.create_run(parent, key, key, {}, cfg)
            ex.submit(Task(key, key, cfg, study.tracking_uri, rid, os.getcwd()))
        deadline = time.monotonic() + 120
        while not (folder / "late" / "checkpoint.pt").exists():
            assert time.monotonic() < deadline, "the task did not checkpoint in 120 s"
            ended = ex.wait(0.02)
            assert not ended, ended
        pid = int(MlflowClient(study.tracking_uri).get_run(rid).data.tags["ablate.pid"])
        ex.cancel("late", "queued")
        assert len(ex) == 0 and not ex.wait(0.1)  # nothing left, nothing dispatched
        assert not (folder / "queued").exists()
        deadline = time.monotonic() + KILLED_S
        while time.monotonic() < deadline:
            try:
                if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                    return True
            except FileNotFoundError:
                return True
            time.sleep(0.01)
        return False
    finally:
        ex.close()


KILLED_S = 10.0
"""How long a force-cancelled worker may take to exit once ``cancel`` returned."""


@pytest.mark.slow
def test_ray_cancels_a_trial_the_pruner_stops(store, tmp_path):
    import ray

    raw = raw_study("ray", per=[], trials=1, pruner={"kind": "threshold", "max_val_loss": 1.0})
    raw["grid"] = {"fp4_gemms": [[]]}
    # a checkpoint every step: the worker is most likely writing one when it is cancelled
    raw["base"]["train"].update(steps=2000, eval_every=50, checkpoint_every=1)
    study = e2e_study(raw, store, tmp_path / "out")
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20)
    try:
        res = run_tune(study, executor="ray", poll_s=0.5)
        run = trial_runs(study)[("all", 0)]
        ended = _cancel_returns_once_the_worker_ended(study, run, tmp_path / "late")
    finally:
        ray.shutdown()
    # a killed worker that went on writing could leave a checkpoint (or the checkpoint.tmp of a
    # write cut short) after the driver removed the trial's folder; the next tune removes them
    assert ended
    (t,) = optuna_studies(study)["all"].get_trials()
    assert t.state == TrialState.PRUNED and "at step 0" in t.user_attrs["reason"]
    assert run.data.tags["ablate.status"] == "interrupted"
    assert run.data.tags["ablate.tune_state"] == "PRUNED"
    steps = MlflowClient(tracking_uri=study.tracking_uri).get_metric_history(
        run.info.run_id, "train_loss"
    )
    assert max((m.step for m in steps), default=0) < 2000  # stopped, not run to its end
    assert res.ran == 1
    # the cancelled worker was gone before its trial's folder was removed: nothing written after
    assert not (study.output_dir / "tune" / "all" / "trial0").exists()


def test_the_study_file_tune_lr_is_valid():
    path = Path(__file__).resolve().parents[3] / "studies" / "tune_lr.yaml"
    raw = yaml.safe_load(path.read_text())
    study = parse_study(copy.deepcopy(raw), check_files=False)
    searches = plan_searches(study.file.tune, study)  # type: ignore[arg-type]
    assert len(searches) == 2
