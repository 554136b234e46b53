"""Bit-level definitions of ``backends.quant.formats``: element grids and codes, E2M1 rounding, FP4 packing,
E8M0 scale codes.

The E2M1 rounding cases go through the quantizer (``quantize`` / ``fake_quantize`` and their pure-torch
references) with an MXFP4 block whose FLOOR scale is 2^0, so the element units are the input units.
"""

from __future__ import annotations

import math

import pytest
import torch

from backends.quant import (
    E2M1,
    E4M3,
    E5M2,
    QuantSpec,
    decode_e8m0,
    fake_quantize,
    fake_quantize_reference,
    pack_fp4,
    quantize,
    quantize_reference,
    unpack_fp4,
)
from backends.quant.formats import ELEMENT_FORMATS, element_format


def _next32(a: float, toward: float) -> float:
    """The float32 neighbour of ``a`` in the direction of ``toward``."""
    return float(torch.nextafter(torch.tensor(a), torch.tensor(toward)))


MXFP4 = QuantSpec(format="mxfp4")  # FLOOR scale, round to nearest even
QUANTIZERS = {"fast": quantize, "reference": quantize_reference}
FAKE_QUANTIZERS = {"fast": fake_quantize, "reference": fake_quantize_reference}


def _block_with_unit_scale(v: float) -> torch.Tensor:
    """One MXFP4 block: ``v`` first, 4.0 second, zeros. FLOOR: amax in [4, 8) -> E = 2 - 2 = 0."""
    x = torch.zeros(1, 32)
    x[0, 0] = v
    x[0, 1] = 4.0
    return x


# (input, rounded element value, magnitude code = index in the grid 0, .5, 1, 1.5, 2, 3, 4, 6)
E2M1_CASES = [
    # midpoint of 0 (code 0, even) and 0.5 (code 1, odd): ties to even -> 0
    (0.25, 0.0, 0b000),
    # midpoint of 0.5 (code 1, odd) and 1.0 (code 2, even) -> 1.0 ("half away from zero" agrees)
    (0.75, 1.0, 0b010),
    # midpoint of 1.0 (code 2, even) and 1.5 (code 3, odd) -> 1.0 (half away from zero would give 1.5)
    (1.25, 1.0, 0b010),
    # midpoint of 1.5 (code 3, odd) and 2.0 (code 4, even) -> 2.0
    (1.75, 2.0, 0b100),
    # midpoint of 2 (code 4, even) and 3 (code 5, odd) -> 2 (half away from zero would give 3)
    (2.5, 2.0, 0b100),
    # midpoint of 3 (code 5, odd) and 4 (code 6, even) -> 4
    (3.5, 4.0, 0b110),
    # midpoint of 4 (code 6, even) and 6 (code 7, odd) -> 4 (half away from zero would give 6)
    (5.0, 4.0, 0b110),
    # above the largest value 6: saturates to 6 (no infinities in E2M1)
    (7.0, 6.0, 0b111),
    # just off a midpoint: the nearest neighbour wins, whatever its parity
    (_next32(2.5, 3.0), 3.0, 0b101),
    (_next32(0.25, 0.0), 0.0, 0b000),
    (_next32(0.25, 1.0), 0.5, 0b001),
    (_next32(5.0, 6.0), 6.0, 0b111),
    # grid points are fixed points
    *[(g, g, i) for i, g in enumerate([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])],
]


@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["pos", "neg"])
@pytest.mark.parametrize(("v", "elem", "mag"), E2M1_CASES, ids=lambda a: repr(a))
def test_e2m1_rounds_to_nearest_ties_to_even_then_saturates(impl, sign, v, elem, mag):
    x = _block_with_unit_scale(sign * v)
    q = QUANTIZERS[impl](x, MXFP4)
    assert q.scales is not None and int(q.scales[0, 0]) == 127  # 2^0: element units = input units
    got = float(q.elements()[0, 0])
    assert got == sign * elem
    # sign in bit 3 even for zero: -0.25 -> -0 encodes as 0b1000
    assert int(q.codes[0, 0]) == (0b1000 if sign < 0 else 0) | mag
    fq = FAKE_QUANTIZERS[impl](x, MXFP4)
    assert float(fq[0, 0]) == sign * elem
    assert bool(torch.signbit(fq[0, 0])) == (sign < 0)


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_e2m1_saturates_far_above_max(impl):
    # amax 100: FLOOR scale E = floor(log2 100) - 2 = 6 - 2 = 4 -> 100 / 16 = 6.25 element units,
    # above 6 -> saturates to 6 (code 0b0111), dequantized 6 * 16 = 96.
    # A block whose scale is 2^0 cannot hold 100 (its amax decides the scale), so this is the closest
    # MX analogue of "100 -> 6" in element units.
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 100.0, -100.0
    q = QUANTIZERS[impl](x, MXFP4)
    assert q.scales is not None and int(q.scales[0, 0]) == 127 + 4
    assert q.codes[0, :2].tolist() == [0b0111, 0b1111]
    assert q.dequantize()[0, :2].tolist() == [96.0, -96.0]


def test_e2m1_grid_is_the_ocp_value_set():
    assert E2M1.grid().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert (E2M1.max, E2M1.emax, E2M1.emin, E2M1.bits) == (6.0, 2, 0, 4)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_fp8_grid_matches_torch_float8_dtype(fmt):
    # every finite non-negative value of torch's float8 dtype, ascending
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.torch_dtype).double()
    expected = torch.unique(vals[torch.isfinite(vals) & (vals >= 0)])
    grid = fmt.grid()
    assert torch.equal(grid, expected)
    assert fmt.max == float(grid[-1]) == torch.finfo(fmt.torch_dtype).max
    # grid index == magnitude code
    assert torch.equal(fmt.decode(torch.arange(grid.numel()).to(torch.uint8)).double(), grid)


def test_fp8_exponent_parameters():
    # emax is the exponent of the largest normal binade (the OCP shared-scale emax_elem)
    assert (E4M3.emax, E4M3.emin, E4M3.max) == (8, -6, 448.0)  # 448 = 1.75 * 2^8
    assert (E5M2.emax, E5M2.emin, E5M2.max) == (15, -14, 57344.0)  # 57344 = 1.75 * 2^15


def test_every_e2m1_code_round_trips():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = E2M1.decode(codes)
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert vals.tolist() == grid + [-g for g in grid]
    assert bool(torch.signbit(vals[8]))  # 0b1000 is -0
    assert torch.equal(E2M1.encode(vals), codes)


def test_e2m1_decodes_by_its_table_in_any_shape_and_in_a_traced_model():
    codes = torch.randint(
        0, 16, (3, 5, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    c = codes.long()  # the format's arithmetic, per element
    mag = E2M1._decode_magnitude(c & 7)
    by_rule = torch.where((c >> 3) & 1 == 1, -mag, mag).float()
    assert torch.equal(E2M1.decode(codes).view(torch.int32), by_rule.view(torch.int32))
    torch._dynamo.reset()
    traced = torch.compile(E2M1.decode, backend="aot_eager", fullgraph=True)(codes)
    assert traced.shape == codes.shape and traced.dtype == torch.float32
    assert torch.equal(traced.view(torch.int32), by_rule.view(torch.int32))


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_every_fp8_code_round_trips_and_matches_torch(fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = fmt.decode(codes)
    assert vals.dtype == torch.float32
    ref = codes.view(fmt.torch_dtype).float()
    assert torch.equal(torch.isnan(vals), torch.isnan(ref))
    ok = ~torch.isnan(vals)
    assert torch.equal(vals[ok].view(torch.int32), ref[ok].view(torch.int32))  # -0 included
    assert torch.equal(fmt.encode(vals[ok]), codes[ok])
    n_nan = {"e4m3": 2, "e5m2": 6}[fmt.name]  # E4M3: S.1111.111; E5M2: S.11111.{01,10,11}
    assert int((~ok).sum()) == n_nan


def test_element_format_lookup_names_allowed_formats():
    assert element_format("e4m3") is E4M3
    assert set(ELEMENT_FORMATS) == {"e2m1", "e4m3", "e5m2"}
    with pytest.raises(ValueError, match="allowed: e2m1, e4m3, e5m2"):
        element_format("e3m2")


# ----------------------------------------------------------------------------------------------
# FP4 packing


def test_pack_fp4_puts_element_2i_in_the_low_nibble():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x7, 0x8, 0x0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x21, 0x7F, 0x08]]


@pytest.mark.parametrize("shape", [(2,), (3, 10), (2, 5, 4)])
def test_pack_unpack_fp4_round_trip(shape):
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(unpack_fp4(packed), codes)


def test_pack_fp4_packs_the_last_dim_of_a_noncontiguous_view():
    codes = torch.arange(16, dtype=torch.uint8).view(4, 4).t()  # rows [0,4,8,12], ...
    packed = pack_fp4(codes)
    assert packed.is_contiguous()
    assert packed[0].tolist() == [0x40, 0xC8]
    assert torch.equal(unpack_fp4(packed), codes)


@pytest.mark.parametrize("shape", [(3,), (2, 7)])
def test_pack_fp4_rejects_odd_last_dim(shape):
    with pytest.raises(ValueError, match="even last dimension"):
        pack_fp4(torch.zeros(shape, dtype=torch.uint8))


def test_packed_bytes_work_as_torch_float4_e2m1fn_x2():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, generator=g)
    q = quantize(x, MXFP4)
    packed = q.packed()
    assert torch.equal(packed, pack_fp4(q.codes))
    f4 = packed.view(torch.float4_e2m1fn_x2)
    assert f4.dtype == torch.float4_e2m1fn_x2 and f4.shape == (4, 32)
    assert torch.equal(f4.view(torch.uint8), packed)
    assert torch.equal(unpack_fp4(f4), q.codes)  # unpack_fp4 accepts the float4 view directly
    with pytest.raises(ValueError, match="FP4 formats"):
        quantize(x, QuantSpec(format="mxfp8_e4m3")).packed()


# ----------------------------------------------------------------------------------------------
# E8M0


@pytest.mark.parametrize(
    ("code", "value"),
    [(0, 2.0**-127), (1, 2.0**-126), (126, 0.5), (127, 1.0), (128, 2.0), (254, 2.0**127)],
)
def test_decode_e8m0_is_two_to_the_code_minus_127(code, value):
    out = decode_e8m0(torch.tensor([code], dtype=torch.uint8))
    assert out.dtype == torch.float32
    assert float(out[0]) == value  # 2^-127 is an fp32 subnormal, still exact


def test_decode_e8m0_code_255_is_nan_and_all_others_exact():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = decode_e8m0(codes).double()
    assert math.isnan(float(out[255]))
    expected = torch.tensor([2.0 ** (c - 127) for c in range(255)], dtype=torch.float64)
    assert torch.equal(out[:255], expected)
