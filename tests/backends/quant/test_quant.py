"""Block quantization (``backends.quant.quantizer``), its implementations and definitions: the fused C
path equals the pure-torch reference bit for bit, NVFP4 and per-tensor FP8 follow their definitions.
Stochastic rounding, the prescale, non-finite and all-zero blocks, ragged reduction dimensions and
argument checks are in ``test_quant_rules.py``; agreement with torchao's MX quantizer in
``test_torchao.py``; the E2M1 rounding table and the code layouts in ``test_formats.py``.
"""

from __future__ import annotations

import pytest
import torch
from quant_cases import (
    FAKE_QUANTIZERS,
    KEY,
    LAYOUTS,
    MX_FORMATS,
    QUANTIZERS,
    bits_equal,
    heavy,
    one_thread,
    same_qtensor,
    to_dtype,
)

from backends.quant import (
    FORMATS,
    QuantSpec,
    ScaleMode,
    fake_quantize,
    fake_quantize_fused,
    fake_quantize_reference,
    quantize,
    quantize_fused,
    quantize_reference,
)
from backends.quant import ckernel as _kernel

__all__ = ["one_thread"]  # the autouse fixture, from the shared module

# ----------------------------------------------------------------------------------------------
# fast path == reference, bit for bit


SPECS = [
    *[(f, m) for f in MX_FORMATS for m in ScaleMode],
    *[(f, ScaleMode.FLOOR) for f in FORMATS if f not in MX_FORMATS],  # mode unused there
]
# Every spec x {rne, sr} x prescale on/off in float32. The input dtype only changes how the kernel
# loads elements and stores its output, so 16-bit inputs get each format on the hot path (rne, no
# prescale) and the general path (sr with prescale), under two scale modes for the MX formats.
EQUIV_CASES = [
    *[(f, m, r, p, torch.float32) for f, m in SPECS for r in ("rne", "sr") for p in (False, True)],
    *[
        (f, m, r, p, dt)
        for dt in (torch.bfloat16, torch.float16)
        for f, m in SPECS
        if m in (ScaleMode.FLOOR, ScaleMode.RCEIL)
        for r, p in (("rne", False), ("sr", True))
    ],
]


def _case_id(case: tuple) -> str:
    f, m, r, p, dt = case
    return "-".join([f, m.value, r, *(["prescale"] if p else []), str(dt).removeprefix("torch.")])


def test_c_kernel_is_built():
    # Without it ``quantize`` falls back to the reference and the bit-equality tests below would
    # compare the reference with itself.
    assert _kernel.available()


@pytest.mark.parametrize(
    ("fmt", "mode", "rounding", "prescale", "dtype"), EQUIV_CASES, ids=map(_case_id, EQUIV_CASES)
)
def test_fast_path_equals_reference_bit_for_bit(fmt, mode, rounding, prescale, dtype):
    spec = QuantSpec(format=fmt, scale_mode=mode, rounding=rounding, prescale=prescale)
    for name, (make, axis) in LAYOUTS.items():
        x = to_dtype(make(), dtype)
        if name.startswith(("transposed", "permuted")):
            assert not x.is_contiguous()
        try:
            ref = quantize_reference(x, spec, axis, KEY)
            same_qtensor(quantize(x, spec, axis, KEY), ref)
            fast = fake_quantize(x, spec, axis, KEY)
            assert fast.dtype == dtype and fast.shape == x.shape
            # fake_quantize_reference(x, ...) is by definition this (one reference call saved)
            bits_equal(fast, ref.dequantize(dtype))
        except AssertionError as e:
            raise AssertionError(f"layout {name}: {e}") from e


@pytest.mark.parametrize(
    ("fmt", "mode", "rounding", "prescale", "dtype"), EQUIV_CASES, ids=map(_case_id, EQUIV_CASES)
)
def test_fused_torch_path_equals_reference_bit_for_bit(fmt, mode, rounding, prescale, dtype):
    # the GPU path, run eagerly here: same codes, scales, tensor scale and values as the reference
    spec = QuantSpec(format=fmt, scale_mode=mode, rounding=rounding, prescale=prescale)
    for name, (make, axis) in LAYOUTS.items():
        x = to_dtype(make(), dtype)
        try:
            ref = quantize_reference(x, spec, axis, KEY)
            same_qtensor(quantize_fused(x, spec, axis, KEY, compile=False), ref)
            fused = fake_quantize_fused(x, spec, axis, KEY, compile=False)
            assert fused.dtype == dtype and fused.shape == x.shape
            bits_equal(fused, ref.dequantize(dtype))
        except AssertionError as e:
            raise AssertionError(f"layout {name}: {e}") from e


THREAD_SPECS = [
    QuantSpec(format="mxfp4"),  # the hot path
    QuantSpec(format="mxfp4", rounding="sr", prescale=True),
    QuantSpec(format="mxfp8_e5m2", scale_mode=ScaleMode.RCEIL),
    QuantSpec(format="nvfp4", rounding="sr"),
    QuantSpec(format="fp8_e4m3"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("spec", THREAD_SPECS, ids=lambda s: s.short())
def test_fast_path_is_independent_of_the_thread_count(spec, dtype):
    # 1 thread (the one the other tests use) vs 3 threads: uneven splits of blocks and column chunks
    for name, (make, axis) in LAYOUTS.items():
        x = to_dtype(make(), dtype)
        out = {}
        for threads in (1, 3):
            torch.set_num_threads(threads)
            out[threads] = (quantize(x, spec, axis, KEY), fake_quantize(x, spec, axis, KEY))
        try:
            same_qtensor(out[1][0], out[3][0])
            bits_equal(out[1][1], out[3][1])
        except AssertionError as e:
            raise AssertionError(f"layout {name}: {e}") from e


@pytest.mark.parametrize(
    ("in_dtype", "out_dtype"),
    [
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float16),
    ],
    ids=str,
)
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8_e4m3"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_fast_path_equals_reference_with_an_explicit_out_dtype(fmt, rounding, in_dtype, out_dtype):
    spec = QuantSpec(format=fmt, rounding=rounding)
    for make, axis in (LAYOUTS["rows_and_edges_axis-1"], LAYOUTS["3d_middle_axis"]):
        x = make().to(in_dtype)
        fast = fake_quantize(x, spec, axis, KEY, out_dtype=out_dtype)
        assert fast.dtype == out_dtype
        bits_equal(fast, fake_quantize_reference(x, spec, axis, KEY, out_dtype=out_dtype))


@pytest.mark.parametrize("block", [2, 16, 64, 1024])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "nvfp4"])
def test_fast_path_equals_reference_for_block_size_overrides(fmt, block):
    spec = QuantSpec(format=fmt, block_size=block, rounding="sr")
    for make, axis in (LAYOUTS["ragged37_axis-1"], LAYOUTS["edges_ragged50_axis0"]):
        x = make()
        q = quantize(x, spec, axis, KEY)
        same_qtensor(q, quantize_reference(x, spec, axis, KEY))
        assert q.scales is not None and q.scales.shape[-1] == -(-x.shape[axis] // block)
        bits_equal(fake_quantize(x, spec, axis, KEY), fake_quantize_reference(x, spec, axis, KEY))


@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8_e5m2"])
def test_result_does_not_depend_on_memory_layout(fmt, rounding):
    # the same logical tensor, contiguous or as a transposed view, quantized along either axis:
    # identical results (the SR stream is indexed in the axis-last logical order)
    spec = QuantSpec(format=fmt, rounding=rounding)
    x = heavy((48, 40), 12)
    xt = x.t().contiguous().t()  # same values, column-major
    for axis in (0, 1):
        same_qtensor(quantize(x, spec, axis, KEY), quantize(xt, spec, axis, KEY))
        bits_equal(fake_quantize(x, spec, axis, KEY), fake_quantize(xt, spec, axis, KEY))


# ----------------------------------------------------------------------------------------------
# NVFP4 from its definition, by hand
#
# TransformerEngine's arithmetic (quant.py's docstring; tests/backends/quant/test_nvfp4_te.py checks it
# against a transcription of TE's reference): S = 448 * 6 / amax (fp32 tensor encode scale), block
# decode scale s = E4M3_RNE(min(block_amax * (S * fp32(1/6)), 448)), elements q = E2M1_RNE(x * e)
# clamped to +-6 with e = min(1 / (s * fp32(1 / S)), FLT_MAX), value = q * ((s * amax) * fp32(1/2688)).
# In the hand tensor below S is a power of two, so these equal the plain (block_amax / 6) * S, S / s
# and s / S.


def _nvfp4_hand_tensor() -> torch.Tensor:
    x = torch.zeros(1, 64)
    # block 0 holds the tensor amax 5.25: S = 2688 / 5.25 = 512 (exact, 1/S = 2^-9),
    #   s = (5.25 / 6) * 512 = 448 -> E4M3 448 = 1.110b * 2^8, code 0_1111_110 = 0x7E;
    #   S / s = 8/7, so x = 0.875 * v lands on v: 5.25 -> 6, -2.625 -> -3, 0.875 -> 1, 0.4375 -> 0.5;
    #   value = v * 448 / 512 = 0.875 * v = x exactly.
    x[0, 0:4] = torch.tensor([5.25, -2.625, 0.875, 0.4375])
    # block 1: amax 57/256: s = (57/256 / 6) * 512 = 19, a tie between E4M3 18 = 1.001b * 2^4 (odd)
    #   and 20 = 1.010b * 2^4 (even) -> 20, code 0_1011_010 = 0x5A. S / s = 25.6:
    #   57/256 * 25.6 = 5.7 -> 6;  0.0625 * 25.6 = 1.6 -> 1.5;  -0.125 * 25.6 = -3.2 -> -3;
    #   25/256 * 25.6 = 2.5, an E2M1 tie -> 2.  Values q * 20 / 512: 0.234375, 0.05859375,
    #   -0.1171875, 0.078125.
    x[0, 16:20] = torch.tensor([57 / 256, 0.0625, -0.125, 25 / 256])
    # block 2: amax 51/256: s = 17, a tie between 16 = 1.000b * 2^4 (even) and 18 (odd) -> 16,
    #   code 0_1011_000 = 0x58. S / s = 32: 51/256 * 32 = 6.375 -> saturates to 6 (the E4M3 scale
    #   rounded down, so the block maximum exceeds 6); 0.0625 * 32 = 2; -0.125 * 32 = -4;
    #   25/256 * 32 = 3.125 -> 3. Values q * 16 / 512: 0.1875, 0.0625, -0.125, 0.09375.
    x[0, 32:36] = torch.tensor([51 / 256, 0.0625, -0.125, 25 / 256])
    # block 3: all zeros: s = 0 -> scale code 0, elements 0.
    return x


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_nvfp4_hand_computed_scales_codes_and_values(impl):
    q = QUANTIZERS[impl](_nvfp4_hand_tensor(), QuantSpec(format="nvfp4"))
    assert q.scales is not None and q.global_dec is not None
    assert q.scales.tolist() == [[0x7E, 0x5A, 0x58, 0x00]]
    assert float(q.global_dec) == 2.0**-9
    codes = q.codes.view(4, 16)
    # E2M1 codes: 6 = 0111, -3 = 1101, 1 = 0010, 0.5 = 0001, 1.5 = 0011, 2 = 0100, -4 = 1110, 3 = 0101
    assert codes[0, :4].tolist() == [0b0111, 0b1101, 0b0010, 0b0001]
    assert codes[1, :4].tolist() == [0b0111, 0b0011, 0b1101, 0b0100]
    assert codes[2, :4].tolist() == [0b0111, 0b0100, 0b1110, 0b0101]
    assert codes[:, 4:].eq(0).all() and codes[3].eq(0).all()
    deq = q.dequantize().view(4, 16)
    assert deq[0, :4].tolist() == [5.25, -2.625, 0.875, 0.4375]
    assert deq[1, :4].tolist() == [0.234375, 0.05859375, -0.1171875, 0.078125]
    assert deq[2, :4].tolist() == [0.1875, 0.0625, -0.125, 0.09375]
    assert deq[:, 4:].eq(0).all() and deq[3].eq(0).all()
    fq = FAKE_QUANTIZERS[impl](_nvfp4_hand_tensor(), QuantSpec(format="nvfp4"))
    bits_equal(fq, q.dequantize())


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_nvfp4_all_zero_tensor(impl):
    # amax 0: no encode scale to compute; S = 1, every block scale code 0, every element 0.
    q = QUANTIZERS[impl](torch.zeros(3, 32), QuantSpec(format="nvfp4"))
    assert q.scales is not None and q.global_dec is not None
    assert q.scales.shape == (3, 2) and q.scales.eq(0).all()
    assert float(q.global_dec) == 1.0
    assert q.codes.eq(0).all()
    assert torch.equal(q.dequantize(), torch.zeros(3, 32))


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_nvfp4_scales_and_global_scale_follow_the_definition(impl):
    x = heavy((6, 64), 13)
    q = QUANTIZERS[impl](x, QuantSpec(format="nvfp4"))
    one, amax = torch.tensor(1.0), x.abs().max()
    S = torch.tensor(2688.0) / amax  # float32
    Sd = one / S
    s = x.view(6, 4, 16).abs().amax(-1) * (S * (one / torch.tensor(6.0)))
    s8 = s.clamp(max=448.0).to(torch.float8_e4m3fn)  # torch's float8 cast: RNE
    assert q.scales is not None and q.global_dec is not None and q.global_amax is not None
    assert torch.equal(q.scales, s8.view(torch.uint8))
    assert float(q.global_dec) == float(Sd) and float(q.global_amax) == float(amax)
    # elements: E2M1_RNE(x * min(1 / (s * Sd), FLT_MAX)): the nearest grid point of the float32
    # product, never above 6 (ties and codes: test_nvfp4_te.py, test_formats.py)
    enc = torch.clamp(one / (s8.float() * Sd), max=torch.finfo(torch.float32).max)
    v = (x.view(6, 4, 16) * enc.unsqueeze(-1)).view(6, 64)
    e = q.elements()
    assert float(e.abs().max()) <= 6.0
    step = torch.where(v.abs() < 2, 0.5, torch.where(v.abs() < 4, 1.0, 2.0))
    assert bool(((e - v).abs() <= step / 2).all())


# The element encode factor 1 / (s * S_dec) would overflow to inf when the tensor amax is tiny
# (S_dec = amax / 2688 subnormal) and a block's E4M3 scale s small. Every path saturates it at the
# float32 maximum, as TransformerEngine does, so zeros stay zeros.
@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_nvfp4_tensor_of_tiny_values_keeps_zeros_and_distinct_values(impl):
    x = torch.zeros(1, 32)
    x[0, 0] = 1e-35  # tensor amax: S = 2688 / 1e-35 = 2.688e38, still finite
    # block 1: s = 1e-38 * (S * fp32(1/6)) = 0.448 -> E4M3 0.4375; 1 / (s * S_dec) > float32 max
    x[0, 16:19] = torch.tensor([1e-38, 5e-39, 1e-39])
    spec = QuantSpec(format="nvfp4")
    q = QUANTIZERS[impl](x, spec)
    fq = FAKE_QUANTIZERS[impl](x, spec)
    assert q.dequantize()[0, 19:].eq(0).all() and fq[0, 19:].eq(0).all()  # zeros stay zero
    assert len(set(q.codes[0, 16:19].tolist())) == 3  # not all saturated to the same code
    bits_equal(fake_quantize(x, spec), fake_quantize_reference(x, spec))


@pytest.mark.parametrize("axis", [-1, 0])
def test_nvfp4_block_with_zero_scale_under_stochastic_rounding(axis):
    # a block whose E4M3 scale rounds to 0 gets the encode factor FLT_MAX (TransformerEngine's
    # rule): x * FLT_MAX overflows to inf for most x, and saturates to +-6 under SR as under RNE;
    # a subnormal x * FLT_MAX stays small and rounds stochastically. Along both axes (the kernel's
    # contiguous and strided loops)
    x = torch.zeros(64, 32)
    x[0, 0] = 3.0
    x[1:5, 16] = torch.tensor([5e-6, -2e-6, 1e-44, -3e-45])  # scale 0 in its column / row block
    x[20:24, 3] = torch.tensor([4e-6, 1e-40, -2e-43, 1e-45])
    x = x if axis == 0 else x.t().contiguous()
    spec = QuantSpec(format="nvfp4", rounding="sr")
    ref = quantize_reference(x, spec, axis, KEY)
    for impl in ("fast", "fused"):
        same_qtensor(QUANTIZERS[impl](x, spec, axis, KEY), ref)
        bits_equal(FAKE_QUANTIZERS[impl](x, spec, axis, KEY), ref.dequantize())
    e = ref.elements().movedim(-1, axis)
    big = e[1:3, 16] if axis == 0 else e[16, 1:3]
    assert big.tolist() == [6.0, -6.0]
    assert ref.dequantize()[x != 0].abs().max() == 3.0  # the zero-scale blocks decode to 0


# ----------------------------------------------------------------------------------------------
# FP8 per tensor


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize(
    ("fmt", "dtype"), [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)]
)
def test_fp8_per_tensor_equals_torch_float8_cast(fmt, dtype, impl, axis):
    x = heavy((24, 50), 14)
    spec = QuantSpec(format=fmt)
    q = QUANTIZERS[impl](x, spec, axis)
    fmax = torch.finfo(dtype).max
    scale = torch.tensor(fmax) / x.abs().max()  # float32 encode scale max / amax
    ref = (x * scale).to(dtype)  # torch's RNE cast
    assert q.scales is None and q.global_dec is not None
    assert float(q.global_dec) == float(torch.tensor(1.0) / scale)
    assert torch.equal(q.codes, ref.view(torch.uint8).movedim(axis, -1))
    expected = ref.float() * q.global_dec
    bits_equal(q.dequantize(), expected)
    bits_equal(FAKE_QUANTIZERS[impl](x, spec, axis), expected)


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_fp8_per_tensor_all_zero_tensor(impl):
    q = QUANTIZERS[impl](torch.zeros(4, 8), QuantSpec(format="fp8_e4m3"))
    assert q.codes.eq(0).all() and float(q.global_dec) == 1.0
    assert torch.equal(q.dequantize(), torch.zeros(4, 8))


# ----------------------------------------------------------------------------------------------
# bad input

ENTRY_POINTS = {
    "quantize": quantize,
    "quantize_reference": quantize_reference,
    "fake_quantize": fake_quantize,
    "fake_quantize_reference": fake_quantize_reference,
}


def test_unknown_format_lists_allowed_formats():
    with pytest.raises(
        ValueError, match="allowed: mxfp4, mxfp8_e4m3, mxfp8_e5m2, nvfp4, fp8_e4m3, fp8_e5m2"
    ):
        QuantSpec(format="mxfp6")


def test_unknown_scale_mode_lists_allowed_modes():
    with pytest.raises(ValueError, match="allowed: floor, ceil, even, rceil"):
        QuantSpec(format="mxfp4", scale_mode="round")  # type: ignore[arg-type]
    assert QuantSpec(format="mxfp4", scale_mode="ceil").scale_mode is ScaleMode.CEIL  # type: ignore[arg-type]


def test_unknown_rounding_lists_allowed_roundings():
    with pytest.raises(ValueError, match="allowed: rne, sr"):
        QuantSpec(format="mxfp4", rounding="stochastic")  # type: ignore[arg-type]


@pytest.mark.parametrize("block", [24, 0, 2048, 1])
def test_block_size_must_be_an_allowed_power_of_two(block):
    with pytest.raises(ValueError, match="block_size: .* not allowed"):
        QuantSpec(format="mxfp4", block_size=block)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_block_size_on_a_per_tensor_format_raises(fmt):
    with pytest.raises(ValueError, match="scaled per tensor and takes no block size"):
        QuantSpec(format=fmt, block_size=32)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool], ids=str)
def test_integer_tensor_raises_type_error_naming_dtype(entry, dtype):
    with pytest.raises(TypeError, match=f"got {dtype}"):
        ENTRY_POINTS[entry](torch.zeros(2, 32, dtype=dtype), QuantSpec(format="mxfp4"))


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("axis", [2, -3, 5])
def test_axis_out_of_range_raises(entry, axis):
    with pytest.raises(ValueError, match=f"axis {axis} is out of range"):
        ENTRY_POINTS[entry](torch.zeros(2, 32), QuantSpec(format="mxfp4"), axis)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_scalar_tensor_and_non_spec_raise(entry):
    with pytest.raises(ValueError, match="at least one dimension"):
        ENTRY_POINTS[entry](torch.tensor(1.0), QuantSpec(format="mxfp4"))
    with pytest.raises(TypeError, match="spec must be a QuantSpec"):
        ENTRY_POINTS[entry](torch.zeros(2, 32), "mxfp4")  # type: ignore[arg-type]
