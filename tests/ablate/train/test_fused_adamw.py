"""``train.fused_adamw``: AdamW's fused kernel, CUDA's default, on the CPU (torch has it there and
on FSDP2's DTensors): the step skips a non-finite gradient on the device (``found_inf``), it
trains like the foreach kernels within float32 rounding, in one process and under FSDP2, and it is
in the cell key only where it differs from the device's default."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.train import RunConfig, train
from ablate.train.config import TrainConfig, config_hash
from ablate.train.device import resolve_device
from ablate.train.logger import NullLogger
from ablate.train.loop import build_run
from ablate.train.parallel import process_group
from ablate.train.state import TrainState
from backends.recipes import GEMMS, Recipe

SR = Recipe.from_shorthand(GEMMS, "sr").to_dict()


def _cfg(fused: bool | str, parallel: str = "none", steps: int = 4) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 4096},
            "device": "cpu",
            "recipe": SR,
            "train": {
                "steps": steps,
                "batch_size": 4,
                "seq_len": 32,
                "eval_every": 2,
                "eval_batches": 4,
                "warmup_steps": 1,
                "parallel": parallel,
                "fused_adamw": fused,
            },
        }
    )


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_a_step_with_a_non_finite_gradient_leaves_the_weights_as_they_were(fused):
    run = build_run(_cfg(fused), NullLogger(), None)
    assert bool(run.optimizer.defaults.get("fused")) is fused
    state = TrainState()
    run.optimizer_step(state)  # a finite step first: the optimizer state exists
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in run.optimizer.state.values()]
    w = run.model.layers[0].attention.wq.weight
    handle = w.register_hook(lambda g: g * math.nan)
    step = run.optimizer_step(state)
    handle.remove()
    assert not math.isfinite(float(step.grad_norm))
    after = run.model.state_dict()
    for k, v in before.items():
        if k.endswith("calls"):  # the layers' call counters advance with every forward
            continue
        assert torch.equal(after[k], v), k
    for m, s in zip(moments, run.optimizer.state.values(), strict=True):
        assert torch.equal(s["exp_avg"], m)


@pytest.mark.parametrize("parallel", ["none", "fsdp"])
def test_fused_adamw_trains_like_the_foreach_kernels(parallel):
    def losses(fused: bool) -> list[float]:
        c = _cfg(fused, parallel)
        with process_group(c, resolve_device("cpu")):
            res = train(c)
        assert res.status == "finished"
        return [e.val_loss for e in res.evals]

    fused, foreach = losses(True), losses(False)
    assert fused[0] == foreach[0]  # the untrained model
    # another kernel, maybe another rounding: equal on an AVX-512 Xeon, an ulp apart here and
    # there on an AMD EPYC (that the fused kernel runs is asserted by the test above)
    assert fused == pytest.approx(foreach, rel=1e-4)


def test_fused_adamw_is_in_the_key_only_where_it_differs_from_the_devices_default():
    def key(device: str, fused: bool | str = "auto") -> str:
        return config_hash(RunConfig(device=device, train=TrainConfig(fused_adamw=fused)))

    assert key("cpu") == key("cpu", False) != key("cpu", True)
    assert key("cuda") == key("cuda", True) != key("cuda", False)


def test_a_bad_fused_adamw_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="train.fused_adamw: unknown 'yes'; allowed: auto, true"):
        TrainConfig(fused_adamw="yes")  # type: ignore[arg-type]
