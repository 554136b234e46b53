"""The emulated backend's BF16 GEMM: block values exact in bfloat16, tensor scales on the output,
the same products as the FP32 path for every format (bit for bit where no rounding of a sum can
differ, within accumulation-order tolerance otherwise)."""

from __future__ import annotations

import pytest
import torch

from backends import QuantLinear, QuantSpec
from backends.gemm import GemmKeys
from backends.gemm.emulated import EmulatedBackend, _operand_bf16, default_mode
from backends.quant import FORMATS, quantize
from backends.recipes import NAMED_RECIPES, GemmRecipe, HadamardSpec, named_recipe

KEYS = GemmKeys(a=11, b=12, signs=13)
TOP = {"mxfp4": None, "mxfp8_e4m3": None, "mxfp8_e5m2": None, "nvfp4": 2688.0}
TOP |= {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def _both(a, b, g, signs=None):
    return (
        EmulatedBackend("fp32").mm(a, b, g, KEYS, signs),
        EmulatedBackend("bf16").mm(a, b, g, KEYS, signs),
    )


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_block_values_are_exact_in_bf16_and_rebuild_the_dequantized_tensor(fmt, rounding):
    torch.manual_seed(0)
    x = torch.randn(24, 96) * torch.logspace(-3, 3, 96)
    q = quantize(x, QuantSpec(format=fmt, rounding=rounding), axis=1, key=5)
    values, scale = q.block_values(torch.float32)
    assert torch.equal(values.bfloat16().float(), values)  # exact in bfloat16
    rebuilt = values if scale is None else values * scale
    torch.testing.assert_close(rebuilt, q.dequantize(), rtol=2**-23, atol=0)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_bf16_gemm_equals_fp32_gemm_bit_for_bit_on_integer_data(fmt):
    """Integer data whose tensor scale is 1 (amax at the format's top): every product and every
    partial sum is exact, so any accumulation order gives the same bits, and so must both paths."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-8, 9, (40, 64), generator=g).float()
    b = torch.randint(-8, 9, (24, 64), generator=g).float()
    if TOP[fmt] is not None:
        a[0, 0] = b[0, 0] = TOP[fmt]
    spec = QuantSpec(format=fmt)
    g = GemmRecipe(a=spec, b=spec)
    taken = _operand_bf16(a, spec, 0, g, None)
    assert taken is not None and taken[0].dtype == torch.bfloat16  # the BF16 path, not a fallback
    f32, b16 = _both(a, b, g)
    assert torch.equal(f32, b16)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("hadamard", [None, 16])
def test_bf16_gemm_matches_fp32_within_accumulation_tolerance(fmt, hadamard):
    torch.manual_seed(2)
    a, b = torch.randn(48, 128) * 3, torch.randn(40, 128) / 5
    h = None if hadamard is None else HadamardSpec(size=hadamard, signs="random")
    signs = None if h is None else torch.where(torch.rand(hadamard) < 0.5, -1.0, 1.0)
    spec = QuantSpec(format=fmt, rounding="sr", prescale=True)
    f32, b16 = _both(a, b, GemmRecipe(a=spec, b=QuantSpec(format=fmt), hadamard=h), signs)
    torch.testing.assert_close(b16, f32, rtol=1e-5, atol=1e-5 * float(f32.abs().max()))


def test_an_operand_not_exact_in_bf16_runs_the_fp32_path():
    """A float32 high-precision operand is not exact in bfloat16: the GEMM stays in FP32 (the
    bf16 backend then computes exactly what the fp32 one does)."""
    torch.manual_seed(3)
    a, b = torch.randn(8, 64), torch.randn(6, 64)
    f32, b16 = _both(a, b, GemmRecipe(a=QuantSpec(format="mxfp4"), b=None))
    assert torch.equal(f32, b16)
    f32, b16 = _both(a, b.bfloat16(), GemmRecipe(a=QuantSpec(format="mxfp4"), b=None))
    torch.testing.assert_close(b16, f32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(NAMED_RECIPES))
def test_a_layer_trains_alike_on_either_path(name, monkeypatch):
    torch.manual_seed(4)
    x, dy = torch.randn(64, 64), torch.randn(64, 32)
    grads = {}
    for mode in ("fp32", "bf16"):
        monkeypatch.setenv("ABLATE_EMULATED_GEMM", mode)
        torch.manual_seed(5)
        layer = QuantLinear(64, 32, recipe=named_recipe(name), seed=3).train()
        xx = x.clone().requires_grad_()
        y = layer(xx)
        y.backward(dy)
        grads[mode] = (y.detach(), xx.grad, layer.weight.grad)
    for f, b in zip(grads["fp32"], grads["bf16"], strict=True):
        torch.testing.assert_close(b, f, rtol=1e-4, atol=1e-4 * float(f.abs().max()))


def test_the_default_mode_and_its_override(monkeypatch):
    monkeypatch.delenv("ABLATE_EMULATED_GEMM", raising=False)
    assert default_mode(torch.device("cpu")) == "fp32"
    assert default_mode(torch.device("cuda")) == "bf16"
    monkeypatch.setenv("ABLATE_EMULATED_GEMM", "bf16")
    assert default_mode(torch.device("cpu")) == "bf16"
    monkeypatch.setenv("ABLATE_EMULATED_GEMM", "tf32")
    with pytest.raises(ValueError, match="ABLATE_EMULATED_GEMM: unknown 'tf32'; allowed"):
        default_mode(torch.device("cpu"))
    with pytest.raises(ValueError, match="gemm: unknown"):
        EmulatedBackend("fp16")  # type: ignore[arg-type]


def test_the_mode_is_a_trace_time_constant_marked_as_dynamos_own_decorator_marks_it(monkeypatch):
    from torch._dynamo.decorators import assume_constant_result

    from backends.gemm import emulated

    def dynamos(): ...

    def ours(): ...

    marked = dict(vars(assume_constant_result(dynamos)))
    assert marked and vars(emulated.constant_when_traced(ours)) == marked
    # and Dynamo takes it so: read once when traced, neither traced nor guarded on
    monkeypatch.setenv("ABLATE_EMULATED_GEMM", "fp32")

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        return x + (1 if default_mode(x.device) == "fp32" else 2)

    assert f(torch.zeros(1)).item() == 1
    monkeypatch.setenv("ABLATE_EMULATED_GEMM", "bf16")
    assert f(torch.zeros(1)).item() == 1  # the traced constant, no recompile


# ----------------------------------------------------------------------------------------------
# a GEMM that cannot take the BF16 path says so, once


@pytest.fixture
def fresh_warnings(monkeypatch):
    from backends.gemm import emulated

    monkeypatch.setattr(emulated, "_WARNED", set())


def test_a_device_without_a_bf16_gemm_warns_once_naming_the_gemm(fresh_warnings):
    # torch's CPU build has no mm(out_dtype=float32) kernel: bf16 mode multiplies the same exact
    # products in an FP32 GEMM there, and says so the first time
    from backends.gemm.emulated import bf16_gemm_available

    assert not bf16_gemm_available(torch.device("cpu"))
    g = GemmRecipe(a=QuantSpec(format="mxfp4"), b=QuantSpec(format="mxfp4"))
    a, b = torch.randn(8, 64), torch.randn(4, 64)
    with pytest.warns(RuntimeWarning, match=r"emulated GEMM .*mxfp4.*cpu has no BF16 GEMM"):
        EmulatedBackend("bf16").mm(a, b, g, KEYS, None)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: nothing
        EmulatedBackend("bf16").mm(a, b, g, KEYS, None)


def test_a_high_precision_operand_that_is_not_bf16_warns_that_its_gemm_runs_in_fp32(
    fresh_warnings,
):
    g = GemmRecipe(a=QuantSpec(format="mxfp4"), b=None)
    with pytest.warns(RuntimeWarning, match=r"operand b is high precision .*torch.float32"):
        EmulatedBackend("bf16").mm(torch.randn(8, 64), torch.randn(4, 64), g, KEYS, None)


def test_the_fp32_mode_and_exact_operands_on_a_bf16_device_do_not_warn():
    from backends.gemm.emulated import slow_path

    g = GemmRecipe(a=QuantSpec(format="mxfp4"), b=None)
    cpu, bf16 = torch.device("cpu"), (torch.bfloat16, torch.bfloat16)
    assert slow_path(g, cpu, (torch.float32,) * 2, "fp32") is None
    assert slow_path(GemmRecipe(), cpu, bf16, "bf16") is None  # high precision: no emulated GEMM
    assert "no BF16 GEMM" in (slow_path(g, cpu, bf16, "bf16") or "")  # exact, but no kernel
