"""The NVFP4 variants (``backends.quant.variants``: Four Over Six, MS-EDEN, double-block scales) as
quantizer options: their checks, their fast-path decision (the torch path of ``fused.py`` on every
device, eager and compiled alike), their round trip through recipes, and the two GEMM paths of the
``emulated`` backend and the ``native`` packing on them."""

from __future__ import annotations

import pytest
import torch

from backends.gemm import GemmKeys
from backends.gemm.emulated import EmulatedBackend
from backends.gemm.native import dequantize_packed, pack_operand
from backends.quant import (
    QuantSpec,
    fake_quantize,
    fake_quantize_fused,
    quantize,
    quantize_fused,
    quantize_reference,
    sign_vector,
)
from backends.recipes import GemmRecipe, HadamardSpec, Recipe

VARIANTS = [
    (QuantSpec(format="nvfp4", scale_rule="mse"), None),
    (QuantSpec(format="nvfp4", scale_rule="abs_max", block_rows=16), None),
    (QuantSpec(format="nvfp4", scale_rule="mae", rounding="sr", prescale=16 / 17), None),
    (QuantSpec(format="nvfp4", rounding="eden"), 128),
    (QuantSpec(format="nvfp4", outer_block=128), None),
    (QuantSpec(format="nvfp4", outer_block=128, rounding="sr"), 16),
]
IDS = ["4o6mse", "4o6amax-16x16", "4o6mae-sr", "eden", "o128", "o128-sr-h16"]


def _x(seed: int = 0, shape: tuple[int, int] = (32, 256)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g))


def _had(size: int | None) -> tuple[int, torch.Tensor] | None:
    return None if size is None else (size, sign_vector(size, 77))


@pytest.mark.parametrize(("spec", "size"), VARIANTS, ids=IDS)
def test_every_path_gives_the_torch_paths_bits(spec, size):
    x = _x()
    had = _had(size)
    q = quantize(x, spec, key=5, hadamard=had)
    qf = quantize_fused(x, spec, key=5, hadamard=had)
    assert torch.equal(q.codes, qf.codes) and torch.equal(q.scales, qf.scales)
    v = fake_quantize(x, spec, key=5, hadamard=had, out_dtype=torch.float32)
    assert torch.equal(v, q.dequantize())
    assert torch.equal(
        v, fake_quantize_fused(x, spec, key=5, hadamard=had, out_dtype=torch.float32)
    )
    # bfloat16 input and output: the same values, rounded once
    vb = fake_quantize(x.bfloat16(), spec, key=5, hadamard=had, out_dtype=torch.bfloat16)
    want = quantize(x.bfloat16(), spec, key=5, hadamard=had).dequantize(torch.bfloat16)
    assert torch.equal(vb, want)


def test_the_reference_quantizer_refuses_variants_rather_than_pretend():
    with pytest.raises(ValueError, match="specified by its module"):
        quantize_reference(_x(), QuantSpec(format="nvfp4", scale_rule="mse"))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"format": "mxfp4", "scale_rule": "mse"}, "scale_rule: Four Over Six needs E4M3"),
        ({"format": "nvfp4", "scale_rule": "l2"}, "scale_rule: unknown 'l2'; allowed: mse, mae"),
        ({"format": "nvfp4", "rounding": "stochastic"}, "rounding: unknown .* allowed: rne, sr"),
        ({"format": "nvfp4", "prescale": 1.5}, "prescale: 1.5 is not allowed"),
        ({"format": "nvfp4", "prescale": "x"}, "prescale: 'x' is not allowed"),
    ],
)
def test_bad_options_name_the_field_and_the_allowed_values(kw, match):
    with pytest.raises(ValueError, match=match):
        QuantSpec(**kw)


def test_a_prescale_factor_has_one_spelling():
    assert QuantSpec(format="nvfp4", prescale=0.75).prescale is True
    assert QuantSpec(format="nvfp4", prescale=1.0).prescale is False
    p = QuantSpec(format="nvfp4", rounding="sr", prescale=16 / 17)
    assert p.prescale_factor == 16 / 17 and p.short() == "nvfp4/sr*0.9412"
    assert GemmRecipe(a=p, b=p).output_scale == pytest.approx((17 / 16) ** 2)


def test_recipes_with_variants_round_trip_and_old_keys_stay():
    e = QuantSpec(format="nvfp4", rounding="eden")
    f = QuantSpec(format="nvfp4", scale_rule="mse", block_rows=16)
    o = QuantSpec(format="nvfp4", outer_block=128, rounding="sr", prescale=16 / 17)
    r = Recipe(
        fprop=GemmRecipe(a=f, b=f),
        dgrad=GemmRecipe(a=e, b=e, hadamard=HadamardSpec(size=128, signs="random")),
        wgrad=GemmRecipe(a=o, b=o),
    )
    d = r.to_dict()
    assert d["fprop"]["a"]["scale_rule"] == "mse" and d["wgrad"]["a"]["outer_block"] == 128
    assert Recipe.from_dict(d) == r
    plain = Recipe.from_shorthand(["fprop"], fp4_format="nvfp4").to_dict()
    assert "scale_rule" not in plain["fprop"]["a"] and "outer_block" not in plain["fprop"]["a"]
    t = r.table()["gemms"]
    assert t["fprop"]["b"]["scale_rule"] == "mse" and t["dgrad"]["a"]["rounding"] == "eden"


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize(("spec", "size"), VARIANTS, ids=IDS)
def test_emulated_gemm_modes_agree(spec, size, mode):
    a, b = _x(1, (16, 256)), _x(2, (24, 256))
    h = None if size is None else HadamardSpec(size=size, signs="fixed")
    g = GemmRecipe(a=spec, b=spec, hadamard=h)
    signs = None if size is None else sign_vector(size, 3)
    keys = GemmKeys(a=1, b=2, signs=0)
    out = EmulatedBackend(mode).mm(a, b, g, keys, signs)
    ref = EmulatedBackend("fp32").mm(a, b, g, keys, signs)
    # the bf16 mode multiplies exact block values and applies the tensor scales to the sum
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize(("spec", "size"), VARIANTS[:4], ids=IDS[:4])
def test_native_packing_decodes_to_the_emulated_values(spec, size):
    x = _x(3, (32, 256))
    had = _had(size)
    p = pack_operand(x, spec, key=4, hadamard=had)
    want = fake_quantize(x, spec, key=4, hadamard=had, out_dtype=torch.float32)
    assert torch.equal(dequantize_packed(p)[:32, : want.shape[1]], want)


# torch 2.11's Inductor (C++ on the CPU) may compile the decoded values of MS-EDEN and double-block
# NVFP4 off the eager product q * (s * dec) in some elements (codes and scales equal): the same
# three factors multiplied in another order. q * s is exact, so every order rounds at most twice and
# lands within 1.5 ulps of the exact product: two orders lie at most 2 float32 ulps apart (seen: 1
# for MS-EDEN on the AMD EPYC and 0 on the Intel Xeon, 2 for double-block there); torch 2.13
# compiles them bit for bit
_ULP_ON_211 = ("eden", "o128", "o128-sr-h16")
_OLD_TORCH = torch.__version__ < (2, 13)


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The most float32 ulps between two float32 tensors' elements of the same sign."""
    assert a.dtype == b.dtype == torch.float32 and torch.equal(a.signbit(), b.signbit())
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "size", "ulps"),
    [(*v, 2 if i in _ULP_ON_211 and _OLD_TORCH else 0) for v, i in zip(VARIANTS, IDS, strict=True)],
    ids=IDS,
)
def test_compiled_torch_path_equals_eager(spec, size, ulps):
    x = _x(4, (32, 256))
    had = _had(size)
    eager = quantize_fused(x, spec, key=6, hadamard=had, compile=False)
    comp = quantize_fused(x, spec, key=6, hadamard=had, compile=True)
    assert torch.equal(eager.codes, comp.codes) and torch.equal(eager.scales, comp.scales)
    v = fake_quantize_fused(x, spec, key=6, hadamard=had, compile=True, out_dtype=torch.float32)
    assert _ulps_apart(v, eager.dequantize()) <= ulps  # 0: bit for bit
