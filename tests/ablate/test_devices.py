"""Device handling in the worker: a CUDA cell in a process without CUDA fails at once with a named
error, and what a run trained on is recorded. Real MLflow (SQLite under tmp_path), a real CPU build
of torch."""

from __future__ import annotations

import time

import pytest
import torch
from mlflow.tracking import MlflowClient

from ablate.executor import LocalExecutor, Task, run_one
from ablate.spec import parse_study
from ablate.tracking import StudyTracker, default_uri, prepare_store

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a process without CUDA")

STUDY = """
name: gpus
base:
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 2, batch_size: 4, seq_len: 32, eval_every: 2, warmup_steps: 1}
  BASE
grid:
  fp4_gemms: [[], [fprop]]
"""


def _raw(base: str, gpus: float = 0) -> dict:
    import yaml

    raw = yaml.safe_load(STUDY.replace("BASE", base))
    raw["resources"] = {"cpus": 1, "gpus": gpus}
    return raw


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
    assert "built without CUDA" in o.reason and "CUDA_VISIBLE_DEVICES=''" in o.reason
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
