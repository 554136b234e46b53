"""Block quantization's rules (``backends.quant.quantizer``): stochastic rounding is unbiased and
reproducible, the clip-free prescale, non-finite and all-zero blocks, ragged reduction dimensions,
argument checks, SQNR bounds, the fused Hadamard, the compiled path. The implementations' agreement
is in ``test_quant.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from quant_cases import (
    FAKE_QUANTIZERS,
    KEY,
    LAYOUTS,
    MX_FORMATS,
    QUANTIZERS,
    bits_equal,
    gen,
    heavy,
    one_thread,
    same_qtensor,
    spacing,
    to_dtype,
)

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
from backends.quant.formats import E8M0_NAN
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key

__all__ = ["one_thread"]  # the autouse fixture, from the shared module

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


SR_FORMATS = ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp8_e5m2", "fp8_e4m3"]


@pytest.mark.parametrize("fmt", SR_FORMATS)
def test_sr_is_unbiased(fmt):
    # With n independent draws of a value between grid points lo < hi (spacing D = hi - lo), the mean
    # has std sqrt(p(1-p)/n) * D <= D / (2 sqrt(n)). Each element's mean over n = 1000 keys must be
    # within 5 such bounds of its expectation 0.75 * x (prescale: nothing saturates). Round to
    # nearest would be off by up to D / 2 = 7.9 bounds; the keys are fixed, so this is deterministic.
    n = 1000
    x = heavy((4, 64), 15)
    spec = QuantSpec(format=fmt, rounding="sr", prescale=True)
    acc = torch.zeros_like(x, dtype=torch.float64)
    for step in range(n):
        acc += fake_quantize(x, spec, key=derive_key(1, 0, 1, 1, step)).double()
    mean = acc / n
    d = _decode_factor(quantize(x, spec))
    step = spacing(0.75 * x.double() / d, fmt) * d  # in the units of x
    bound = 5 * step / (2 * math.sqrt(n)) + 1e-6 * x.double().abs()  # + fp32 dequant round-off
    err = (mean - 0.75 * x.double()).abs()
    assert bool((err <= bound).all()), f"worst: {float((err / bound).max()):.2f} bounds"
    # and not vacuously: most elements are not on the grid, so single draws do differ
    rne = fake_quantize(x, QuantSpec(format=fmt, prescale=True)).double()
    assert float(((rne - 0.75 * x.double()).abs() > bound).float().mean()) > 0.5


@pytest.mark.parametrize("fmt", SR_FORMATS)
def test_sr_picks_only_the_two_neighbouring_grid_points(fmt):
    x = heavy((4, 64), 16)
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
    x = heavy((16, 64), 17)
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
            bits_equal(fq(x, spec, key=derive_key(4, step)), x)


# ----------------------------------------------------------------------------------------------
# prescale


def _clipping_tensor() -> torch.Tensor:
    # blocks whose maximum is 7.5 * 2^k: FLOOR takes E = k, and 7.5 > 6 would be clipped
    x = heavy((6, 64), 18).clamp(-5.9, 5.9)
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
    assert bool((err <= spacing(v, "mxfp4") * d / 2).all())
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
    clean = heavy((64, 64), 19)
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
    x = heavy((4, 64), 20)
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
    base = heavy((300, 160), 26).clamp(-6e4, 6e4)  # finite in float16
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
                    same_qtensor(quantize(x, spec, axis), ref)
                    bits_equal(fake_quantize(x, spec, axis), ref.dequantize(dtype))
                except AssertionError as e:
                    raise AssertionError(f"{name}, axis {axis}, {threads} threads: {e}") from e
                finally:
                    torch.set_num_threads(1)


@pytest.mark.parametrize("impl", list(QUANTIZERS))
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_all_zero_block_gets_the_smallest_scale_and_zero_elements(fmt, impl):
    x = heavy((2, 64), 21)
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
    x = heavy((K, 5), 22) if axis == 0 else heavy((5, K), 22)
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
    bits_equal(FAKE_QUANTIZERS[impl](x, spec, axis), deq)


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
    x = torch.randn(64, 256, generator=gen(23))
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
            bits_equal(
                fake_quantize(t, spec, axis, KEY, torch.float32, hadamard=h), ref.dequantize()
            )
            bits_equal(fake_quantize(xh, spec, axis, KEY), ref.dequantize())
            fused = fake_quantize_fused(t, spec, axis, KEY, hadamard=h, compile=False)
            bits_equal(fused, ref.dequantize())
            same_qtensor(quantize(t, spec, axis, KEY, hadamard=h), ref)
            same_qtensor(quantize_fused(t, spec, axis, KEY, h, compile=False), ref)


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
        x = to_dtype(make(), dtype).to(_COMPILE_DEVICE)
        xh = x if h is None else hadamard_transform(x, axis, *h)
        ref = quantize_reference(xh.cpu(), spec, axis, KEY)
        try:
            if values:
                got = fake_quantize_fused(x, spec, axis, KEY, dtype, h, compile=True)
                bits_equal(got.cpu(), ref.dequantize(dtype))
            else:
                q = quantize_fused(x, spec, axis, KEY, h, compile=True)
                assert q.global_dec is not None
                q.codes, q.global_dec = q.codes.cpu(), q.global_dec.cpu()
                q.global_amax = None if q.global_amax is None else q.global_amax.cpu()
                q.scales = None if q.scales is None else q.scales.cpu()
                same_qtensor(q, ref)
        except AssertionError as e:
            raise AssertionError(f"layout {name}: {e}") from e


def test_a_quantizer_that_fails_to_compile_runs_eagerly_with_one_warning(monkeypatch):
    from backends.quant import torch_path as fused

    def no_compiler(plan):
        raise RuntimeError("no Triton here")

    monkeypatch.setattr(fused, "compiled", no_compiler)
    monkeypatch.setattr(fused, "_failed", {})
    x = heavy((4, 64), 1)
    spec = QuantSpec(format="mxfp4", rounding="sr")
    with pytest.warns(RuntimeWarning, match="torch.compile of the quantizer failed .RuntimeError"):
        got = fake_quantize_fused(x, spec, -1, KEY, compile=True)
    bits_equal(got, fake_quantize_reference(x, spec, -1, KEY))
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


def test_an_empty_cache_dir_keeps_the_kernel_in_the_default_not_here(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler: no kernel is built")
    code = (
        "import torch\n"
        "from backends.quant import QuantSpec, fake_quantize\n"
        "fake_quantize(torch.ones(4, 64), QuantSpec(format='mxfp4'))\n"
    )
    (tmp_path / "work").mkdir()
    env = {**os.environ, "ABLATE_CACHE_DIR": "", "HOME": str(tmp_path / "home")}
    env.pop("ABLATE_NO_KERNEL", None)
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "work", env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert list((tmp_path / "home" / ".cache" / "ablate" / "kernels").glob("*/quant.so"))
    assert not list((tmp_path / "work").iterdir())  # nothing written in the current folder


@pytest.mark.parametrize("value, kernel", [("0", True), ("false", True), ("1", False), ("", True)])
def test_no_kernel_is_an_on_off_switch_and_0_keeps_the_kernel(tmp_path, value, kernel):
    import os
    import shutil
    import subprocess
    import sys

    if kernel and not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler: no kernel is built")
    code = "from backends.quant import ckernel\nprint(ckernel.available())\n"
    env = {**os.environ, "ABLATE_NO_KERNEL": value, "ABLATE_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (res.returncode, res.stdout) == (0, f"{kernel}\n"), res.stderr


def test_a_compile_backend_torch_lacks_is_refused_not_run_eagerly(monkeypatch):
    from backends.quant import torch_path as fused

    monkeypatch.setattr(fused, "_failed", {})
    x = heavy((4, 64), 1)
    spec = QuantSpec(format="mxfp4", rounding="sr")
    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", "indutor")
    said = "environment variable ABLATE_COMPILE_BACKEND: unknown 'indutor'; allowed: a torch"
    with pytest.raises(ValueError, match=said):
        fake_quantize_fused(x, spec, -1, KEY, compile=True)
    assert not fused._failed  # not taken for a compile that failed
    for value, backend in [
        ("", "inductor"),
        ("aot_eager", "aot_eager"),
        ("cudagraphs", "cudagraphs"),
    ]:
        monkeypatch.setenv("ABLATE_COMPILE_BACKEND", value)  # empty: unset
        assert fused.compile_backend() == backend


@pytest.mark.parametrize("entry", [quantize_fused, fake_quantize_fused, quantize, fake_quantize])
def test_an_unsupported_hadamard_size_is_refused_naming_the_allowed_ones(entry):
    with pytest.raises(ValueError, match="hadamard size 24 is not supported; allowed: 16, 32"):
        entry(torch.randn(4, 48), QuantSpec(format="mxfp4"), -1, 0, hadamard=(24, None))
