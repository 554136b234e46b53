"""The runner end to end, on real MLflow (SQLite under tmp_path) and real Ray: what lands in the
store, resume after a killed worker or an interrupted driver, and nothing finished is rerun."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

from ablate.driver.planning import plan, plan_cell
from ablate.driver.runner import run_study
from ablate.driver.setup import study_lock
from ablate.errors import RunnerError
from ablate.study import Study, parse_study
from ablate.tracking import CellRun

METRICS = ("train_loss", "lr", "grad_norm", "tokens_per_s")  # every step from 1; tokens from 0


def tiny_study(
    tmp_path: Path, *, steps: int = 6, name: str = "t", eval_batches: int = 4, **grid: Any
) -> Study:
    """A study of the ``tiny`` preset; each evaluation reads ``eval_batches`` of its 32 validation
    batches (0: all)."""
    raw = {
        "name": name,
        "base": {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 4096},
            "train": {
                "steps": steps,
                "batch_size": 4,
                "seq_len": 32,
                "eval_every": 3,
                "eval_batches": eval_batches,
                "warmup_steps": 2,
            },
        },
        "grid": grid or {"fp4_gemms": [[], ["fprop", "dgrad", "wgrad"]], "seed": [0]},
        "resources": {"cpus": 1},
    }
    return parse_study(raw, output=tmp_path / "out", text="# test study\n")


def histories(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def assert_store_holds(study: Study, *, expect_steps: int, eval_every: int = 3) -> dict[str, str]:
    """One child run per cell, params and tags as recorded, every step of every metric once."""
    client = MlflowClient(tracking_uri=study.tracking_uri)
    exp = client.get_experiment_by_name(study.name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'")
    by_key = {r.data.tags["ablate.key"]: r for r in runs}
    assert len(runs) == len(study.cells) == len(by_key)
    parents = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'study'")
    assert len(parents) == 1
    for c in study.cells:
        r = by_key[c.key]
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert r.data.tags["ablate.label"] == c.label
        assert r.data.tags["ablate.config"] == c.config_label
        assert r.data.tags["ablate.status"] == "finished"
        assert r.info.status == "FINISHED"
        assert r.data.params["train.steps"] == str(expect_steps)
        assert r.data.params["seed"] == str(c.seed)
        for key in METRICS:
            assert histories(client, r.info.run_id, key) == list(range(1, expect_steps + 1)), key
        assert histories(client, r.info.run_id, "tokens") == list(range(expect_steps + 1))
        evals = list(range(0, expect_steps + 1, eval_every))
        assert histories(client, r.info.run_id, "val_loss") == evals
    return {k: r.info.run_id for k, r in by_key.items()}


# --- planning ------------------------------------------------------------------------------------------


def _run(status: str) -> CellRun:
    return CellRun(run_id="r", key="k", label="l", status=status, last_step=4, tags={})


@pytest.mark.parametrize(
    "status, rerun_failed, action",
    [
        (None, False, "run"),
        ("finished", False, "skip"),
        ("diverged", False, "skip"),
        ("failed", False, "failed"),
        ("failed", True, "rerun"),
        ("running", False, "resume"),
        ("interrupted", False, "resume"),
        ("pending", False, "resume"),
    ],
)
def test_plan_decides_from_the_recorded_status(tmp_path, status, rerun_failed, action):
    cell = tiny_study(tmp_path).cells[0]
    p = plan_cell(cell, _run(status) if status else None, rerun_failed=rerun_failed, ckpt_step=4)
    assert p.action == action


def test_plan_creates_nothing(tmp_path):
    s = tiny_study(tmp_path)
    assert [p.action for p in plan(s)] == ["run", "run"]
    assert not (tmp_path / "out").exists()


def test_one_driver_per_study(tmp_path):
    with (
        study_lock(tmp_path / "out"),
        pytest.raises(RunnerError, match="another `ablate run`"),
        study_lock(tmp_path / "out"),
    ):
        pass
    with study_lock(tmp_path / "out"):  # released
        pass


# --- in-process executor -------------------------------------------------------------------------------


def test_local_executor_records_every_cell_and_rerun_skips_them(tmp_path):
    s = tiny_study(tmp_path)
    res = run_study(s, executor="local", progress=False)
    assert {o.status for o in res.outcomes.values()} == {"finished"}
    ids = assert_store_holds(s, expect_steps=6)
    assert not list(Path.cwd().glob("mlruns"))  # nothing written outside the output folder
    again = run_study(s, executor="local", progress=False)
    assert again.outcomes == {}
    assert [p.action for p in again.planned] == ["skip", "skip"]
    assert assert_store_holds(s, expect_steps=6) == ids


def test_interrupted_cells_resume_in_the_same_run_without_duplicate_steps(tmp_path):
    s = tiny_study(tmp_path, steps=9)
    first = run_study(s, executor="local", progress=False, stop_after=4)
    assert {o.status for o in first.outcomes.values()} == {"interrupted"}
    assert [p.action for p in plan(s)] == ["resume", "resume"]
    second = run_study(s, executor="local", progress=False)
    assert {o.status for o in second.outcomes.values()} == {"finished"}
    assert_store_holds(s, expect_steps=9)


def test_a_failing_cell_is_recorded_and_rerun_only_when_asked(tmp_path):
    s = tiny_study(tmp_path)
    bad = s.cells[1]
    # changed after planning (the keys stay as planned) to heads that do not divide the width:
    # the data is prepared and checked before anything starts, so this cell fails when its worker
    # builds the model
    n_heads = bad.config.model.n_heads
    bad.config.model.n_heads = 7
    res = run_study(s, executor="local", progress=False)
    assert res.outcomes[s.cells[0].key].status == "finished"
    assert res.outcomes[bad.key].status == "failed"
    assert "n_heads" in res.outcomes[bad.key].reason
    client = MlflowClient(tracking_uri=s.tracking_uri)
    run = client.search_runs(
        [client.get_experiment_by_name("t").experiment_id], f"tags.`ablate.key` = '{bad.key}'"
    )[0]
    assert run.info.status == "FAILED" and "n_heads" in run.data.tags["ablate.reason"]
    assert "Traceback" in run.data.tags["ablate.traceback"]
    assert [p.action for p in plan(s)] == ["skip", "failed"]
    assert run_study(s, executor="local", progress=False).outcomes == {}
    bad.config.model.n_heads = n_heads
    res = run_study(s, executor="local", progress=False, rerun_failed=True)
    assert list(res.outcomes) == [bad.key] and res.outcomes[bad.key].status == "finished"
    assert_store_holds(s, expect_steps=6)


def test_a_local_cell_leaves_the_drivers_threads_and_directory_as_they_were(tmp_path):
    """The local executor runs a cell in this process; the cell's thread count (resources.cpus)
    and working directory must not stay: compiled code built next would see one thread."""
    s = tiny_study(tmp_path, seed=[0])
    torch.set_num_threads(2)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        run_study(s, executor="local", progress=False)
        assert torch.get_num_threads() == 2 and os.getcwd() == str(tmp_path)
    finally:
        os.chdir(cwd)


def test_a_device_that_cannot_run_the_study_fails_before_anything_is_written(tmp_path):
    s = tiny_study(tmp_path)
    s.cells[1].config.device = "cuda:7"
    s.file.resources.gpus = 1  # with none, the cell is refused for that (test_devices.py)
    with pytest.raises(
        RunnerError, match=r"cannot run the study:\n  cells mxfp4.*:\n    device: 'cuda:7'"
    ):
        run_study(s, executor="local", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_changed_config_gets_a_new_run_not_the_old_one(tmp_path):
    s = tiny_study(tmp_path, seed=[0])
    run_study(s, executor="local", progress=False)
    s2 = tiny_study(tmp_path, steps=7, seed=[0])
    assert s2.cells[0].key != s.cells[0].key
    assert [p.action for p in plan(s2)] == ["run"]


# --- Ray ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_waves_train_on_ray_and_a_drained_wave_goes_on_in_the_next_run(tmp_path, ray_cluster):
    # what an allocation of `ablate slurm` does with a study of sequential seeds (Ray, drained on
    # SLURM's signal, the requeued job running the study again): the first run is drained once a
    # cell of wave 1 ended. Either the drain catches wave 1's other cells (they stop, and the next
    # run finishes wave 1 from the store, judges it and trains wave 2), or every cell of wave 1 has
    # ended by the time it is asked (a busy machine): then wave 2 never starts, the next run replays
    # wave 1 and trains wave 2. No run goes on to another wave once drained.
    from test_waves import _raw

    raw = _raw(grid={"fp4_gemms": [[], ["fprop", "dgrad", "wgrad"]]}, baseline={"fp4_gemms": []})
    s = parse_study(raw, output=tmp_path / "out", text="# waves\n")
    ended: dict[str, str] = {}
    first, second = io.StringIO(), io.StringIO()
    res = run_study(
        s, executor="ray", progress=False, stream=first,
        on_outcome=lambda cell, o: ended.setdefault(cell.key, o.status),
        drain=lambda: "SIGTERM: the job is requeued" if ended else "",
    )  # fmt: skip
    assert res.interrupted, first.getvalue()
    assert "wave 1:" in first.getvalue() and "wave 2:" not in first.getvalue()
    finished = [k for k, status in ended.items() if status == "finished"]
    assert 1 <= len(finished) <= 6, ended  # the others interrupted, or never started
    between = len(finished) == 6  # the drain came after wave 1's last cell
    assert between == ("wave 2 starts when the study runs again" in first.getvalue()), (
        first.getvalue()
    )
    res = run_study(s, executor="ray", progress=False, stream=second)
    text = second.getvalue()
    assert not res.interrupted and not res.failed, text
    fp4 = "mxfp4[fprop,dgrad,wgrad]/bf16"
    if between:  # wave 1 replays from the store without passing through the runner
        assert "waves 1-1: replayed from the store" in text and "6 cells" not in text
    else:  # wave 1 had cells left: it runs again, its ended cells skipped
        assert "replayed" not in text
        assert f"wave 1: seeds per configuration: {fp4} 3" in text
        assert f"6 cells: {6 - len(finished)} resume, {len(finished)} skip" in text
    assert f"wave 2: seeds per configuration: {fp4} 4" in text and "8 cells: 2 run, 6 skip" in text
    assert f"{fp4} (4 seeds): open" in text and "open at seeds.max (4)" in text
    # seeds 0-3 of both, on Ray's two CPUs into one store: each cell once, every step once
    assert_store_holds(s, expect_steps=40, eval_every=4)


@pytest.mark.slow
def test_a_killed_worker_resumes_from_its_checkpoint(tmp_path, ray_cluster):
    steps = 40
    s = tiny_study(tmp_path, steps=steps, seed=[0], fp4_gemms=[["fprop", "dgrad", "wgrad"]])
    cell = s.cells[0]
    object.__setattr__(cell.config.train, "checkpoint_every", 5)
    ckpt = s.checkpoint_dir(cell) / "checkpoint.pt"
    killed: list[int] = []
    # imported here, not first in the thread below while the driver imports it too (a module
    # imported from two threads at once can fail with a circular-import error)
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

    def killer() -> None:
        client = MlflowClient(tracking_uri=s.tracking_uri)
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            time.sleep(0.2)
            try:
                exp = client.get_experiment_by_name(s.name)
                runs = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'")
            except Exception:
                continue
            if not runs or "ablate.pid" not in runs[0].data.tags or not ckpt.exists():
                continue
            steps_logged = histories(client, runs[0].info.run_id, "train_loss")
            if steps_logged and max(steps_logged) >= 12:
                pid = int(runs[0].data.tags["ablate.pid"])
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    t = threading.Thread(target=killer)
    t.start()
    res = run_study(s, executor="ray", progress=False)
    t.join()
    assert killed, "the worker was never killed"
    assert res.outcomes[cell.key].status == "finished"
    client = MlflowClient(tracking_uri=s.tracking_uri)
    run = client.get_run(
        MlflowClient(tracking_uri=s.tracking_uri)
        .search_runs(
            [client.get_experiment_by_name(s.name).experiment_id], "tags.`ablate.role` = 'cell'"
        )[0]
        .info.run_id
    )
    assert int(run.data.tags["ablate.pid"]) != killed[0]  # a new worker finished it
    assert run.data.tags["ablate.resumed_from"] not in ("", "0")  # from a checkpoint, not step 0
    for key in METRICS:
        assert histories(client, run.info.run_id, key) == list(range(1, steps + 1))
    # the resumed run ends exactly where an uninterrupted one does
    ref = tiny_study(
        tmp_path / "ref", steps=steps, seed=[0], fp4_gemms=[["fprop", "dgrad", "wgrad"]]
    )
    object.__setattr__(ref.cells[0].config.train, "checkpoint_every", 5)
    ref_res = run_study(ref, executor="local", progress=False)
    assert res.outcomes[cell.key].final_val_loss == ref_res.outcomes[cell.key].final_val_loss


def test_a_ctrl_c_that_something_swallows_still_interrupts_the_study(tmp_path):
    # a library that swallows the KeyboardInterrupt inside a cell must not make the driver miss
    # the Ctrl-C: the driver notes every SIGINT itself and stops at the next cell boundary
    study = tiny_study(tmp_path, steps=2, seed=[0, 1, 2])

    def swallow(cell, outcome):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the KeyboardInterrupt arrives here and is swallowed
        except KeyboardInterrupt:
            pass

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        res = run_study(study, executor="local", progress=False, on_outcome=swallow)
        assert res.interrupted and len(res.outcomes) == 1
        assert [p.action for p in plan(study)].count("skip") == 1
        # the handler is Python's again afterwards
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.slow
def test_interrupting_the_driver_keeps_finished_cells(tmp_path):
    study_file = tmp_path / "s.yaml"
    study_file.write_text(
        f"""
name: intr
output: {tmp_path / "out"}
base:
  model: {{preset: tiny}}
  data: {{val_tokens: 4096}}
  train: {{steps: 30, batch_size: 4, seq_len: 32, eval_every: 5, eval_batches: 4, warmup_steps: 2}}
grid: {{seed: [0, 1, 2]}}
"""
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ablate.cli", "run", str(study_file), "--executor", "local"]
    # the driver as in a terminal: SIGINT at its default even when the tests run as a background
    # job (a shell starts those with SIGINT ignored, and a child inherits that)
    proc = subprocess.Popen(
        cmd,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "[1/3]" in line:  # the first cell ended: interrupt the driver during the second
            # (every cell's run exists from the study's start, so the second is "resume" from here
            # on; 1 s, once the middle of its training, was past its end at times)
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, "".join(lines) + rest
    assert "interrupted" in rest
    from ablate.study import load_study

    s = load_study(study_file)
    actions = [p.action for p in plan(s)]
    assert actions[0] == "skip" and actions[1] == "resume", actions
    client = MlflowClient(tracking_uri=s.tracking_uri)
    exp = client.get_experiment_by_name("intr")
    first = client.search_runs([exp.experiment_id], f"tags.`ablate.key` = '{s.cells[0].key}'")[0]
    res = run_study(s, executor="local", progress=False)
    assert s.cells[0].key not in res.outcomes  # not rerun
    assert client.get_run(first.info.run_id).info.end_time == first.info.end_time
    assert_store_holds_30 = [
        histories(client, r.info.run_id, "train_loss")
        for r in client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'")
    ]
    assert all(h == list(range(1, 31)) for h in assert_store_holds_30)


def test_a_cell_starts_its_run_clock_when_it_starts_not_when_it_was_queued(tmp_path):
    # the driver creates every run when the study starts; the local executor trains one cell at a
    # time, so the second cell waited for the first: its MLflow start is after the first's end
    study = tiny_study(tmp_path, steps=3, seed=[0, 1])
    run_study(study, executor="local", progress=False)
    client = MlflowClient(tracking_uri=study.tracking_uri)
    runs = sorted(
        (client.get_run(c.run.run_id) for c in _statuses(study)),
        key=lambda r: r.info.start_time,
    )
    first, second = runs
    assert second.info.start_time >= first.info.end_time - 50  # ms; not created-at-queue time
    assert second.info.end_time - second.info.start_time < 60_000
    # the one write around MLflow's client: the column it sets is MLflow's
    import sqlite3

    db = sqlite3.connect(study.output_dir / "mlflow.db")
    assert "start_time" in {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    db.close()


def _statuses(study):
    from ablate.tracking import study_status

    return [cs for cs in study_status(study) if cs.run is not None]
