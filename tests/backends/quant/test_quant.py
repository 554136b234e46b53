"""Block quantization (``backends.quant.quantizer``): the fused C path equals the pure-torch reference bit for bit,
NVFP4 and per-tensor FP8 follow their definitions, stochastic rounding is unbiased and reproducible,
the clip-free prescale, non-finite and all-zero blocks, ragged reduction dimensions, argument checks.

Agreement with torchao's MX quantizer is tested in ``test_torchao.py``; the E2M1 rounding table and the
code layouts in ``test_formats.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from backends.quant import (
    E2M1,
    E4M3,
    E5M2,
    FORMATS,
    QTensor,
    QuantSpec,
    ScaleMode,
    decode_e8m0,
    fake_quantize,
    fake_quantize_fused,
    fake_quantize_reference,
    hadamard_transform,
    nv_decode,
    quantize,
    quantize_fused,
    quantize_reference,
)
from backends.quant import ckernel as _kernel
from backends.quant.formats import E8M0_NAN
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key

# fast: the C kernel here; fused: the torch arithmetic that runs on GPUs (eager on the CPU)
QUANTIZERS = {"fast": quantize, "fused": quantize_fused, "reference": quantize_reference}
FAKE_QUANTIZERS = {
    "fast": fake_quantize,
    "fused": fake_quantize_fused,
    "reference": fake_quantize_reference,
}
MX_FORMATS = [n for n, f in FORMATS.items() if f.scale == "e8m0"]
KEY = derive_key(42, 3, GEMM_IDS["dgrad"], OPERAND_IDS["dy"], 7)


@pytest.fixture(autouse=True)
def _one_thread():
    """The kernel runs single-threaded here: these tests call it thousands of times on tiny tensors,
    and an OpenMP team per call costs milliseconds on a busy machine. The multi-threaded kernel is
    checked against this one in ``test_fast_path_is_independent_of_the_thread_count``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same dtype, shape and bit pattern (so -0 != +0), with NaN == NaN whatever its payload."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    ints = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]
    assert torch.equal(a[~nan].view(ints), b[~nan].view(ints))


def _assert_same_qtensor(a: QTensor, b: QTensor) -> None:
    assert torch.equal(a.codes, b.codes)
    assert (a.scales is None) == (b.scales is None)
    if a.scales is not None:
        assert torch.equal(a.scales, b.scales)
    assert (a.global_dec is None) == (b.global_dec is None)
    if a.global_dec is not None:
        _bits_equal(a.global_dec.reshape(1), b.global_dec.reshape(1))
    assert (a.global_amax is None) == (b.global_amax is None)
    if a.global_amax is not None:
        _bits_equal(a.global_amax.reshape(1), b.global_amax.reshape(1))
    assert (a.axis, a.shape) == (b.axis, b.shape)


# ----------------------------------------------------------------------------------------------
# fast path == reference, bit for bit


def _heavy(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Normal values times a log-normal magnitude (heavy tails, block maxima spread over ~2^-8..2^8),
    with some exact zeros."""
    g = _gen(seed)
    x = torch.randn(shape, generator=g) * torch.exp(1.5 * torch.randn(shape, generator=g))
    x.view(-1)[::11] = 0.0
    return x


def _edge_narrow() -> torch.Tensor:
    """Rows of 64 (two MX blocks, four NVFP4 blocks) that sit on rounding and scale boundaries."""
    g = _gen(3)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
    rows = [
        torch.zeros(64),
        torch.tensor([0.0, -0.0] * 32),
        torch.cat([mids, -mids, mids * 2, -mids * 0.5, torch.full((32,), 4.0)]),  # E2M1 ties
        torch.cat([mids * 0.125, -mids * 64, torch.randn(48, generator=g)]),
        torch.full((64,), 7.0),  # FLOOR / EVEN boundary
        torch.full((64,), 6.0),
        torch.full((64,), 6.0 * 8 * (1 + 2.0**-10)),  # RCEIL: descale just above 2^3
        torch.full((64,), 448.0 * 2 * (1 + 2.0**-12)),
        torch.arange(64) * 1.0625 - 30,  # E4M3 ties (1 + 1/16) after scaling
        torch.randn(64, generator=g).sign() * (1 + torch.arange(64) / 16.0),  # E5M2/E4M3 ties
    ]
    for k in (-2, 0, 3):  # block maxima in [6, 8) * 2^k: FLOOR clips them
        r = torch.randn(64, generator=g) * 2.0**k
        r[5], r[40] = 7.5 * 2.0**k, -6.5 * 2.0**k
        rows.append(r)
    return torch.stack(rows)


def _edge_wide() -> torch.Tensor:
    """Rows spanning the float32 range: subnormal blocks, E8M0 clamping at both ends."""
    g = _gen(4)
    r = lambda: torch.randn(64, generator=g)  # noqa: E731
    rows = [
        r() * 2.0**-130,  # float32 subnormals: E clamps at -127 (code 0)
        r() * 2.0**-145,
        torch.full((64,), 2.0**-149),  # the smallest subnormal
        r() * 2.0**-120,
        r() * 2.0**110,
        torch.full((64,), 3.0e38),  # near float32 max
        r(),
        torch.zeros(64),
    ]
    return torch.stack(rows)


def _nonfinite() -> torch.Tensor:
    x = _heavy((4, 64), 5)
    x[0, 3] = math.nan
    x[1, 40] = math.inf
    x[3, 0] = -math.inf
    return x


def _hadamard_axis0() -> torch.Tensor:
    # the output of a Hadamard transform along axis 0 (K = 40 padded to 64), in whatever layout
    # hadamard_transform returns it
    return hadamard_transform(_heavy((40, 10), 6), axis=0, size=32)


def _rows_and_edges() -> torch.Tensor:
    return torch.cat([_heavy((8, 64), 0), _edge_narrow()])


def _edges_ragged_axis0() -> torch.Tensor:
    # K = 50 along axis 0 (a full block of 32 and a ragged one of 18), quantized column by column
    return torch.cat([_edge_narrow().t()[:50], _heavy((50, 6), 2)], 1).contiguous()


# name -> (tensor factory, axis)
LAYOUTS: dict[str, tuple[Callable[[], torch.Tensor], int]] = {
    "rows_and_edges_axis-1": (_rows_and_edges, -1),
    "ragged37_axis-1": (lambda: _heavy((6, 37), 1), -1),
    "edges_ragged50_axis0": (_edges_ragged_axis0, 0),
    "3d_middle_axis": (lambda: _heavy((3, 37, 5), 7), 1),
    "wide_axis0": (lambda: _heavy((40, 150), 25), 0),  # strided, more columns than a kernel chunk
    "transposed_axis-1": (lambda: _heavy((64, 12), 10).t(), -1),
    "transposed_axis0": (lambda: _heavy((12, 50), 11).t(), 0),  # contiguous once axis is last
    "permuted_3d_axis1": (lambda: _heavy((5, 37, 3), 24).permute(2, 1, 0), 1),
    "hadamard_axis0": (_hadamard_axis0, 0),
    "edge_wide": (_edge_wide, -1),
    "nonfinite": (_nonfinite, -1),
    "nonfinite_axis0": (lambda: _nonfinite().t().contiguous(), 0),
}

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


def _to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast keeping the strides (a transposed view stays a transposed view), clamped to range."""
    fmax = torch.finfo(dtype).max
    return torch.where(torch.isfinite(x), x.clamp(-fmax, fmax), x).to(dtype)


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
        x = _to(make(), dtype)
        if name.startswith(("transposed", "permuted")):
            assert not x.is_contiguous()
        try:
            ref = quantize_reference(x, spec, axis, KEY)
            _assert_same_qtensor(quantize(x, spec, axis, KEY), ref)
            fast = fake_quantize(x, spec, axis, KEY)
            assert fast.dtype == dtype and fast.shape == x.shape
            # fake_quantize_reference(x, ...) is by definition this (one reference call saved)
            _bits_equal(fast, ref.dequantize(dtype))
        except AssertionError as e:
            raise AssertionError(f"layout {name}: {e}") from e


@pytest.mark.parametrize(
    ("fmt", "mode", "rounding", "prescale", "dtype"), EQUIV_CASES, ids=map(_case_id, EQUIV_CASES)
)
def test_fused_torch_path_equals_reference_bit_for_bit(fmt, mode, rounding, prescale, dtype):
    # the GPU path, run eagerly here: same codes, scales, tensor scale and values as the reference
    spec = QuantSpec(format=fmt, scale_mode=mode, rounding=rounding, prescale=prescale)
    for name, (make, axis) in LAYOUTS.items():
        x = _to(make(), dtype)
        try:
            ref = quantize_reference(x, spec, axis, KEY)
            _assert_same_qtensor(quantize_fused(x, spec, axis, KEY, compile=False), ref)
            fused = fake_quantize_fused(x, spec, axis, KEY, compile=False)
            assert fused.dtype == dtype and fused.shape == x.shape
            _bits_equal(fused, ref.dequantize(dtype))
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
        x = _to(make(), dtype)
        out = {}
        for threads in (1, 3):
            torch.set_num_threads(threads)
            out[threads] = (quantize(x, spec, axis, KEY), fake_quantize(x, spec, axis, KEY))
        try:
            _assert_same_qtensor(out[1][0], out[3][0])
            _bits_equal(out[1][1], out[3][1])
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
        _bits_equal(fast, fake_quantize_reference(x, spec, axis, KEY, out_dtype=out_dtype))


@pytest.mark.parametrize("block", [2, 16, 64, 1024])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "nvfp4"])
def test_fast_path_equals_reference_for_block_size_overrides(fmt, block):
    spec = QuantSpec(format=fmt, block_size=block, rounding="sr")
    for make, axis in (LAYOUTS["ragged37_axis-1"], LAYOUTS["edges_ragged50_axis0"]):
        x = make()
        q = quantize(x, spec, axis, KEY)
        _assert_same_qtensor(q, quantize_reference(x, spec, axis, KEY))
        assert q.scales is not None and q.scales.shape[-1] == -(-x.shape[axis] // block)
        _bits_equal(fake_quantize(x, spec, axis, KEY), fake_quantize_reference(x, spec, axis, KEY))


@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8_e5m2"])
def test_result_does_not_depend_on_memory_layout(fmt, rounding):
    # the same logical tensor, contiguous or as a transposed view, quantized along either axis:
    # identical results (the SR stream is indexed in the axis-last logical order)
    spec = QuantSpec(format=fmt, rounding=rounding)
    x = _heavy((48, 40), 12)
    xt = x.t().contiguous().t()  # same values, column-major
    for axis in (0, 1):
        _assert_same_qtensor(quantize(x, spec, axis, KEY), quantize(xt, spec, axis, KEY))
        _bits_equal(fake_quantize(x, spec, axis, KEY), fake_quantize(xt, spec, axis, KEY))


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
    _bits_equal(fq, q.dequantize())


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
    x = _heavy((6, 64), 13)
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
    _bits_equal(fake_quantize(x, spec), fake_quantize_reference(x, spec))


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
        _assert_same_qtensor(QUANTIZERS[impl](x, spec, axis, KEY), ref)
        _bits_equal(FAKE_QUANTIZERS[impl](x, spec, axis, KEY), ref.dequantize())
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
    x = _heavy((24, 50), 14)
    spec = QuantSpec(format=fmt)
    q = QUANTIZERS[impl](x, spec, axis)
    fmax = torch.finfo(dtype).max
    scale = torch.tensor(fmax) / x.abs().max()  # float32 encode scale max / amax
    ref = (x * scale).to(dtype)  # torch's RNE cast
    assert q.scales is None and q.global_dec is not None
    assert float(q.global_dec) == float(torch.tensor(1.0) / scale)
    assert torch.equal(q.codes, ref.view(torch.uint8).movedim(axis, -1))
    expected = ref.float() * q.global_dec
    _bits_equal(q.dequantize(), expected)
    _bits_equal(FAKE_QUANTIZERS[impl](x, spec, axis), expected)


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_fp8_per_tensor_all_zero_tensor(impl):
    q = QUANTIZERS[impl](torch.zeros(4, 8), QuantSpec(format="fp8_e4m3"))
    assert q.codes.eq(0).all() and float(q.global_dec) == 1.0
    assert torch.equal(q.dequantize(), torch.zeros(4, 8))


# ----------------------------------------------------------------------------------------------
# stochastic rounding


def _decode_factor(q: QTensor) -> torch.Tensor:
    """Per-element decode scale (float64) in the codes' layout, unpadded (axis last)."""
    f, K = q.spec.fmt, q.shape[q.axis]
    if f.scale == "tensor":
        assert q.global_dec is not None
        return q.global_dec.double().expand(q.codes.shape)[..., :K]
    assert q.scales is not None
    if f.scale == "e8m0":
        d = decode_e8m0(q.scales).double()
    else:
        assert q.global_amax is not None
        d = nv_decode(q.scales, q.global_amax).double()  # (s * amax) / 2688 in float32
    return d.repeat_interleave(q.spec.block, -1)[..., :K]


def _spacing(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Grid spacing of the element format at element-unit values ``v`` (that of the binade of |v|)."""
    elem = FORMATS[fmt].elem
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0**-200)))
    return torch.exp2(e.clamp(min=elem.emin) - elem.mbits)


SR_FORMATS = ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2", "fp8_e4m3"]


@pytest.mark.parametrize("fmt", SR_FORMATS)
def test_sr_is_unbiased(fmt):
    # With n independent draws of a value between grid points lo < hi (spacing D = hi - lo), the mean
    # has std sqrt(p(1-p)/n) * D <= D / (2 sqrt(n)). Each element's mean over n = 1000 keys must be
    # within 5 such bounds of its expectation 0.75 * x (prescale: nothing saturates). Round to
    # nearest would be off by up to D / 2 = 7.9 bounds; the keys are fixed, so this is deterministic.
    n = 1000
    x = _heavy((4, 64), 15)
    spec = QuantSpec(format=fmt, rounding="sr", prescale=True)
    acc = torch.zeros_like(x, dtype=torch.float64)
    for step in range(n):
        acc += fake_quantize(x, spec, key=derive_key(1, 0, 1, 1, step)).double()
    mean = acc / n
    d = _decode_factor(quantize(x, spec))
    spacing = _spacing(0.75 * x.double() / d, fmt) * d  # in the units of x
    bound = 5 * spacing / (2 * math.sqrt(n)) + 1e-6 * x.double().abs()  # + fp32 dequant round-off
    err = (mean - 0.75 * x.double()).abs()
    assert bool((err <= bound).all()), f"worst: {float((err / bound).max()):.2f} bounds"
    # and not vacuously: most elements are not on the grid, so single draws do differ
    rne = fake_quantize(x, QuantSpec(format=fmt, prescale=True)).double()
    assert float(((rne - 0.75 * x.double()).abs() > bound).float().mean()) > 0.5


@pytest.mark.parametrize("fmt", SR_FORMATS)
def test_sr_picks_only_the_two_neighbouring_grid_points(fmt):
    x = _heavy((4, 64), 16)
    spec = QuantSpec(format=fmt, rounding="sr", prescale=True)
    rne = quantize(x, QuantSpec(format=fmt, prescale=True)).codes.long()
    sign_bit = 1 << (FORMATS[fmt].elem.bits - 1)
    draws = torch.stack([quantize(x, spec, key=derive_key(2, s)).codes.long() for s in range(200)])
    mag = draws & (sign_bit - 1)
    # magnitude codes are consecutive grid points: at most two values, adjacent, per element
    assert bool((mag.amax(0) - mag.amin(0) <= 1).all())
    # never more than one grid step from round-to-nearest-even, and the sign is x's
    assert bool(((mag - (rne & (sign_bit - 1))).abs() <= 1).all())
    nz = (mag != 0) & (x != 0)
    assert bool(((draws & sign_bit).ne(0) == (x < 0))[nz].all())
    if FORMATS[fmt].scale == "e8m0":
        # every draw is the grid point just below |v| or just above it (v: element units)
        v = (0.75 * x.double() / _decode_factor(quantize(x, spec))).abs()
        grid = FORMATS[fmt].elem.grid()  # index == magnitude code
        lo = torch.searchsorted(grid, v, right=True) - 1
        hi = torch.searchsorted(grid, v, right=False)
        assert bool(((mag == lo) | (mag == hi)).all())


MIDPOINTS = [
    # (format, anchor giving a 2^0 FLOOR block scale, midpoint, its lower neighbour)
    *[("mxfp4", 4.0, m, lo) for m, lo in [(0.25, 0), (0.75, 0.5), (1.25, 1), (2.5, 2), (5.0, 4)]],
    ("mxfp8_e4m3", 256.0, 1.0625, 1.0),  # E4M3 spacing 1/8 in [1, 2)
    ("mxfp8_e4m3", 256.0, 1.5 * 2.0**-9, 2.0**-9),  # between the two smallest subnormals
    ("mxfp8_e5m2", 2.0**15, 1.125, 1.0),  # E5M2 spacing 1/4 in [1, 2)
]


@pytest.mark.parametrize(("fmt", "anchor", "mid", "lo"), MIDPOINTS, ids=lambda a: repr(a))
def test_sr_rounds_midpoints_up_about_half_the_time(fmt, anchor, mid, lo):
    spec = QuantSpec(format=fmt, rounding="sr")
    x = torch.full((128, 32), mid)
    x[:, 0] = anchor
    x[1::2, 1:] *= -1  # negative midpoints too: "up" means away from zero
    # one key, 3968 midpoints: the fraction has std 0.008, so [0.4, 0.6] is a 12-sigma window
    q = fake_quantize(x, spec, key=KEY)[:, 1:].abs()
    assert bool(((q == lo) | (q > mid)).all())
    frac = float((q > mid).float().mean())
    assert 0.4 <= frac <= 0.6
    # one element, 400 keys: std 0.025, [0.4, 0.6] is a 4-sigma window (deterministic keys)
    ups = [float(fake_quantize(x[:1], spec, key=derive_key(3, s))[0, 1]) > mid for s in range(400)]
    assert 0.4 <= sum(ups) / len(ups) <= 0.6


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8_e5m2"])
def test_sr_is_reproducible_for_a_key_and_differs_across_keys(fmt):
    spec = QuantSpec(format=fmt, rounding="sr")
    x = _heavy((16, 64), 17)
    k0 = derive_key(1234, 5, GEMM_IDS["wgrad"], OPERAND_IDS["dy"], 0)
    k1 = derive_key(1234, 5, GEMM_IDS["wgrad"], OPERAND_IDS["dy"], 1)  # next step
    a, b = fake_quantize(x, spec, key=k0), fake_quantize(x, spec, key=k0)
    assert torch.equal(a, b)
    c = fake_quantize(x, spec, key=k1)
    assert float((a != c).float().mean()) > 0.1
    assert torch.equal(quantize(x, spec, key=k0).codes, quantize(x, spec, key=k0).codes)


@pytest.mark.parametrize("rounding", ["sr", "rne"])
@pytest.mark.parametrize(
    ("fmt", "elem", "anchor"),
    [("mxfp4", E2M1, 6.0), ("mxfp8_e4m3", E4M3, 448.0), ("mxfp8_e5m2", E5M2, 57344.0)],
)
def test_values_on_the_grid_are_returned_unchanged(fmt, elem, anchor, rounding):
    # every signed grid value of the element format (subnormals included), 31 per block next to
    # the format's max, which makes the FLOOR block scale 2^0: element units = input units
    grid = elem.grid().float()
    vals = torch.cat([grid, -grid])
    vals = torch.cat([vals, vals[: -vals.numel() % 31]]).view(-1, 31)
    x = torch.cat([torch.full((vals.shape[0], 1), anchor), vals], 1)
    spec = QuantSpec(format=fmt, rounding=rounding)
    for step in range(20 if rounding == "sr" else 1):
        for fq in (fake_quantize, fake_quantize_reference):
            _bits_equal(fq(x, spec, key=derive_key(4, step)), x)


# ----------------------------------------------------------------------------------------------
# prescale


def _clipping_tensor() -> torch.Tensor:
    # blocks whose maximum is 7.5 * 2^k: FLOOR takes E = k, and 7.5 > 6 would be clipped
    x = _heavy((6, 64), 18).clamp(-5.9, 5.9)
    for r in range(6):
        k = r - 3
        x[r] *= 2.0**k
        x[r, 3], x[r, 50] = 7.5 * 2.0**k, -7.5 * 2.0**k
    return x


@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_prescale_dequantizes_to_three_quarters_of_x_within_half_a_step(impl):
    x = _clipping_tensor()
    q = QUANTIZERS[impl](x, QuantSpec(format="mxfp4", prescale=True))
    d = _decode_factor(q)
    v = 0.75 * x.double() / d  # element units before rounding
    assert float(v.abs().max()) < 6.0  # nothing reaches the saturation point
    err = (q.dequantize().double() - 0.75 * x.double()).abs()
    assert bool((err <= _spacing(v, "mxfp4") * d / 2).all())
    # without the prescale FLOOR clips the 7.5 * 2^k maxima to 6 * 2^k: error 1.5 * 2^k > D/2 = 2^k
    plain = QUANTIZERS[impl](x, QuantSpec(format="mxfp4"))
    assert bool((plain.dequantize()[:, 3] == 6.0 * 2.0 ** torch.arange(-3.0, 3.0)).all())


def test_prescale_keeps_sr_unbiased_at_the_block_maximum():
    # 7.5 with a 2^0 scale: without prescale it saturates to 6 on every draw (biased by -1.5);
    # with it, 5.625 goes to 4 or 6 (p(6) = 0.8125) and the mean over 1000 keys is 5.625 within
    # 5 * D / (2 sqrt(n)) = 5 * 2 / 63.2 = 0.16.
    x = torch.zeros(1, 32)
    x[0, 0] = 7.5
    plain = QuantSpec(format="mxfp4", rounding="sr")
    pre = QuantSpec(format="mxfp4", rounding="sr", prescale=True)
    keys = [derive_key(5, s) for s in range(1000)]
    assert all(float(fake_quantize(x, plain, key=k)[0, 0]) == 6.0 for k in keys[:50])
    draws = torch.tensor([float(fake_quantize(x, pre, key=k)[0, 0]) for k in keys])
    assert set(draws.tolist()) == {4.0, 6.0}
    assert abs(float(draws.mean()) - 5.625) < 0.16


# ----------------------------------------------------------------------------------------------
# NaN / Inf, zeros, ragged K


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_nonfinite_value_makes_its_mx_block_nan_and_leaves_others(fmt, impl, axis, bad):
    clean = _heavy((64, 64), 19)
    x = clean.clone()
    x[37, 45] = bad  # block (row 37, cols 32..63) for axis -1; (col 45, rows 32..63) for axis 0
    spec = QuantSpec(format=fmt)
    q, q0 = QUANTIZERS[impl](x, spec, axis), QUANTIZERS[impl](clean, spec, axis)
    assert q.scales is not None and q0.scales is not None
    r, c = (37, 1) if axis == -1 else (45, 1)  # (row of the codes layout, block index)
    assert int(q.scales[r, c]) == E8M0_NAN
    other = torch.ones_like(q.scales, dtype=torch.bool)
    other[r, c] = False
    assert torch.equal(q.scales[other], q0.scales[other])
    deq, deq0 = q.dequantize(), q0.dequantize()
    nan = torch.zeros_like(x, dtype=torch.bool)
    if axis == -1:
        nan[37, 32:] = True
    else:
        nan[32:, 45] = True
    assert torch.isnan(deq)[nan].all() and not torch.isnan(deq)[~nan].any()
    assert torch.equal(deq[~nan], deq0[~nan])
    fq = FAKE_QUANTIZERS[impl](x, spec, axis)
    assert torch.equal(torch.isnan(fq), nan)


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8_e4m3", "fp8_e5m2"])
def test_nonfinite_value_makes_a_tensor_scaled_tensor_all_nan(fmt, impl, bad):
    x = _heavy((4, 64), 20)
    x[2, 9] = bad
    spec = QuantSpec(format=fmt)
    q = QUANTIZERS[impl](x, spec)
    assert torch.isnan(q.dequantize()).all()
    assert torch.isnan(FAKE_QUANTIZERS[impl](x, spec)).all()
    if fmt == "nvfp4":
        assert q.scales is not None and q.scales.eq(0x7F).all()  # E4M3 NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8_e4m3", "fp8_e5m2"])
def test_tensor_amax_in_the_kernel_is_the_reference_s_at_any_thread_count(fmt, dtype):
    # the kernel finds the tensor amax itself, split over the threads (tensors above its parallel
    # threshold of 32768 elements), in the input's own format: the maximum at the very end, in the
    # middle, a NaN or an inf in the second thread's half; along either axis
    torch.set_num_threads(1)
    base = _heavy((300, 160), 26).clamp(-6e4, 6e4)  # finite in float16
    cases = {"end": (-1, -1, 7e4 if dtype != torch.float16 else 6.5e4), "mid": (150, 80, -9e4)}
    cases |= {"nan": (200, 3, math.nan), "inf": (299, 0, -math.inf)}
    spec = QuantSpec(format=fmt)
    for name, (i, j, v) in cases.items():
        x = base.clone()
        x[i, j] = v
        x = x.to(dtype)
        for axis in (-1, 0):
            ref = quantize_reference(x, spec, axis)
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                try:
                    _assert_same_qtensor(quantize(x, spec, axis), ref)
                    _bits_equal(fake_quantize(x, spec, axis), ref.dequantize(dtype))
                except AssertionError as e:
                    raise AssertionError(f"{name}, axis {axis}, {threads} threads: {e}") from e
                finally:
                    torch.set_num_threads(1)


@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_all_zero_block_gets_the_smallest_scale_and_zero_elements(fmt, impl):
    x = _heavy((2, 64), 21)
    x[1, :32] = 0.0
    x[1, 5] = -0.0
    for mode in ScaleMode:
        q = QUANTIZERS[impl](x, QuantSpec(format=fmt, scale_mode=mode))
        assert q.scales is not None
        assert int(q.scales[1, 0]) == 0  # 2^-127
        assert float(decode_e8m0(q.scales[1, :1])) == 2.0**-127
        mag_mask = (1 << (FORMATS[fmt].elem.bits - 1)) - 1
        assert (q.codes[1, :32] & mag_mask).eq(0).all()  # +-0
        assert int(q.codes[1, 5]) == mag_mask + 1  # -0 keeps its sign bit
        assert q.dequantize()[1, :32].eq(0).all()
        assert int(q.scales[1, 1]) != 0 and int(q.scales[0, 0]) != 0


@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_ragged_k_is_zero_padded_to_whole_blocks(fmt, axis, impl):
    K, B = 37, FORMATS[fmt].block
    nb = -(-K // B)
    x = _heavy((K, 5), 22) if axis == 0 else _heavy((5, K), 22)
    x.select(axis, K - 1).mul_(0.01)  # the last block's few elements are small: padding must not
    x.select(axis, K - 2).mul_(0.01)  # change its amax (it would if it were not zeros)
    spec = QuantSpec(format=fmt)
    q = QUANTIZERS[impl](x, spec, axis)
    assert q.codes.shape == (5, nb * B)
    assert q.scales is not None and q.scales.shape == (5, nb)
    deq = q.dequantize()
    assert deq.shape == x.shape
    # identical to quantizing the explicitly zero-padded tensor
    pad = (0, nb * B - K) if axis == -1 else (0, 0, 0, nb * B - K)
    qp = QUANTIZERS[impl](torch.nn.functional.pad(x, pad), spec, axis)
    assert torch.equal(q.codes, qp.codes) and torch.equal(q.scales, qp.scales)
    assert torch.equal(deq, qp.dequantize().narrow(axis, 0, K))
    assert q.codes[:, K:].eq(0).all()
    _bits_equal(FAKE_QUANTIZERS[impl](x, spec, axis), deq)


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


# ----------------------------------------------------------------------------------------------
# SQNR sanity

# Measured on this 64 x 256 standard normal tensor (seed 23), RNE: mxfp4 18.79 dB, nvfp4 20.4,
# mxfp8_e4m3 30.66, mxfp8_e5m2 25.4, fp8_e4m3 31.5, fp8_e5m2 25.6 (and ~18.8 / ~30.6 for mxfp4 /
# mxfp8_e4m3 over other seeds). Bounds are set about 0.5 dB below.
SQNR_BOUNDS = {
    "mxfp4": 18.3,
    "nvfp4": 19.9,
    "mxfp8_e4m3": 30.1,
    "mxfp8_e5m2": 24.9,
    "fp8_e4m3": 31.0,
    "fp8_e5m2": 25.1,
}


@pytest.mark.parametrize("fmt", list(SQNR_BOUNDS))
def test_sqnr_on_gaussian_data_is_above_bound(fmt):
    x = torch.randn(64, 256, generator=_gen(23))
    y = fake_quantize(x, QuantSpec(format=fmt))
    sqnr = 10 * math.log10(float(x.pow(2).sum() / (x - y).pow(2).sum()))
    assert sqnr > SQNR_BOUNDS[fmt]
    assert sqnr < SQNR_BOUNDS[fmt] + 2.0  # and not suspiciously exact (e.g. no quantization)


# ----------------------------------------------------------------------------------------------
# Hadamard fused into the quantizer


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3", "fp8_e4m3"])
@pytest.mark.parametrize("size", [16, 32, 64, 256])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_fused_hadamard_equals_transform_then_quantize(fmt, size, rounding, dtype, nan):
    from backends.quant import hadamard_transform, sign_vector

    g = torch.Generator().manual_seed(size)
    x = (torch.randn(24, 512, generator=g) * torch.rand(24, 1, generator=g) * 10).to(dtype)
    if nan:  # spreads over its Hadamard group, then its blocks (the whole tensor for NVFP4, FP8)
        x[3, 5] = float("nan")
    spec = QuantSpec(format=fmt, rounding=rounding, prescale=rounding == "sr")
    for signs in (None, sign_vector(size, 11)):
        h = (size, signs)
        # fused in C: axis 1 of x, and axis 0 of the view x.t() (contiguous along that axis), MX
        # formats only; not fused: axis 0 of x (length 24: not a multiple of the Hadamard size)
        for axis, t in ((1, x), (0, x.t()), (0, x)):
            xh = hadamard_transform(t, axis, size, signs)
            ref = quantize_reference(xh, spec, axis, KEY)
            _bits_equal(
                fake_quantize(t, spec, axis, KEY, torch.float32, hadamard=h), ref.dequantize()
            )
            _bits_equal(fake_quantize(xh, spec, axis, KEY), ref.dequantize())
            fused = fake_quantize_fused(t, spec, axis, KEY, hadamard=h, compile=False)
            _bits_equal(fused, ref.dequantize())
            _assert_same_qtensor(quantize(t, spec, axis, KEY, hadamard=h), ref)
            _assert_same_qtensor(quantize_fused(t, spec, axis, KEY, h, compile=False), ref)


# ----------------------------------------------------------------------------------------------
# the fused path compiled (Inductor: C++ on the CPU, Triton on CUDA)

_COMPILE_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.slow
@pytest.mark.gpu  # on CUDA when there is one (Triton)
@pytest.mark.parametrize(
    ("spec", "dtype", "hadamard", "values"),
    [
        (QuantSpec(format="mxfp4"), torch.bfloat16, 32, True),  # the emulated training path, H32
        (QuantSpec(format="nvfp4", rounding="sr", prescale=True), torch.float32, 0, True),
        (QuantSpec(format="fp8_e5m2"), torch.bfloat16, 0, False),  # codes, as native packs them
        (QuantSpec(format="nvfp4", block_rows=16), torch.float32, 0, False),  # 16x16 tiles
    ],
    ids=["mxfp4-h32-values", "nvfp4-sr-values", "fp8_e5m2-codes", "nvfp4-16x16-codes"],
)
def test_compiled_fused_path_equals_reference_bit_for_bit(spec, dtype, hadamard, values):
    from backends.quant import sign_vector

    h = (hadamard, sign_vector(hadamard, 3, device=_COMPILE_DEVICE)) if hadamard else None
    for name in ("rows_and_edges_axis-1", "edge_wide", "transposed_axis-1"):
        make, axis = LAYOUTS[name]
        x = _to(make(), dtype).to(_COMPILE_DEVICE)
        xh = x if h is None else hadamard_transform(x, axis, *h)
        ref = quantize_reference(xh.cpu(), spec, axis, KEY)
        try:
            if values:
                got = fake_quantize_fused(x, spec, axis, KEY, dtype, h, compile=True)
                _bits_equal(got.cpu(), ref.dequantize(dtype))
            else:
                q = quantize_fused(x, spec, axis, KEY, h, compile=True)
                assert q.global_dec is not None
                q.codes, q.global_dec = q.codes.cpu(), q.global_dec.cpu()
                q.global_amax = None if q.global_amax is None else q.global_amax.cpu()
                q.scales = None if q.scales is None else q.scales.cpu()
                _assert_same_qtensor(q, ref)
        except AssertionError as e:
            raise AssertionError(f"layout {name}: {e}") from e


def test_a_quantizer_that_fails_to_compile_runs_eagerly_with_one_warning(monkeypatch):
    from backends.quant import torch_path as fused

    def no_compiler(plan):
        raise RuntimeError("no Triton here")

    monkeypatch.setattr(fused, "compiled", no_compiler)
    monkeypatch.setattr(fused, "_failed", {})
    x = _heavy((4, 64), 1)
    spec = QuantSpec(format="mxfp4", rounding="sr")
    with pytest.warns(RuntimeWarning, match="torch.compile of the quantizer failed .RuntimeError"):
        got = fake_quantize_fused(x, spec, -1, KEY, compile=True)
    _bits_equal(got, fake_quantize_reference(x, spec, -1, KEY))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per plan
        fake_quantize_fused(x, spec, -1, KEY, compile=True)


def test_without_a_c_compiler_the_fused_torch_path_runs_with_one_warning(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import warnings, torch\n"
        "from backends.quant import QuantSpec, fake_quantize\n"
        "from backends.quant.reference import fake_quantize_reference\n"
        "x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))\n"
        "s = QuantSpec(format='nvfp4', rounding='sr')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    a = fake_quantize(x, s, key=5)\n"
        "    b = fake_quantize(x, s, key=5)\n"
        "print(len(w), str(w[0].message))\n"
        "assert torch.equal(a, fake_quantize_reference(x, s, key=5)) and torch.equal(a, b)\n"
    )
    env = {**os.environ, "CC": str(tmp_path / "no-cc"), "ABLATE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("ABLATE_NO_KERNEL", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("1 ablate: the fused CPU quantizer is unavailable ("), res.stdout
    assert "using the pure-torch quantizer (identical numerics, slower)" in res.stdout


@pytest.mark.parametrize("entry", [quantize_fused, fake_quantize_fused, quantize, fake_quantize])
def test_an_unsupported_hadamard_size_is_refused_naming_the_allowed_ones(entry):
    with pytest.raises(ValueError, match="hadamard size 24 is not supported; allowed: 16, 32"):
        entry(torch.randn(4, 48), QuantSpec(format="mxfp4"), -1, 0, hadamard=(24, None))
