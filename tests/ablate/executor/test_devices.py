"""Device handling end to end: a cell that needs a GPU gets one from ``resources.gpus`` or the study
is refused before anything runs (validate, plan, run; the CLI and the Python API), a CUDA cell in a
process without CUDA fails at once with a named error, and what a run trained on is recorded. Real
MLflow (SQLite under tmp_path), real Ray (a local one that declares GPUs it does not have), a real
CPU build of torch."""

from __future__ import annotations

import time

import pytest
import torch
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.driver.preflight import check_gpus
from ablate.driver.runner import run_study
from ablate.errors import CannotRunError
from ablate.executor import LocalExecutor, run_one
from ablate.executor.task import Task
from ablate.study import load_study, parse_study
from ablate.tracking import StudyTracker, default_uri, prepare_store

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a process without CUDA")

STUDY = """
name: gpus
base:
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 2, batch_size: 4, seq_len: 32, eval_every: 2, eval_batches: 4, warmup_steps: 1}
  BASE
grid:
  fp4_gemms: [[], [fprop]]
"""
NEEDS_A_GPU = {  # what the study asks for -> how the refusal names it
    "device: cuda": "device: cuda (cells bf16, mxfp4[fprop]/bf16): to train on a GPU",
    "device: 'cuda:1'": "device: cuda:1 (cells bf16, mxfp4[fprop]/bf16): to train on a GPU",
    "backend: native": "backend: native (cells bf16, mxfp4[fprop]/bf16): to run native FP4/FP8",
}


def _raw(base: str, gpus: float = 0) -> dict:
    import yaml

    raw = yaml.safe_load(STUDY.replace("BASE", base))
    raw["resources"] = {"cpus": 1, "gpus": gpus}
    return raw


def _write(tmp_path, base: str) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(STUDY.replace("BASE", base) + "resources: {cpus: 1, gpus: 0}\n")
    return str(p)


def _assert_refusal(msg: str, base: str) -> None:
    assert msg.count("resources.gpus: 0 gives each cell no GPU") == 1, msg
    assert "2 cell(s) need one" in msg and NEEDS_A_GPU[base] in msg, msg
    assert "fix: set resources.gpus: 1 (GPUs per cell)" in msg, msg
    other = "backend: emulated" if "native" in base else "device: cpu to train on CPUs"
    assert other in msg, msg


def _runs(uri: str) -> int:
    client = MlflowClient(tracking_uri=uri)
    return sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())


@pytest.mark.parametrize("base", list(NEEDS_A_GPU))
def test_a_cell_that_needs_a_gpu_with_resources_gpus_0_is_refused_by_every_command(tmp_path, base):
    p = _write(tmp_path, base)
    out = tmp_path / "out"
    for cmd in ("validate", "plan", "run"):
        t0 = time.perf_counter()
        res = CliRunner().invoke(main, [cmd, p, "-o", str(out)])
        assert res.exit_code == 2, (cmd, res.output)  # a refusal before anything starts
        assert time.perf_counter() - t0 < 10, cmd  # run: before Ray starts
        _assert_refusal(res.output, base)
    assert not out.exists()  # no folder, no lock, no store


@pytest.mark.parametrize("base", list(NEEDS_A_GPU))
@pytest.mark.parametrize("executor", ["ray", "local"])
def test_the_python_api_refuses_it_before_touching_what_is_recorded(tmp_path, base, executor):
    import ray

    study = load_study(_write(tmp_path, base), output=tmp_path / "out")
    prepare_store(study.tracking_uri, study.output_dir)  # a store that already holds a run
    tracker = StudyTracker(study.tracking_uri, study.name)
    tracker.create_run(tracker.parent_run("name: gpus\n"), "k", "old", {}, {})
    before = sorted(p.name for p in study.output_dir.iterdir())
    t0 = time.perf_counter()
    with pytest.raises(CannotRunError) as e:
        run_study(study, executor=executor, progress=False)
    assert time.perf_counter() - t0 < 5
    _assert_refusal(str(e.value), base)
    assert _runs(study.tracking_uri) == 2  # the old parent and cell runs, nothing new
    assert sorted(p.name for p in study.output_dir.iterdir()) == before  # not even a lock
    assert not ray.is_initialized()


def test_device_auto_with_no_gpus_asked_for_is_refused_where_there_are_gpus(tmp_path):
    """auto with resources.gpus 0 is pinned to cpu when the study expands (keys do not depend on
    the machine), so on a machine or cluster with GPUs it would train on the CPU in fp32: refused.
    A CPU study says device: cpu; where there are no GPUs auto is the CPU."""
    auto = parse_study(_raw(""), output=tmp_path / "a")
    assert {c.config.device for c in auto.cells} == {"cpu"}
    check_gpus(auto, gpus_seen=0)  # no GPUs: cpu is what auto means
    with pytest.raises(CannotRunError) as e:
        check_gpus(auto, gpus_seen=2)
    msg = str(e.value)
    assert "device: auto (cells bf16, mxfp4[fprop]/bf16): this machine has 2 GPU(s)" in msg
    assert "would train on the CPU in fp32" in msg
    assert "fix: set resources.gpus: 1 (GPUs per cell), or device: cpu" in msg
    check_gpus(parse_study(_raw("device: cpu"), output=tmp_path / "b"), gpus_seen=2)
    on_gpus = parse_study(_raw("", gpus=1), output=tmp_path / "c")
    assert {c.config.device for c in on_gpus.cells} == {"cuda"}
    check_gpus(on_gpus, gpus_seen=0)  # asks for a GPU: the machine's resources check the rest
    native_cpu = parse_study(_raw("backend: native\n  device: cpu"), output=tmp_path / "d")
    check_gpus(native_cpu, gpus_seen=0)  # the backend's check refuses its recipes on a CPU


def test_cuda_n_beyond_the_gpus_a_ray_task_gets_is_refused(tmp_path):
    s = tmp_path / "s.yaml"
    s.write_text(STUDY.replace("BASE", "device: 'cuda:1'") + "resources: {cpus: 1, gpus: 1}\n")
    res = CliRunner().invoke(main, ["validate", str(s), "--address", "ray://nowhere:1"])
    assert res.exit_code == 2, res.output
    assert "a Ray task sees only the resources.gpus: 1 GPU(s) it asks for" in res.output
    assert "device: cuda:1 (cells bf16, mxfp4[fprop]/bf16)" in res.output
    assert "fix: use device: cuda" in res.output


@pytest.fixture
def tracking_server():
    """An http URI whose /health answers, as a tracking server's does (a cluster needs one)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_validate_on_a_cluster_warns_that_auto_without_gpus_trains_on_cpus(
    tmp_path, tracking_server
):
    """validate --address does not reach the cluster; run refuses it there if the cluster has GPUs
    (the slow Ray test below)."""
    s = tmp_path / "s.yaml"
    s.write_text(STUDY.replace("BASE", "") + "resources: {cpus: 1}\n")
    at = ["--address", "ray://nowhere:1", "--tracking-uri", tracking_server]
    res = CliRunner().invoke(main, ["validate", str(s), *at])
    assert res.exit_code == 0, res.output
    assert "warning: device: auto with resources.gpus: 0 trains 2 cell(s) on CPUs" in res.output
    res = CliRunner().invoke(main, ["validate", str(s)])  # here: this machine has no GPU
    assert res.exit_code == 0 and "warning" not in res.output, res.output


# --- the worker -------------------------------------------------------------------------------


def _cell_run(tmp_path) -> tuple[str, str]:
    """A store holding one cell's run (as the driver creates it): (uri, run id)."""
    uri = default_uri(tmp_path)
    prepare_store(uri, tmp_path)
    tracker = StudyTracker(uri, "s")
    return uri, tracker.create_run(tracker.parent_run("name: s\n"), "k", "cell-a", {}, {})


@no_cuda
def test_a_cuda_cell_in_a_process_without_cuda_fails_at_once_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what Ray gives a task that asks for no GPU
    uri, rid = _cell_run(tmp_path)
    study = parse_study(_raw("device: cuda", gpus=1), output=tmp_path / "out")
    cfg = study.cells[0].config.to_dict()
    assert cfg["device"] == "cuda"
    ex = LocalExecutor()  # run_one in this process, as a Ray worker runs it
    ex.submit(Task("k", "cell-a", cfg, uri, rid, str(tmp_path)))
    t0 = time.perf_counter()
    (o,) = ex.wait(1)
    assert time.perf_counter() - t0 < 3
    assert o.status == "failed" and o.steps == 0
    assert o.reason.startswith("CannotRunError: cell cell-a: device cuda, but this worker sees")
    # the CPU build of torch says so; a CUDA build on a machine without a GPU counts 0 devices
    built = "built without CUDA" if torch.version.cuda is None else "0 CUDA devices"
    assert built in o.reason and "CUDA_VISIBLE_DEVICES=''" in o.reason
    assert "set resources.gpus: 1" in o.reason and "device: cpu" in o.reason
    run = MlflowClient(tracking_uri=uri).get_run(rid)
    assert run.data.tags["ablate.status"] == "failed"
    assert "Traceback" in run.data.tags["ablate.traceback"]  # short: raised before training
    assert "loop.py" not in run.data.tags["ablate.traceback"]
    assert not any(k.startswith("env.") for k in run.data.tags)  # it never ran anywhere


def test_a_run_records_the_device_it_trained_on(tmp_path):
    uri, rid = _cell_run(tmp_path)
    study = parse_study(_raw("device: cpu"), output=tmp_path / "out")
    cfg = {**study.cells[0].config.to_dict(), "checkpoint_dir": str(tmp_path / "ckpt")}
    o = run_one(Task("k", "cell-a", cfg, uri, rid, str(tmp_path)))
    assert o.status == "finished", o.reason
    tags = MlflowClient(tracking_uri=uri).get_run(rid).data.tags
    assert tags["env.device"] == "cpu" and tags["env.torch_device"] == "cpu"
    assert tags["env.precision"] == "fp32" and tags["env.device_name"]
    assert "env.cuda_visible_devices" not in tags  # CUDA runs only


# --- a Ray cluster that declares GPUs ---------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_cluster():
    """A real local Ray that declares 2 GPUs this machine does not have."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.mark.slow
@no_cuda
def test_on_a_gpu_cluster_auto_without_gpus_is_refused_and_a_cuda_cell_gets_one(
    tmp_path, gpu_cluster
):
    auto = parse_study(_raw(""), output=tmp_path / "auto")
    with pytest.raises(CannotRunError, match=r"device: auto .*the Ray cluster has 2 GPU\(s\)"):
        run_study(auto, executor="ray", address=gpu_cluster, progress=False)
    assert not auto.output_dir.exists()  # refused once Ray was up, before the store was made

    cuda = parse_study(_raw("device: cuda", gpus=1), output=tmp_path / "cuda")
    res = run_study(cuda, executor="ray", address=gpu_cluster, progress=False)
    assert {o.status for o in res.outcomes.values()} == {"failed"}
    for c in cuda.cells:  # Ray gave each task a GPU: the worker names it, and has no CUDA
        reason = res.outcomes[c.key].reason
        assert reason.startswith(f"CannotRunError: cell {c.label}: device cuda, but"), reason
        assert "CUDA_VISIBLE_DEVICES='0'" in reason or "CUDA_VISIBLE_DEVICES='1'" in reason
