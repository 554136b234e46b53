"""MS-EDEN: Quartet II's unbiased NVFP4 rounding for the backward GEMMs (``rounding: eden``).

Panferov, Schultheis, Tabesh, Alistarh, "Quartet II: Accurate LLM Pre-Training in NVFP4 by Improved
Unbiased Gradient Estimation" (arXiv 2601.22813), as its training code computes it
(IST-DASLab/Quartet-II, ``src/models/quantization/schemes/quartet_2.py``: ``eden_1x16s_fp4_kernel``
and ``Quartet_II_fn.backward``). Stochastic rounding is unbiased element by element but noisy;
EDEN (Vargaftik et al., 2022) instead rounds to nearest after a random rotation and rescales each
rotation group so the estimate's projection on the input is exact, which makes it unbiased over the
rotation. MS-EDEN ("multi-scale") applies that correction to NVFP4's per-16 E4M3 scales: the
correction lands in the scales, and rounding the corrected scale stochastically into E4M3 keeps it
unbiased. Every step one IEEE float32 operation, on the operand after the GEMM's Hadamard transform
(the rotation group G is its size; Quartet II: 128, signs redrawn every backward pass):

- tensor scale ``s_dec = (amax / 255.99) / v`` (1 for an all-zero tensor), with
  ``v = 6 / ((17/16) * 0.93)`` (fp32 constants): the E4M3 bound 255.99 leaves the corrected scales
  room to grow, and ``v`` is Quartet II's ``val_max`` for its backward ``scale_override``;
- block scale ``s = E4M3_RNE((amax_b / v) / s_dec)``, 1 where that rounds to 0;
- elements ``q = RTN(x / (s * s_dec))`` on the E2M1 grid, ties away from zero (Quartet II's
  threshold table: 0.25 -> 0.5, 2.5 -> 3, 5 -> 6; not round-half-to-even), the sign of zero the
  input's;
- per rotation group of G elements (G / 16 blocks), with ``xs = x / (s * s_dec)``: the correction
  ``c = sum(xs * xs) / sum(xs * q)`` (1 where the denominator is 0), the sums a pairwise tree
  (``tl.sum``'s order is the compiler's; this one is fixed);
- each block's corrected scale ``t = s * c`` rounded stochastically into E4M3: between the E4M3
  values ``down <= t < up`` next to ``E4M3_RNE(t)`` (the codes one below or one above it), ``up``
  with probability ``(t - down) / (up - down)``, from one uniform per block of the operand's stream
  (``rng.uniform24(key, block index)``; Quartet II draws ``tl.rand``);
- values ``q * (s' * s_dec)`` for the rounded scale ``s'`` (Quartet II's kernel computes
  ``(q * s') * s_dec``: the same up to the last bit; a native GEMM multiplies codes and scales
  exactly and applies ``s_dec_a * s_dec_b`` to the sum).

Not in Quartet II's kernel: a non-finite value makes the whole tensor NaN (as every tensor-scaled
format here). Quartet II quantizes the forward pass's quantized X and W again in the backward pass;
a recipe here quantizes the high-precision tensors (``backends.recipes.named.quartet_ii`` says so).
"""

from __future__ import annotations

import torch

from backends.quant.arith import E4M3_ELEM, Plan, div, encode, exp2i, round_to_grid
from backends.quant.hadamard import hadamard_transform_reference
from backends.quant.rng import uniform24

SCALE_OVERRIDE = (17 / 16) * 0.93
"""Quartet II's backward ``scale_override`` (``Quartet_II_fn.backward_scale_override``)."""
VAL_MAX = float(torch.tensor(6.0 / SCALE_OVERRIDE, dtype=torch.float32))
"""fp32(6 / SCALE_OVERRIDE): the scaled value a block maximum maps to (``val_max``)."""
SCALES_MAX = float(torch.tensor(255.99, dtype=torch.float32))
"""fp32(255.99): the tensor scale maps the tensor amax to this E4M3 block scale (not 448: the
corrected scales need room above)."""
BLOCK = 16


def _rtn(v: torch.Tensor) -> torch.Tensor:
    """E2M1 round to nearest, ties away from zero, saturating at 6 (Quartet II's ``rtn_fp4``)."""
    a = v.abs()
    m = torch.zeros_like(a)
    for edge, val in ((0.25, 0.5), (0.75, 1.0), (1.25, 1.5), (1.75, 2.0), (2.5, 3.0), (3.5, 4.0)):
        m = torch.where(a >= edge, val, m)
    m = torch.where(a >= 5.0, 6.0, m)
    return torch.copysign(m, v)


def _tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension (a power of two) as a pairwise tree: halves added elementwise."""
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = t[..., :h] + t[..., h:]
    return t[..., 0]


def _e4m3_value(code: torch.Tensor) -> torch.Tensor:
    """float32 value of E4M3 codes (int32, 0..255, sign bit ignored: scales are positive); NaN for
    0x7F/0xFF."""
    c = code & 0x7F
    e, m = c >> 3, (c & 7).to(torch.float32)
    val = torch.where(e == 0, m * exp2i(torch.full_like(e, -9)), (m + 8.0) * exp2i(e - 10))
    return torch.where(c == 0x7F, torch.nan, val)


def sr_e4m3(t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Non-negative float32 ``t`` rounded stochastically to E4M3 with uniforms ``u`` (Quartet II's
    kernel): the neighbours come from the round-to-nearest code and the codes next to it."""
    c8 = round_to_grid(t.clamp(max=E4M3_ELEM.max), E4M3_ELEM, None)
    code = encode(c8, E4M3_ELEM).to(torch.int32)
    above = c8 > t
    up = torch.where(above, c8, _e4m3_value(code + 1))
    down = torch.where(above, _e4m3_value((code - 1) & 0xFF), c8)
    prob = div(t - down, up - down)
    return torch.where(u < prob, up, down)  # NaN prob (t on 448, up NaN): down


def block_scale(amax_b: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """The E4M3 block scales (float32) before the correction: ``E4M3_RNE((amax_b / v) / s_dec)``,
    1 where that is 0."""
    s8 = round_to_grid(div(div(amax_b, VAL_MAX), s_dec).clamp(max=E4M3_ELEM.max), E4M3_ELEM, None)
    return torch.where(s8 == 0, 1.0, s8)


def quantize_rotated(
    x: torch.Tensor, group: int, key: int | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MS-EDEN of ``x`` (..., K), already rotated in groups of ``group`` along its last dimension
    (K a multiple of it): (element values q (..., K) NaN where the tensor is not finite, rounded
    E4M3 block scales (..., K / 16) as float32, ``s_dec`` (), the tensor amax ())."""
    x = x.float()
    xb = x.unflatten(-1, (-1, BLOCK))  # (..., nb, 16)
    amax = x.abs().amax()
    finite = torch.isfinite(amax)
    s_dec = torch.where(amax == 0, 1.0, div(div(amax, SCALES_MAX), VAL_MAX))
    s8 = block_scale(xb.abs().amax(-1), s_dec)
    xs = div(xb, (s8 * s_dec).unsqueeze(-1))  # (..., nb, 16)
    q = _rtn(xs)
    groups = (*xs.shape[:-2], -1, group)  # (..., K / G, G): one rotation group per row
    num = _tree_sum((xs * xs).reshape(groups))
    den = _tree_sum((xs * q).reshape(groups))
    corr = torch.where(den == 0, 1.0, div(num, den))
    t = s8 * corr.repeat_interleave(group // BLOCK, -1)  # (..., nb) corrected scales
    block_index = torch.arange(t.numel(), device=t.device).view(t.shape)
    key_t = key if isinstance(key, torch.Tensor) else torch.tensor(key, device=t.device)
    s = sr_e4m3(t, uniform24(key_t, block_index))
    nonfinite = (~torch.isfinite(xb)).any(-1) | ~finite
    q = torch.where(nonfinite.unsqueeze(-1), torch.nan, q)
    s = torch.where(nonfinite, torch.nan, s)
    return q.flatten(-2), s, s_dec, torch.where(finite, amax, torch.nan)


def run(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, p: Plan
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``torch_path.run`` for an MS-EDEN plan (``p.eden``, its group ``p.hadamard``): the same outputs
    (values, or codes, E4M3 scale codes, ``s_dec`` and the rotated tensor's amax)."""
    G = p.hadamard
    if not G:
        raise ValueError(
            "rounding: eden (MS-EDEN) corrects its scales over the Hadamard group; quantize with "
            "hadamard=(size, signs) (a GEMM with a Hadamard transform)"
        )
    x = hadamard_transform_reference(xm, -1, G, signs)  # K padded to a multiple of G
    q, s, s_dec, amax = quantize_rotated(x, G, key)
    if not p.values:
        scales = torch.where(s.isnan(), 0x7F, encode(s, E4M3_ELEM)).to(torch.uint8)
        return encode(q, p.elem), scales, s_dec, amax
    out = q.unflatten(-1, (-1, BLOCK)) * (s * s_dec).unsqueeze(-1)
    return out.flatten(-2).to(p.out_dtype), None, None, None


__all__ = [
    "SCALES_MAX",
    "SCALE_OVERRIDE",
    "VAL_MAX",
    "block_scale",
    "quantize_rotated",
    "run",
    "sr_e4m3",
]
