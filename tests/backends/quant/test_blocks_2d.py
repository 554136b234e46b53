"""2-D block scaling (``QuantSpec.block_rows``): one scale per square tile of a 2-D operand, as
NVIDIA's NVFP4 recipe scales weights in 16x16 tiles so that W (fprop) and W^T (dgrad) are the same
quantized values. Codes and scales against hand-computed ones, every quantizer path against the
reference bit for bit, W and W^T dequantizing to identical values, ``QTensor.t``, and the argument
checks."""

from __future__ import annotations

import math

import pytest
import torch

from backends.quant import (
    E4M3,
    QuantSpec,
    fake_quantize,
    fake_quantize_fused,
    fake_quantize_reference,
    quantize,
    quantize_fused,
    quantize_reference,
)
from backends.quant.quantizer import global_scales

QUANTIZERS = {"fast": quantize, "fused": quantize_fused, "reference": quantize_reference}
SPECS_2D = [
    QuantSpec(format="nvfp4", block_rows=16),
    QuantSpec(format="mxfp4", block_rows=32),
    QuantSpec(format="mxfp8_e4m3", block_rows=32),
    QuantSpec(format="nvfp4", block_rows=16, rounding="sr", prescale=True),
    QuantSpec(format="mxfp4", block_rows=32, scale_mode="rceil"),
]


def _heavy(shape: tuple[int, int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(1.5 * torch.randn(shape, generator=g))
    x.view(-1)[::13] = 0.0
    return x


# shapes: whole tiles, ragged rows and columns, fewer rows than a tile
SHAPES = [(64, 96), (37, 50), (5, 100), (100, 7)]


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_nvfp4_16x16_hand_computed_scales_and_codes(impl):
    # one tile row, two tiles along K; the tensor amax is 2688 = 6 * 448, so the FP32 tensor
    # scale is exactly 1 and each tile's E4M3 scale is its amax / 6
    w = torch.zeros(16, 32)
    w[15, 3] = 2688.0  # tile 0's maximum, in its last row: scale 448 (E4M3 0x7E)
    w[0, 0], w[0, 1], w[0, 2] = 448.0, 672.0, -896.0  # 1, 1.5, -2 in elements
    w[15, 20] = 12.0  # tile 1's maximum: scale 2 (E4M3 0x40)
    w[0, 16], w[0, 17], w[0, 18], w[0, 19] = 1.0, 3.0, 0.7, 0.2  # 0.5, 1.5, 0.35 -> 0.5, 0.1 -> 0
    q = QUANTIZERS[impl](w, QuantSpec(format="nvfp4", block_rows=16), axis=1)
    assert q.scales is not None and q.global_dec is not None
    assert float(q.global_dec) == 1.0
    assert q.scales.shape == (16, 2)
    assert (q.scales[:, 0] == 0x7E).all() and (q.scales[:, 1] == 0x40).all()  # every row, one tile
    assert float(torch.tensor(0x7E, dtype=torch.uint8).view(torch.float8_e4m3fn)) == 448.0
    assert q.codes[15, 3] == 7  # 6.0
    assert q.codes[0, :4].tolist() == [2, 3, 0x8 | 4, 0]  # 1.0, 1.5, -2.0, 0
    assert q.codes[15, 20] == 7 and q.codes[0, 16:20].tolist() == [1, 3, 1, 0]
    # a row-wise (1x16) quantizer would have scaled row 0 of tile 0 by its own amax (896)
    row = quantize_reference(w, QuantSpec(format="nvfp4"), axis=1)
    assert row.scales is not None and int(row.scales[0, 0]) != 0x7E
    expect = torch.zeros(16, 32)
    expect[15, 3], expect[0, :3] = 2688.0, torch.tensor([448.0, 672.0, -896.0])
    expect[15, 20], expect[0, 16:19] = 12.0, torch.tensor([1.0, 3.0, 1.0])
    assert torch.equal(q.dequantize(), expect)


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_mxfp4_32x32_hand_computed_scales_and_codes(impl):
    w = torch.zeros(40, 64)  # two tile rows (the second ragged: 8 rows), two tiles along K
    w[31, 0] = 6.0  # tile (0, 0): E = floor(log2 6) - 2 = 0, code 127
    w[0, 1] = 1.5  # code 3
    w[30, 40] = -0.75  # tile (0, 1): E = -1 - 2 = -3, code 124; -0.75 * 8 = -6: code 0xF
    w[0, 33] = 0.25  # 0.25 * 8 = 2: code 4
    w[39, 63] = 2.0**-20  # tile (1, 1) alone: E = -22, code 105; tile (1, 0) all zero: code 0
    q = QUANTIZERS[impl](w, QuantSpec(format="mxfp4", block_rows=32), axis=1)
    assert q.scales is not None and q.scales.shape == (40, 2)
    assert (q.scales[:32, 0] == 127).all() and (q.scales[:32, 1] == 124).all()
    assert (q.scales[32:, 0] == 0).all() and (q.scales[32:, 1] == 105).all()
    assert q.codes[31, 0] == 7 and q.codes[0, 1] == 3
    assert q.codes[30, 40] == 0x8 | 7 and q.codes[0, 33] == 4
    assert q.codes[39, 63] == 6  # 2^-20 / 2^-22 = 4.0: E2M1 code 6
    assert torch.equal(q.dequantize(), w)


@pytest.mark.parametrize("spec", SPECS_2D, ids=lambda s: s.short())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_path_equals_the_reference_bit_for_bit(spec, shape):
    x = _heavy(shape, sum(shape))
    for axis in (1, 0):
        ref = quantize_reference(x, spec, axis, key=5)
        for q in (
            quantize(x, spec, axis, key=5),
            quantize_fused(x, spec, axis, key=5, compile=False),
        ):
            assert torch.equal(q.codes, ref.codes)
            assert q.scales is not None and ref.scales is not None
            assert torch.equal(q.scales, ref.scales)
            assert (q.global_dec is None) == (ref.global_dec is None)
        values = ref.dequantize()
        for fq in (
            fake_quantize(x, spec, axis, key=5),
            fake_quantize_fused(x, spec, axis, key=5, compile=False),
            fake_quantize_reference(x, spec, axis, key=5),
        ):
            assert torch.equal(fq, values)


@pytest.mark.parametrize("spec", [s for s in SPECS_2D if s.rounding == "rne"], ids=QuantSpec.short)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_w_and_w_transposed_dequantize_to_identical_values(spec, shape):
    w = _heavy(shape, 7)
    fprop = quantize(w, spec, axis=1)  # W (out, in) along in: the fprop operand
    dgrad = quantize(w.t(), spec, axis=1)  # W^T (in, out) along out: the dgrad operand
    assert torch.equal(fprop.dequantize(), dgrad.dequantize().t())
    # and QTensor.t() gives the dgrad quantization from the fprop one without rounding again
    t = fprop.t()
    assert torch.equal(t.codes, dgrad.codes)
    assert t.scales is not None and dgrad.scales is not None
    assert torch.equal(t.scales, dgrad.scales)
    assert (t.shape, t.axis) == (dgrad.shape, dgrad.axis)
    assert torch.equal(t.dequantize(), fprop.dequantize().t())
    # the same along the other axis of W
    assert torch.equal(quantize(w, spec, axis=0).dequantize(), fprop.dequantize())


def test_one_d_blocks_do_not_have_that_property():
    # the reason for 2-D blocks: with 1x16 blocks fprop and dgrad see different weights
    w = _heavy((64, 64), 3)
    spec = QuantSpec(format="nvfp4")
    assert not torch.equal(
        quantize(w, spec, axis=1).dequantize(), quantize(w.t(), spec, axis=1).dequantize().t()
    )


def test_sr_transposes_the_one_quantization_it_made():
    w = _heavy((48, 80), 9)
    spec = QuantSpec(format="nvfp4", block_rows=16, rounding="sr")
    q = quantize(w, spec, axis=1, key=3)
    assert torch.equal(q.t().dequantize(), q.dequantize().t())


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_a_non_finite_value_makes_its_whole_tile_nan(impl):
    w = _heavy((64, 64), 4)
    w[40, 5] = math.nan
    q = QUANTIZERS[impl](w, QuantSpec(format="mxfp4", block_rows=32), axis=1)
    v = q.dequantize()
    assert v[32:, :32].isnan().all()
    assert not v[:32].isnan().any() and not v[:, 32:].isnan().any()


def test_two_d_blocks_scale_on_the_tile_maximum():
    # every element is within the tile's range: nothing saturates past what the tile amax allows
    w = _heavy((64, 64), 12)
    q = quantize(w, QuantSpec(format="nvfp4", block_rows=16), axis=1)
    assert q.scales is not None
    s = q.scales.view(torch.float8_e4m3fn).float()
    assert float(s.max()) <= E4M3.max
    tile_amax = w.abs().unflatten(0, (4, 16)).unflatten(2, (4, 16)).amax((1, 3))
    genc = torch.tensor(global_scales(w, QuantSpec(format="nvfp4"))[0])  # float32
    expect = ((tile_amax / torch.tensor(6.0)) * genc).to(torch.float8_e4m3fn).float()
    assert torch.equal(s[::16], expect)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"format": "nvfp4", "block_rows": 32}, ["block_rows: 32", "allowed: 1", "16"]),
        ({"format": "mxfp4", "block_rows": 16}, ["allowed: 1", "32 (32x32 tiles)"]),
        ({"format": "fp8_e4m3", "block_rows": 16}, ["per tensor"]),
        ({"format": "mxfp4", "block_size": 16, "block_rows": 16}, None),  # 16x16 MX: allowed
    ],
)
def test_block_rows_checks(kw, words):
    if words is None:
        assert QuantSpec(**kw).short() == "mxfp4/b16/16x16"
        return
    with pytest.raises(ValueError) as e:
        QuantSpec(**kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_two_d_blocks_need_a_two_d_tensor():
    with pytest.raises(ValueError, match="need a 2-D tensor"):
        quantize(torch.randn(2, 16, 16), QuantSpec(format="nvfp4", block_rows=16))
    with pytest.raises(ValueError, match="2-D blocks"):
        quantize(torch.randn(16, 16), QuantSpec(format="nvfp4")).t()
