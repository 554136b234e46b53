"""NVFP4 equals TransformerEngine's NVFP4 quantizer bit for bit: codes, E4M3 block scales, the tensor
scales and the dequantized values, on every path (C kernel, reference, fused torch eager and
compiled, fake-quantize), for 1x16 blocks and 16x16 weight tiles.

``_te_nvfp4`` below is an independent NumPy float32 transcription of the arithmetic of TE's reference
quantizer (``NVFP4QuantizerRef._quantize_blockwise_reference`` in
``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``), of its CUDA kernel's tensor
scale (``compute_global_encode_scaling_factor_FP4`` in ``common/cast/nvfp4/core_nvfp4.cuh``: 1 for
an all-zero tensor) and of its dequantizer (``common/cast/nvfp4/dequantize_nvfp4.cuh``). It uses
neither torch nor ``backends``: E4M3 rounding by a search of the E4M3 values built from their bit
definition, E2M1 rounding by TE's threshold table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.gemm.native import NV_ALPHA, dequantize_packed, pack_operand
from backends.quant import (
    QTensor,
    QuantSpec,
    fake_quantize,
    fake_quantize_fused,
    fake_quantize_reference,
    quantize,
    quantize_fused,
    quantize_reference,
)

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------------------------------------
# TE's arithmetic, transcribed in NumPy float32


def _e4m3_values() -> np.ndarray:
    """The non-negative finite E4M3 values, index == code (0x00 .. 0x7E), from the bit layout."""
    vals = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        vals.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


_E4M3 = _e4m3_values()


def _e4m3_rne(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32 values, uint8 codes) of non-negative float32 ``s`` <= 448 rounded to E4M3, ties to
    the even code."""
    a = s.astype(np.float64)
    lo = np.clip(np.searchsorted(_E4M3, a, side="right") - 1, 0, 0x7E)
    hi = np.minimum(lo + 1, 0x7E)
    d_lo, d_hi = a - _E4M3[lo], _E4M3[hi] - a
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    return _E4M3[code].astype(np.float32), code.astype(np.uint8)


def _e2m1_te(v: np.ndarray) -> np.ndarray:
    """TE's ``cast_to_fp4x2`` table on float32 ``v`` clipped to [-6, 6]: magnitude code by its
    thresholds (ties to the even code), sign bit 8 for v < 0 (an exact -0 gets code 0)."""
    m = np.abs(v)
    edges = [(0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False)]
    edges += [(5.0, True)]
    code = np.full(v.shape, 7, dtype=np.uint8)
    for c, (t, inclusive) in reversed(list(enumerate(edges))):
        code = np.where((m <= t) if inclusive else (m < t), c, code).astype(np.uint8)
    return code | np.where(v < 0, 8, 0).astype(np.uint8)


def _te_nvfp4(x: np.ndarray, tile_rows: int = 1) -> dict[str, np.ndarray]:
    """TE's NVFP4 quantization of float32 (m, n) ``x`` (n a multiple of 16, m of ``tile_rows``)."""
    x = np.asarray(x, dtype=np.float32)
    m, n = x.shape
    amax = F32(np.abs(x).max())
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.minimum(F32(448.0) * F32(6.0) / amax, FLT_MAX)  # 2688 / amax
    if amax == 0 or s_enc == 0:  # the kernel's rule for a zero (or infinite) amax
        s_enc = F32(1.0)
    s_dec = F32(1.0) / s_enc
    mult = s_enc * (F32(1.0) / F32(6.0))  # S_enc * fp32(1/6), folded first
    xb = x.reshape(m, n // 16, 16)
    vec_max = np.abs(xb).max(-1)
    if tile_rows > 1:
        tiles = vec_max.reshape(m // tile_rows, tile_rows, n // 16).max(1)
        vec_max = np.repeat(tiles, tile_rows, axis=0)
    with np.errstate(over="ignore"):
        s = np.minimum(vec_max * mult, FLT_MAX)
    s8, s_codes = _e4m3_rne(np.clip(s, -448.0, 448.0).astype(np.float32))
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum(F32(1.0) / (s8 * s_dec), FLT_MAX)  # FLT_MAX where s8 == 0
        v = xb * enc[..., None]
    v = np.clip(v, -6.0, 6.0).astype(np.float32)
    codes = _e2m1_te(v)
    q = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)[codes & 7]
    q = np.where(codes & 8, -q, q).astype(np.float32)
    dec = (s8 * amax) * (F32(1.0) / F32(2688.0))  # TE's dequantize_nvfp4: (s * amax) * (1/2688)
    return {
        "codes": codes.reshape(m, n),
        "neg_zero": (np.signbit(v) & (v == 0)).reshape(m, n),
        "scales": s_codes,
        "s_dec": np.array(s_dec, dtype=np.float32),
        "amax": np.array(amax, dtype=np.float32),
        "values": (q * dec[..., None]).reshape(m, n).astype(np.float32),
    }


# ----------------------------------------------------------------------------------------------
# comparisons

QUANTIZERS = {
    "fast": quantize,
    "reference": quantize_reference,
    "fused": lambda x, spec: quantize_fused(x, spec, compile=False),
}
FAKE_QUANTIZERS = {  # float32 out, whatever the input
    "fast": lambda x, spec: fake_quantize(x, spec, out_dtype=torch.float32),
    "reference": lambda x, spec: fake_quantize_reference(x, spec, out_dtype=torch.float32),
    "fused": lambda x, spec: fake_quantize_fused(x, spec, out_dtype=torch.float32, compile=False),
}


def _bits(t: torch.Tensor | np.ndarray) -> np.ndarray:
    a = t.detach().float().cpu().numpy() if isinstance(t, torch.Tensor) else t
    return np.asarray(a, dtype=np.float32).view(np.int32)


def _assert_te(q: QTensor, te: dict[str, np.ndarray]) -> None:
    assert q.scales is not None and q.global_dec is not None and q.global_amax is not None
    # ours keeps the sign of an exact -0 product (as the hardware conversion does); TE's Python
    # table gives it code 0
    want = te["codes"] | np.where(te["neg_zero"], 8, 0).astype(np.uint8)
    np.testing.assert_array_equal(q.codes.cpu().numpy(), want)
    np.testing.assert_array_equal(q.scales.cpu().numpy(), te["scales"])
    assert _bits(q.global_dec.reshape(1)) == _bits(te["s_dec"].reshape(1))
    assert _bits(q.global_amax.reshape(1)) == _bits(te["amax"].reshape(1))
    np.testing.assert_array_equal(_bits(q.dequantize()), _bits(te["values"]))


def _check_all_paths(x: torch.Tensor, spec: QuantSpec) -> None:
    te = _te_nvfp4(x.float().numpy(), spec.block_rows)
    for name, qz in QUANTIZERS.items():
        try:
            _assert_te(qz(x, spec), te)
            if spec.block_rows == 1:
                fq = FAKE_QUANTIZERS[name](x, spec)
                np.testing.assert_array_equal(_bits(fq.float()), _bits(te["values"]))
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
    fq = fake_quantize(x, spec, out_dtype=torch.float32)  # 2-D tiles: the fused path
    np.testing.assert_array_equal(_bits(fq), _bits(te["values"]))


def _wide_range(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Normal values times log-normal magnitudes over ~20 binades: many distinct block scales,
    blocks whose E4M3 scale is subnormal or rounds to 0, and E2M1 ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randn(shape, generator=g) * 5)
    x[0, :16] = 0.0  # an all-zero block
    x[1, 16:32] = torch.tensor([0.5, 1.5, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25] * 2)  # ties
    return x


# ----------------------------------------------------------------------------------------------
# hand-worked cases


def _hand_tensor(dtype: torch.dtype) -> torch.Tensor:
    x = torch.zeros(1, 64)
    # tensor amax 3: S_enc = 2688 / 3 = 896 (exact), S_dec = fp32(1/896) = 0.00111607147...,
    # multiplier S_enc * fp32(1/6) = 149.33334350585938 (fp32(1/6) = 0.16666667163...).
    # block 0 (saturating): s = 3 * 149.33334 = 448.00003 -> clamped to 448, code 0x7E;
    #   e = 1 / (448 * S_dec) = 2.0: 3 -> 6 (0111), -1.5 -> -3 (1101), 0.75 -> 1.5 (0011);
    #   decode (448 * 3) * fp32(1/2688) = 0.5: values 3, -1.5, 0.75.
    x[0, 0:3] = torch.tensor([3.0, -1.5, 0.75])
    # block 1: s = 9/64 * 149.33334 = 21.000002 -> E4M3 22 = 1.011b * 2^4, code 0_1011_011 = 0x5B.
    #   (The order (amax / 6) * S_enc would give exactly 21, a tie, rounded to the even 20: 0x5A.)
    #   e = 1 / (22 * S_dec) = 40.727272: 9/64 -> 5.73 -> 6 (0111); 9/128 -> 2.86 -> 3 (0101);
    #   5/128 -> 1.59 -> 1.5 (0011); -5/128 -> -1.5 (1011). (With e = 896 / 20 = 44.8, 5/128
    #   would give 1.75, a tie, -> 2.) Decode (22 * 3) * fp32(1/2688) = 0.024553573.
    x[0, 16:20] = torch.tensor([9 / 64, 9 / 128, 5 / 128, -5 / 128])
    # block 2: all zero: s = 0, code 0; e = min(1 / 0, FLT_MAX) = FLT_MAX; elements 0.
    # block 3: amax 5e-6: s = 5e-6 * 149.33334 = 0.00074667 < 2^-10 (half the smallest E4M3
    #   subnormal) -> 0, code 0; e = FLT_MAX, so 5e-6 -> 6 (0111) and -2e-6 -> -6 (1111), as in
    #   TE; both decode to 0 (the scale is 0): values 0 and -0.
    x[0, 48:50] = torch.tensor([5e-6, -2e-6])
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_hand_worked_scales_codes_and_values(impl, dtype):
    x = _hand_tensor(dtype)
    q = QUANTIZERS[impl](x, QuantSpec(format="nvfp4"))
    assert q.scales is not None and q.global_dec is not None and q.global_amax is not None
    assert q.scales.tolist() == [[0x7E, 0x5B, 0x00, 0x00]]
    assert float(q.global_amax) == 3.0
    assert float(q.global_dec) == 0.0011160714784637094  # fp32(1 / 896)
    codes = q.codes.view(4, 16)
    assert codes[0, :3].tolist() == [0b0111, 0b1101, 0b0011]
    assert codes[1, :4].tolist() == [0b0111, 0b0101, 0b0011, 0b1011]
    assert codes[3, :2].tolist() == [0b0111, 0b1111]
    assert codes[0, 3:].eq(0).all() and codes[1, 4:].eq(0).all() and codes[2].eq(0).all()
    assert codes[3, 2:].eq(0).all()
    deq = q.dequantize().view(4, 16)
    assert deq[0, :3].tolist() == [3.0, -1.5, 0.75]
    d = [0.1473214328289032, 0.0736607164144516, 0.0368303582072258, -0.0368303582072258]
    assert deq[1, :4].tolist() == d
    assert deq[3, :2].tolist() == [0.0, -0.0] and torch.signbit(deq[3, 1])
    fq = FAKE_QUANTIZERS[impl](x, QuantSpec(format="nvfp4"))
    assert torch.equal(fq, q.dequantize())
    _check_all_paths(x, QuantSpec(format="nvfp4"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", list(QUANTIZERS))
def test_all_zero_tensor_has_unit_tensor_scale(impl, dtype):
    # amax 0: TE's kernel sets S_enc = 1 (its Python reference keeps FLT_MAX = min(2688 / 0, max),
    # with the same codes and scales); every block scale 0, every element 0, values 0
    x = torch.zeros(4, 32, dtype=dtype)
    q = QUANTIZERS[impl](x, QuantSpec(format="nvfp4"))
    assert q.scales is not None and q.global_dec is not None and q.global_amax is not None
    assert float(q.global_dec) == 1.0 and float(q.global_amax) == 0.0
    assert q.scales.eq(0).all() and q.codes.eq(0).all()
    assert torch.equal(q.dequantize(), torch.zeros(4, 32))
    assert torch.equal(FAKE_QUANTIZERS[impl](x, QuantSpec(format="nvfp4")), q.dequantize())
    _check_all_paths(x, QuantSpec(format="nvfp4"))


# ----------------------------------------------------------------------------------------------
# against the transcription


@pytest.mark.parametrize(
    ("shape", "seed", "dtype"),
    [((32, 128), 1, torch.float32), ((48, 64), 2, torch.bfloat16), ((16, 256), 3, torch.float16)],
)
def test_1x16_blocks_equal_te_bit_for_bit(shape, seed, dtype):
    x = _wide_range(shape, seed).clamp(-6e4, 6e4)  # finite in float16
    _check_all_paths(x.to(dtype), QuantSpec(format="nvfp4"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_16x16_tiles_equal_te_bit_for_bit(dtype):
    _check_all_paths(_wide_range((48, 96), 4).to(dtype), QuantSpec(format="nvfp4", block_rows=16))


def test_tiny_tensor_amax_equals_te():
    # S_enc = 2688 / 1e-35 is near the float32 maximum and S_dec subnormal: 1 / (s * S_dec)
    # overflows and saturates to FLT_MAX
    x = torch.zeros(2, 32)
    x[0, 0] = 1e-35
    x[0, 16:19] = torch.tensor([1e-38, 5e-39, 1e-39])
    x[1, :4] = torch.tensor([3e-36, -7e-37, 2e-40, -1e-44])
    _check_all_paths(x, QuantSpec(format="nvfp4"))


def test_native_packing_decodes_as_te_and_alpha_is_te_s():
    x = _wide_range((32, 64), 5)
    te = _te_nvfp4(x.numpy())
    p = pack_operand(x, QuantSpec(format="nvfp4"))
    assert p.global_scale is not None and float(p.global_scale) == float(te["amax"])
    np.testing.assert_array_equal(_bits(dequantize_packed(p)[:32, :64]), _bits(te["values"]))
    # the GEMM alpha (amax_a * amax_b) * fp32(1 / (6 * 6 * 448 * 448)), TE's per-tensor scale
    assert float(F32(1.0) / F32(6.0 * 6.0 * 448.0 * 448.0)) == NV_ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 16])
def test_compiled_fused_path_equals_te(rows):
    x = _wide_range((32, 64), 6)
    spec = QuantSpec(format="nvfp4", block_rows=rows)
    te = _te_nvfp4(x.numpy(), rows)
    _assert_te(quantize_fused(x, spec, compile=True), te)
    got = fake_quantize_fused(x, spec, compile=True)
    np.testing.assert_array_equal(_bits(got), _bits(te["values"]))
