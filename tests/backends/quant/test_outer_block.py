"""Double-block NVFP4 (``outer_block``) equals TetraJet-v2's quantizer bit for bit.

``_tetrajet_v2`` transcribes ``quant_fp4_from_reg`` (round to nearest, ``Stochastic = false``) of
thu-ml/TetraJet-v2-NVFP4Training at commit ca5953f643d85c793fb3a210bf21f17fc88ce83e
(``kernels/csrc/quant_fp4.cu``) in torch float32: an FP32 outer scale per 128 elements of a row
(a warp's ``warpReduceScale``), an E4M3 inner scale per 16 (``__nv_cvt_float_to_fp8(...,
__NV_SATFINITE, __NV_E4M3)``), elements through ``__nv_cvt_float2_to_fp4x2(..., cudaRoundNearest)``
(round to nearest even, saturating) and the dequantization ``fp4_to_float(code) * scale_product``.
The inputs hold ties, all-zero inner blocks and an all-zero outer block, inner scales that would be
0, and random heavy-tailed rows. Not compared: non-finite inputs (the kernel's ``fmaxf`` skips a
NaN; here its outer block is NaN) and stochastic rounding (the kernel's own generator).
"""

from __future__ import annotations

import pytest
import torch

from backends.gemm import UnsupportedFormatError, check_recipe
from backends.quant import QuantSpec, fake_quantize, quantize
from backends.recipes import GemmRecipe, Recipe

F32 = torch.float32
SPEC = QuantSpec(format="nvfp4", outer_block=128)


def _e2m1_rn(v: torch.Tensor) -> torch.Tensor:
    """Round to nearest even on E2M1, saturating at +-6 (the CUDA conversion)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    m = v.abs().clamp(max=6.0)
    idx = torch.searchsorted(grid, m, right=True) - 1
    lo = grid[idx.clamp(0, 7)]
    hi = grid[(idx + 1).clamp(0, 7)]
    pick_hi = (hi - m < m - lo) | ((hi - m == m - lo) & ((idx + 1) % 2 == 0))
    return torch.copysign(torch.where(pick_hi, hi, lo), v)


def _tetrajet_v2(x: torch.Tensor) -> dict[str, torch.Tensor]:
    R, K = x.shape
    xf = x.float()
    outer_max = xf.reshape(R, K // 128, 128).abs().amax(-1)
    outer = outer_max / torch.tensor(448.0) / torch.tensor(6.0)
    outer = torch.where(outer == 0.0, torch.tensor(1.0), outer)
    inner_max = xf.reshape(R, K // 16, 16).abs().amax(-1)
    inner = inner_max / outer.repeat_interleave(8, -1) / torch.tensor(6.0)
    inner = torch.where(inner == 0.0, torch.tensor(0.001953125), inner)
    inner8 = inner.clamp(max=448.0).to(torch.float8_e4m3fn)  # SATFINITE, round to nearest
    product = outer.repeat_interleave(8, -1) * inner8.to(F32)
    inv = torch.where(product != 0.0, 1.0 / product, torch.tensor(0.0))
    q = _e2m1_rn(xf.reshape(R, K // 16, 16) * inv.unsqueeze(-1))
    values = q * product.unsqueeze(-1)
    return {
        "outer": outer,
        "inner": inner8.view(torch.uint8),
        "q": q.reshape(R, K),
        "values": values.reshape(R, K),
    }


def _cases(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 512, generator=g) * torch.exp(2 * torch.randn(8, 32, 1, generator=g)).repeat(
        1, 1, 16
    ).reshape(8, 512)
    x[0, :128] = 0.0  # an all-zero outer block: outer 1, inner 2^-9
    x[1, 16:32] = 0.0  # an all-zero inner block
    # outer max 2688 gives outer scale 1; an inner max 6 * 2^j the exact scale 2^j: these sit on
    # E2M1 midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (ties to even: 0, 1, 1, 2, 2, 4, 4)
    x[2, :128] = 0.0
    x[2, 0] = 2688.0
    j = 3
    x[2, 16:24] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) * 2**j
    x[2, 24:32] = -x[2, 17:25]
    return x


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_tetrajet_v2_quantizer_bit_for_bit(seed, dtype):
    x = _cases(seed).to(dtype)
    ref = _tetrajet_v2(x)
    q = quantize(x, SPEC)
    assert q.outer_scales is not None
    assert torch.equal(q.outer_scales, ref["outer"])
    assert torch.equal(q.scales, ref["inner"])
    assert torch.equal(q.elements(), ref["q"])
    assert torch.equal(q.dequantize(), ref["values"])
    assert torch.equal(fake_quantize(x, SPEC, out_dtype=F32), ref["values"])
    if seed == 0:  # the worked ties, rounded to even
        assert ref["q"][2, 16:24].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
        assert float(ref["outer"][2, 0]) == 1.0 and int(ref["inner"][2, 1]) == 0x50  # E4M3 8
        assert int(ref["inner"][1, 1]) == 1 and float(ref["outer"][0, 0]) == 1.0  # 2^-9; 1


def test_an_outer_block_with_a_nan_is_nan_and_no_other():
    x = _cases(2)
    x[5, 130] = torch.nan
    v = fake_quantize(x, SPEC)
    assert bool(v[5, 128:256].isnan().all())
    assert not bool(v[5, :128].isnan().any()) and not bool(v[:5].isnan().any())


def _tetrajet_v2_triton(x: torch.Tensor) -> torch.Tensor:
    """The values of the same repository's Triton reference (``kernels/baseline_fakequant/
    nvfp4_quant_fused_kernel.py``, round to nearest), which divides the elements by the scale
    product (``x_abs_blocks / scale_product``) where the CUDA kernel multiplies by its
    reciprocal; a zero inner scale becomes 2^-9 there as in the CUDA kernel."""
    R, K = x.shape
    xf = x.float()
    outer = xf.reshape(R, K // 128, 128).abs().amax(-1) / torch.tensor(448.0) / torch.tensor(6.0)
    outer = torch.where(outer == 0.0, torch.tensor(1.0), outer).repeat_interleave(8, -1)
    inner = xf.reshape(R, K // 16, 16).abs().amax(-1) / outer / torch.tensor(6.0)
    inner8 = inner.clamp(max=448.0).to(torch.float8_e4m3fn).to(F32)
    inner8 = torch.where(inner8 == 0.0, torch.tensor(2.0**-9), inner8)
    product = (inner8 * outer).unsqueeze(-1)
    xb = xf.reshape(R, K // 16, 16)
    scaled = torch.where(product == 0, torch.tensor(0.0), xb / product)
    return (_e2m1_rn(scaled) * product).reshape(R, K)


def test_a_tiny_outer_block_quantizes_to_its_values_not_to_nan():
    # an outer maximum of 1e-38: the scale product is about 1.7e-39, whose reciprocal overflows
    x = torch.zeros(1, 128)
    x[0, 0], x[0, 1] = 1e-38, 2.5e-39
    v = fake_quantize(x, SPEC, out_dtype=F32)
    assert not bool(v.isnan().any())
    assert torch.equal(v, _tetrajet_v2_triton(x))
    # the values themselves, to the precision a subnormal outer scale leaves (1e-38 / 2688)
    torch.testing.assert_close(v[0, :2], x[0, :2], rtol=1e-3, atol=0)
    assert bool(v[0, 2:].eq(0).all())
    # across scales, down to subnormal outer maxima, never a NaN where the reference has a number
    for e in range(-45, -30):
        x = torch.randn(4, 256, generator=torch.Generator().manual_seed(e)) * 10.0**e
        v = fake_quantize(x, SPEC, out_dtype=F32)
        ref = _tetrajet_v2_triton(x)
        assert not bool(v.isnan().any()) and torch.equal(v.isnan(), ref.isnan())
        assert torch.equal(v, ref), e


def test_a_ragged_row_pads_to_the_outer_block():
    x = _cases(3)[:, :200]
    q = quantize(x, SPEC)
    assert q.codes.shape == (8, 256) and q.outer_scales is not None
    assert q.outer_scales.shape == (8, 2)
    full = torch.nn.functional.pad(x, (0, 56))
    assert torch.equal(fake_quantize(x, SPEC), fake_quantize(full, SPEC)[:, :200])


def test_native_refuses_double_block_scales_and_says_why():
    r = Recipe(fprop=GemmRecipe(a=SPEC, b=SPEC))
    with pytest.raises(UnsupportedFormatError, match="one FP32 scale per tensor, not one per 128"):
        check_recipe(r, "sm_100")


def test_options_are_checked():
    with pytest.raises(ValueError, match="outer_block: an FP32 scale"):
        QuantSpec(format="mxfp4", outer_block=128)
    with pytest.raises(ValueError, match="outer_block: 24 is not allowed"):
        QuantSpec(format="nvfp4", outer_block=24)
    with pytest.raises(ValueError, match="outer_block: double-block scales take 1-D blocks"):
        QuantSpec(format="nvfp4", outer_block=128, block_rows=16)
    assert SPEC.short() == "nvfp4/o128"
