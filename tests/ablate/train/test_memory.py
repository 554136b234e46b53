"""The memory estimate (``ablate.train.memory``) against the real model on the CPU."""

import pytest
import torch

from ablate.train.memory import (
    activation_parts,
    estimate,
    format_bytes,
    param_count,
    parse_size,
)
from ablate.train.model import ModelConfig, build_model, count_parameters, num_params
from backends import Recipe


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_param_count_is_exact(preset):
    cfg = ModelConfig(preset=preset)
    assert param_count(cfg, 257) == count_parameters(build_model(cfg, 257))


def test_param_count_of_the_large_presets_without_building():
    # the documented Llama 3.1-8B figure; 125m and 1b against the meta-device count
    assert param_count(ModelConfig(preset="llama3_8b")) == 8_030_261_248
    for preset in ("125m", "1b"):
        assert param_count(ModelConfig(preset=preset)) == num_params(ModelConfig(preset=preset))


def _saved_bytes(model, tokens, precision):
    """Bytes of the distinct storages autograd saves in one forward with the loss, parameters
    excluded (they are counted as parameters)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(x):
        s = x.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return x

    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), ctx:
        model(tokens, tokens)
    return sum(seen.values())


@pytest.mark.parametrize(
    ("preset", "fp4"), [("tiny", False), ("small", False), ("tiny", True)], ids=str
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_estimate_matches_the_saved_tensors(preset, fp4, precision):
    """Within 2%: the estimate lists the tensors autograd saves one by one, so it should agree
    to the byte but for the RoPE tables (buffers, tens of KB) and QuantLinear's per-call key
    tables (bytes); bf16 is CPU autocast, whose cast rules for linear and SDPA are those of CUDA
    autocast. With every GEMM in MXFP4, QuantLinear saves what nn.Linear does."""
    cfg = ModelConfig(preset=preset)
    b, t = 4, 128
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "none") if fp4 else None
    model = build_model(cfg, 257, recipe=recipe)
    tokens = torch.randint(0, 257, (b, t), generator=torch.Generator().manual_seed(0))
    measured = _saved_bytes(model, tokens, precision)
    parts = activation_parts(cfg.resolved(257), b, t, precision)
    parts.pop("loss_transient")  # alive around the loss, not saved
    est = estimate(
        cfg, 257, batch_size=b, grad_accum=1, seq_len=t, precision=precision, recipe=recipe
    )
    predicted = sum(parts.values()) + est.weight_copies  # bf16 weight copies are saved too
    assert predicted == pytest.approx(measured, rel=0.02)


def test_estimate_breakdown_and_shards():
    cfg = ModelConfig(preset="llama3_8b")
    e = estimate(cfg, None, batch_size=8, grad_accum=8, seq_len=2048, precision="bf16")
    n = 8_030_261_248
    assert (e.parameters, e.gradients, e.optimizer) == (4 * n, 4 * n, 8 * n)
    assert e.micro_batch == 1 and e.total > 128e9
    assert e.total == sum(v for k, v in e.breakdown().items() if k != "total")
    fsdp = estimate(cfg, None, batch_size=8, grad_accum=8, seq_len=2048, precision="bf16", shards=8)
    assert fsdp.parameters == 4 * n // 8 and fsdp.activations == e.activations
    with pytest.raises(ValueError, match="shards"):
        estimate(cfg, None, batch_size=8, grad_accum=8, seq_len=2048, precision="bf16", shards=0)


def test_parse_size():
    assert parse_size("80GiB") == 80 << 30
    assert parse_size("24 gb") == 24 * 10**9
    assert parse_size("1.5MiB") == 3 << 19
    for bad in ("80", "80TB", "GiB", "-1GiB", "0GiB", "eighty GiB"):
        with pytest.raises(ValueError, match="GiB, GB, MiB or MB"):
            parse_size(bad)


def test_format_bytes():
    assert format_bytes(80 << 30) == "80 GiB"
    assert format_bytes(1020 << 20) == "1020 MiB"
    assert format_bytes(3 << 19) == "1.5 MiB"
