"""Activation checkpointing per block (ablate.model.recompute) keeps every random stream: a run with
``train.activation_checkpointing: blocks`` is bit-identical on the CPU to the same run without it,
with SR and a random 16-point Hadamard on fprop, dgrad and wgrad, in one process, with gradient
accumulation, across a resume, compiled, and with 2 DDP or FSDP2 workers over gloo. A plain
``torch.utils.checkpoint`` is shown to be wrong on the same layer, so the test can fail. Eager runs
replay a call tape, compiled ones a selective checkpoint (``ablate.model.recompute``): both tested."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import ranks
import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from ablate.model.recompute import checkpointed
from ablate.train import RunConfig, train
from ablate.train.device import resolve_device
from ablate.train.parallel import process_group
from backends import QuantLinear
from backends.recipes import GEMMS, Recipe

RECIPE = Recipe.from_shorthand(GEMMS, "sr+rht16")


def _layer() -> QuantLinear:
    torch.manual_seed(0)
    layer = QuantLinear(64, 48, recipe=RECIPE, seed=3)
    layer.train()
    return layer


def _grads(run: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    layer = _layer()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = run(layer, x)
    (y.square().sum()).backward()
    assert x.grad is not None and layer.weight.grad is not None
    return y.detach(), x.grad, layer.weight.grad, int(layer.calls)


def test_a_checkpointed_layer_draws_the_forwards_streams_and_a_plain_checkpoint_does_not():
    ref = _grads(lambda m, x: m(x))
    ours = _grads(lambda m, x: checkpointed(m, x))
    for a, b in zip(ref[:3], ours[:3], strict=True):
        assert torch.equal(a, b)
    assert ours[3] == ref[3] == 1  # the counter advanced once, not again in the recompute
    plain = _grads(lambda m, x: checkpoint(m, x, use_reentrant=False))
    assert torch.equal(plain[0], ref[0])  # the forward is the same ...
    assert not torch.equal(plain[2], ref[2])  # ... but wgrad drew the next call's streams
    assert plain[3] == 2


def test_a_replay_that_makes_more_calls_than_its_forward_is_refused():
    from backends.layer.streams import CallTape

    layer, x = _layer(), torch.randn(4, 64)
    tape = CallTape()
    with tape.recording():
        layer(x)
    with tape.replaying():
        layer(x)  # the recorded call, again
        with pytest.raises(RuntimeError, match="more than the 1 quantized training calls"):
            layer(x)
    assert int(layer.calls) == 1


def cfg(
    ac: str,
    *,
    parallel: str = "none",
    workers: int = 1,
    steps: int = 3,
    grad_accum: int = 1,
    compile: bool = False,
    checkpoint_dir: str | None = None,
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "model": {"preset": "tiny"},
        "data": {"val_tokens": 1024},
        "device": "cpu",
        "recipe": RECIPE.to_dict(),
        "train": {
            "steps": steps,
            "batch_size": 4,
            "seq_len": 32,
            "eval_every": 2,
            "eval_batches": 1,
            "warmup_steps": 1,
            "grad_accum": grad_accum,
            "parallel": parallel,
            "workers": workers,
            "compile": compile,
            "activation_checkpointing": ac,
        },
    }
    if checkpoint_dir is not None:
        d["checkpoint_dir"] = checkpoint_dir
    return d


def _run(d: dict[str, Any], stop_after: int | None = None) -> tuple[list[float], dict[str, Any]]:
    """Validation losses and the final weights of a run in this process."""
    c = RunConfig.from_dict(d)
    import ablate.train.loop as loop

    built: list[torch.nn.Module] = []
    build = loop.build_model

    def keep(*args: Any, **kw: Any) -> torch.nn.Module:
        built.append(build(*args, **kw))
        return built[-1]

    loop.build_model = keep  # type: ignore[assignment]
    try:
        with process_group(c, resolve_device("cpu")):
            res = train(c, stop_after=stop_after)
            state = {
                k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                for k, v in built[-1].state_dict().items()
            }
    finally:
        loop.build_model = build  # type: ignore[assignment]
    return [e.val_loss for e in res.evals], state


def _same(a: tuple[list[float], dict[str, Any]], b: tuple[list[float], dict[str, Any]]) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_a_checkpointed_run_is_bit_identical_to_one_without(grad_accum):
    ref = _run(cfg("none", grad_accum=grad_accum))
    _same(_run(cfg("blocks", grad_accum=grad_accum)), ref)
    assert ref[1]["layers.0.attention.wq.calls"] == 3 * grad_accum


def test_a_resumed_checkpointed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    ref = _run(cfg("none"))
    d = cfg("blocks", checkpoint_dir=str(tmp_path / "ckpt"))
    _run(d, stop_after=2)
    _same(_run(d), ref)


@pytest.mark.slow
def test_a_compiled_checkpointed_run_is_bit_identical_to_the_compiled_one(monkeypatch):
    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", "aot_eager")
    _same(_run(cfg("blocks", compile=True, steps=2)), _run(cfg("none", compile=True, steps=2)))


def _rank_main(rank: int, world: int, tmp: str, d: dict[str, Any]) -> None:
    store = dist.FileStore(os.path.join(tmp, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        losses, state = _run(d)
        digest = {k: v.double().sum().item() for k, v in state.items()}
        Path(tmp, f"rank{rank}.json").write_text(json.dumps({"evals": losses, "state": digest}))
        torch.save(state, Path(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's finalization: on torch 2.11 a gloo worker thread can drop the
    # last reference to a finished collective while Python finalizes, which aborts the process
    # ("terminate called without an active exception"; about one 2-rank FSDP run in four on the
    # 2-core machine, after everything was written). torch keeps the group alive past
    # destroy_process_group once DDP or FSDP2 has used it, so its threads outlive the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _two_ranks(d: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ranks.spawn(_rank_main, args=(2, tmp, d), nprocs=2)
        return torch.load(Path(tmp, "rank0.pt")) | {
            "__evals__": json.loads(Path(tmp, "rank0.json").read_text())["evals"]
        }


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_checkpointed_workers_train_bit_identically_to_two_without(mode):
    ref = _two_ranks(cfg("none", parallel=mode, workers=2, steps=2))
    ours = _two_ranks(cfg("blocks", parallel=mode, workers=2, steps=2))
    assert ours.keys() == ref.keys()
    for k in ref:
        if k == "__evals__":
            assert ours[k] == ref[k]
        else:
            assert torch.equal(ours[k], ref[k]), k


def test_activation_checkpointing_is_in_the_key_when_on_and_bad_values_name_the_field():
    from ablate.train.config import TrainConfig, config_hash

    plain = RunConfig.from_dict(cfg("none"))
    on = RunConfig.from_dict(cfg("blocks"))
    d = cfg("none")
    del d["train"]["activation_checkpointing"]
    assert config_hash(plain) == config_hash(RunConfig.from_dict(d))  # the key as before
    assert config_hash(on) != config_hash(plain)
    with pytest.raises(ValueError, match="train.activation_checkpointing: unknown 'all'"):
        TrainConfig(activation_checkpointing="all")  # type: ignore[arg-type]


def study_over(tmp_path: Path, axis: str, values: list[str], **train: Any) -> list[Any]:
    """Run a two-cell study of the ``tiny`` model (SR + RHT16 on every GEMM) over ``values`` of
    the train field ``axis`` on the local executor; its MLflow runs, in the grid's order, with
    their ``val_loss`` curves as ``run.curve``."""
    from mlflow.tracking import MlflowClient

    from ablate.driver.runner import run_study
    from ablate.study import parse_study

    raw = {
        "name": "grid",
        "base": {
            "device": "cpu",
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 4096},
            "train": {"batch_size": 4, "seq_len": 32, "eval_every": 2, "eval_batches": 4} | train,
            "fp4_gemms": ["fprop", "dgrad", "wgrad"],
            "intervention": "sr+rht16",
        },
        "grid": {f"train.{axis}": values},
        "resources": {"cpus": 1},
    }
    study = parse_study(raw, output=tmp_path / "out")
    assert len(study.cells) == 2 and study.cells[0].key != study.cells[1].key
    res = run_study(study, executor="local", progress=False)
    assert [o.status for o in res.outcomes.values()] == ["finished", "finished"]
    client = MlflowClient(tracking_uri=study.tracking_uri)
    runs = [client.get_run(res.run_ids[c.key]) for c in study.cells]
    for r in runs:
        r.curve = [m.value for m in client.get_metric_history(r.info.run_id, "val_loss")]
    return runs


@pytest.mark.slow
def test_a_study_over_checkpointing_finishes_with_identical_validation_losses(tmp_path):
    runs = study_over(tmp_path, "activation_checkpointing", ["none", "blocks"], steps=6)
    assert len(runs[0].curve) == 4 and runs[0].curve == runs[1].curve
