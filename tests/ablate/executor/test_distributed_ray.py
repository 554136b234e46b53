"""Multi-worker cells through ``ablate run``: real Ray, Ray Train's ``TorchTrainer`` with 2 gloo
workers on this machine's CPUs, a real MLflow store: a DDP cell finishes with every metric step
logged once after a worker killed mid-run is restarted by Ray Train, bit-identical to an
uninterrupted 2-worker run, and what cannot run is refused before anything starts. An FSDP cell on
Ray Train: ``test_cluster`` (two nodes); DDP and FSDP train alike: ``test_distributed``."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from test_distributed import two_ranks

from ablate.driver.preflight import preflight
from ablate.driver.runner import run_study
from ablate.errors import CannotRunError
from ablate.study import Study, parse_study

METRICS = ("train_loss", "lr", "grad_norm", "tokens_per_s")


def study(tmp_path: Path, *, steps: int, workers: int = 2, cpus: float = 1, **grid: Any) -> Study:
    raw = {
        "name": "dp",
        "base": {
            "device": "cpu",
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 4096},
            "train": {
                "steps": steps,
                "batch_size": 4,
                "seq_len": 32,
                "eval_every": 3,
                "warmup_steps": 2,
                "checkpoint_every": 3,
                "eval_batches": 2,  # of 32: a full evaluation took half of a worker's steps
            },
        },
        "grid": grid or {"seed": [0]},
        "resources": {"cpus": cpus, "workers": workers, "max_retries": 2},
    }
    return parse_study(raw, output=tmp_path / "out", text="# test study\n")


def cell_runs(s: Study) -> list[Any]:
    client = MlflowClient(tracking_uri=s.tracking_uri)
    exp = client.get_experiment_by_name(s.name)
    assert exp is not None
    return client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'")


def test_what_cannot_run_is_refused_before_anything_starts(tmp_path):
    s = study(tmp_path, steps=2, workers=4, cpus=1)  # 4 x 1 CPU on a 2-CPU machine
    with pytest.raises(CannotRunError, match=r"resources.cpus: 1 per worker x resources.workers 4"):
        preflight(s, executor="ray", num_cpus=2)
    with pytest.raises(CannotRunError, match="resources.workers: 4 workers .* ray executor"):
        preflight(s, executor="local")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_ddp_cell_finishes_and_a_killed_worker_resumes_bit_identical(tmp_path):
    """A 2-worker DDP cell (MXFP4 + SR on wgrad: random streams that a resume must restore) whose
    rank 1 is killed mid-run: Ray Train restarts its group from the checkpoint, the cell finishes
    with every metric step logged once and ends bit-identical to an uninterrupted 2-worker run. (An
    FSDP cell of its own here cost a third worker group, about 35 s of the suite's CPU; it runs on
    two nodes in ``test_cluster``.)"""
    steps = 24
    s = study(
        tmp_path, steps=steps, intervention=["sr"], fp4_gemms=[["wgrad"]],
        **{"train.parallel": ["ddp"]},
    )  # fmt: skip
    (killed_cell,) = s.cells
    sidecar = s.checkpoint_dir(killed_cell) / "checkpoint.json"
    killed: list[int] = []
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (not first from the thread)

    def killer() -> None:
        # the store is asked only once the cell has checkpointed: a client made before the driver
        # has made the store creates it (every MLflow migration, 5 s of CPU), and a search every
        # 0.2 s from the start took 12 s
        deadline = time.time() + 240
        while time.time() < deadline and not killed:
            time.sleep(0.2)
            if not sidecar.exists():
                continue
            try:
                client = MlflowClient(tracking_uri=s.tracking_uri)
                runs = [r for r in cell_runs(s) if r.data.tags["ablate.key"] == killed_cell.key]
            except Exception:
                continue
            if not runs or "ablate.worker_pids" not in runs[0].data.tags:
                continue
            logged = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train_loss")]
            if logged and max(logged) >= 8:
                pid = int(runs[0].data.tags["ablate.worker_pids"].split(",")[1])  # rank 1
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    t = threading.Thread(target=killer)
    t.start()
    t0 = time.perf_counter()
    res = run_study(s, executor="ray", progress=False)
    print(f"2-worker cell ({steps} steps, one worker killed): {time.perf_counter() - t0:.1f} s")
    t.join()
    assert killed, "no worker was killed"
    assert {o.status for o in res.outcomes.values()} == {"finished"}, res.outcomes
    (run,) = cell_runs(s)
    assert run.data.params["train.parallel"] == "ddp"
    assert_logged_once(s.tracking_uri, run, steps, eval_every=3)
    assert str(killed[0]) not in run.data.tags["ablate.worker_pids"].split(",")  # a new group
    assert run.data.tags["ablate.resumed_from"] not in ("", "0")  # from a checkpoint
    assert res.outcomes[killed_cell.key].final_val_loss == uninterrupted_evals(killed_cell)[-1]


def uninterrupted_evals(cell: Any) -> list[float]:
    """The validation losses of ``cell``'s run trained in two uninterrupted gloo processes on this
    host, writing no checkpoint (Ray Train's workers use one thread each, as these do)."""
    d = {**cell.config.to_dict(), "checkpoint_dir": None}
    d["train"]["checkpoint_every"] = 0
    evals: list[float] = two_ranks(d)[0]["evals"]
    return evals


def assert_logged_once(tracking_uri: str, run: Any, steps: int, *, eval_every: int) -> None:
    """A finished 2-worker cell's run: its workers recorded, every training metric logged once at
    each step and the validation loss once at each evaluation."""
    client = MlflowClient(tracking_uri=tracking_uri)
    assert run.data.tags["ablate.status"] == "finished"
    assert run.data.tags["ablate.workers"] == "2"
    assert len(run.data.tags["ablate.worker_pids"].split(",")) == 2
    assert run.data.params["train.workers"] == "2"
    for key in METRICS:
        got = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert got == list(range(1, steps + 1)), key
    got = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_loss"))
    assert got == list(range(0, steps + 1, eval_every))


@pytest.mark.slow
def test_workers_no_set_of_nodes_can_place_are_refused_when_ray_starts():
    """A cluster's resources, not this machine's, decide on a cluster: the executor counts how many
    workers of the cell's size the live nodes fit (here a Ray of 2 CPUs and no GPU)."""
    import ray

    from ablate.executor import RayExecutor
    from ablate.executor.ray_executor import cell_task_env

    def _controller_like() -> tuple[str | None, str | None]:
        """As a Ray Train cell's task does: start an actor with ``env_vars`` of its own (the
        controller), which starts one without a runtime environment (the placement-group
        cleaner); what ``RAY_ADDRESS`` each of the two sees. Defined here: Ray pickles it by
        value (a worker has no tests on its path)."""

        class _Bare:
            def address(self) -> str | None:
                return os.environ.get("RAY_ADDRESS")

        class _Controller:
            def addresses(self) -> tuple[str | None, str | None]:
                bare = ray.remote(num_cpus=0)(_Bare).remote()
                return os.environ.get("RAY_ADDRESS"), ray.get(bare.address.remote())

        env = {"env_vars": {"RAY_TRAIN_V2_ENABLED": "1"}}
        controller = ray.remote(num_cpus=0)(_Controller).options(runtime_env=env).remote()
        return ray.get(controller.addresses.remote())

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20)
    try:
        for kw, says in [
            ({"cpus": 1, "workers": 3}, "3 workers of 1 CPUs and 0 GPUs, but the Ray cluster's "
             "nodes fit 2 such worker(s) (2 CPUs / 0 GPUs)"),
            ({"cpus": 1, "gpus": 1, "workers": 2}, "fit 0 such worker(s)"),
            ({"cpus": 3}, "asks for 3 CPUs and 0 GPUs, but the Ray cluster's nodes fit 0"),
        ]:  # fmt: skip
            with pytest.raises(CannotRunError, match=re.escape(says)):
                RayExecutor(**kw)
        RayExecutor(cpus=1, workers=2).close()  # fits: taken (and Ray left running: not its own)
        assert ray.is_initialized()
        # a multi-worker cell's task names this Ray to what Ray Train starts from it: an actor
        # with env_vars of its own (the controller) and the one it starts bare (the cleaner)
        gcs = ray.get_runtime_context().gcs_address
        assert cell_task_env() == {"env_vars": {"RAY_ADDRESS": gcs}}
        seen = ray.get(
            ray.remote(num_cpus=0)(_controller_like).options(runtime_env=cell_task_env()).remote()
        )
        assert seen == (gcs, gcs), seen
    finally:
        ray.shutdown()
