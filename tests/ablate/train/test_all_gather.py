"""FSDP2's bf16 all-gather of the block linears (``train.fsdp_all_gather: bf16``) changes no number
of a bf16 run: a run with it is bit-identical on the CPU to the same run with the fp32 all-gather,
for the BF16 recipe, wgrad-only MXFP4 and SR + a random 16-point Hadamard on all three GEMMs, with
gradient accumulation, with activation checkpointing, across a resume and with 2 FSDP2 workers
over gloo. The gathered weights are bf16 where the test says they are (so the test can fail: the
option is not a no-op), the norms and the root stay fp32, and bad combinations name the field."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_recompute import _run, _same, _two_ranks, study_over
from test_recompute import cfg as _cfg

from ablate.model import ModelConfig, build_model
from ablate.train import RunConfig
from ablate.train.device import resolve_device
from ablate.train.parallel import Ranks, process_group
from backends.recipes import GEMMS, Recipe

RECIPES = {
    "bf16": Recipe.bf16(),
    "mxfp4-wgrad": Recipe.from_shorthand(("wgrad",), "sr"),
    "sr+rht16-all": Recipe.from_shorthand(GEMMS, "sr+rht16"),
}


def cfg(all_gather: str, recipe: str = "sr+rht16-all", **kw: Any) -> dict[str, Any]:
    d = _cfg(kw.pop("ac", "none"), **({"parallel": "fsdp"} | kw))
    d["recipe"] = RECIPES[recipe].to_dict()
    d["train"] |= {"precision": "bf16", "fsdp_all_gather": all_gather}
    return d


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_bf16_all_gather_run_is_bit_identical_to_the_fp32_one(recipe):
    _same(_run(cfg("bf16", recipe)), _run(cfg("fp32", recipe)))


def test_bit_identical_with_gradient_accumulation_and_checkpointed_blocks():
    _same(
        _run(cfg("bf16", grad_accum=2, ac="blocks")),
        _run(cfg("fp32", grad_accum=2, ac="none")),
    )


def test_a_resumed_bf16_all_gather_run_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    ref = _run(cfg("fp32"))
    d = cfg("bf16", checkpoint_dir=str(tmp_path / "ckpt"))
    _run(d, stop_after=2)
    _same(_run(d), ref)


@pytest.mark.slow
def test_two_fsdp_workers_with_the_bf16_all_gather_train_bit_identically():
    ref = _two_ranks(cfg("fp32", workers=2, steps=2, grad_accum=2))
    ours = _two_ranks(cfg("bf16", workers=2, steps=2, grad_accum=2))
    assert ours.keys() == ref.keys()
    for k in ref:
        if k == "__evals__":
            assert ours[k] == ref[k]
        else:
            assert torch.equal(ours[k], ref[k]), k


def test_the_block_linears_gather_in_bf16_and_the_rest_in_fp32():
    """What the option does, seen in a forward: every linear of a block sees its weight in bf16,
    the norms and the LM head in fp32 (the fp32 all-gather: all fp32)."""
    c = RunConfig.from_dict(cfg("bf16"))
    device = resolve_device("cpu")
    seen: dict[str, dict[str, torch.dtype]] = {}
    for all_gather in ("fp32", "bf16"):
        model = build_model(ModelConfig(preset="tiny"), vocab_size=257, seed=0, device=device)
        dtypes: dict[str, torch.dtype] = {}
        for name, m in model.named_modules():
            if name.endswith(("wq", "w2", "attention_norm", "lm_head")):
                m.register_forward_pre_hook(
                    lambda m, a, name=name, seen=dtypes: seen.__setitem__(name, m.weight.dtype)
                )
        with process_group(c, device):
            wrapped = Ranks("fsdp", 0, 1, all_gather).wrap(model, device)  # type: ignore[arg-type]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                wrapped(torch.zeros(1, 8, dtype=torch.long))
        seen[all_gather] = dtypes
    assert set(seen["fp32"].values()) == {torch.float32}
    bf16 = seen["bf16"]
    assert bf16["layers.0.attention.wq"] == bf16["layers.1.feed_forward.w2"] == torch.bfloat16
    assert bf16["layers.0.attention_norm"] == bf16["lm_head"] == torch.float32


def test_fsdp_all_gather_is_in_the_key_when_bf16_and_bad_input_names_the_field():
    from ablate.train.config import TrainConfig, config_hash

    plain = RunConfig.from_dict(cfg("fp32"))
    d = cfg("fp32")
    del d["train"]["fsdp_all_gather"]
    assert config_hash(plain) == config_hash(RunConfig.from_dict(d))  # the key as before
    assert config_hash(RunConfig.from_dict(cfg("bf16"))) != config_hash(plain)
    with pytest.raises(
        ValueError, match=r"train.fsdp_all_gather: unknown 'fp8'; allowed: fp32, bf16"
    ):
        TrainConfig(parallel="fsdp", fsdp_all_gather="fp8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="train.fsdp_all_gather: bf16 .* train.parallel is ddp"):
        TrainConfig(parallel="ddp", fsdp_all_gather="bf16")
    d = cfg("bf16")
    d["train"]["precision"] = "auto"  # fp32 on the CPU
    with pytest.raises(ValueError, match="train.fsdp_all_gather: bf16 needs bf16 precision"):
        RunConfig.from_dict(d)
    with pytest.raises(ValueError, match="train.fsdp_all_gather: bf16 .* set train.compile: false"):
        RunConfig.from_dict(cfg("bf16", compile=True))
    d = cfg("bf16")
    d["device"], d["train"]["compile"] = "cuda", "auto"  # compiled on CUDA: refused there too
    with pytest.raises(ValueError, match="train.compile: auto on cuda"):
        RunConfig.from_dict(d)


@pytest.mark.slow
def test_a_study_over_the_all_gather_finishes_with_identical_validation_losses(tmp_path):
    train = dict(steps=4, precision="bf16", parallel="fsdp", activation_checkpointing="blocks")
    runs = study_over(tmp_path, "fsdp_all_gather", ["fp32", "bf16"], **train)
    assert [r.data.params["train.fsdp_all_gather"] for r in runs] == ["fp32", "bf16"]
    assert len(runs[0].curve) == 3 and runs[0].curve == runs[1].curve
