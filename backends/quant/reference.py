"""The specification of the quantizers: slow, readable, pure torch, any device.

``quantize_reference`` is what ``quantize`` must equal bit for bit (the C kernel of ``ckernel.py``
and the torch arithmetic of ``torch_path.py`` are tested against it): rounding by a search of the element
grid in float64, the shared exponent from ``frexp``. The rules it implements are listed in
``quantizer.py``'s docstring; the scale modes are those of ``formats.ScaleMode``.
"""

from __future__ import annotations

import torch

from backends.quant.arith import NV_RCP6
from backends.quant.formats import E4M3, E8M0_NAN, ElementFormat, ScaleMode
from backends.quant.operand import QuantSpec
from backends.quant.qtensor import QTensor
from backends.quant.quantizer import check_args, global_scales, spec_key
from backends.quant.rng import uniform24


def _e8m0_exponent_reference(
    amax: torch.Tensor, elem: ElementFormat, mode: ScaleMode
) -> torch.Tensor:
    """Unbiased shared exponent E (int64) of float32 block maxima, clamped to [-127, 127]."""
    m, e = torch.frexp(amax)  # amax = m * 2^e, m in [0.5, 1)
    floor_log2 = e.to(torch.int64) - 1
    if mode == ScaleMode.FLOOR:
        E = floor_log2 - elem.emax
    elif mode == ScaleMode.CEIL:
        E = floor_log2 + (m != 0.5).to(torch.int64) - elem.emax
    elif mode == ScaleMode.EVEN:
        carry = (2 * m.double()) >= 2 - 2.0 ** -(elem.mbits + 1)
        E = floor_log2 + carry.to(torch.int64) - elem.emax
    else:  # RCEIL
        d = amax / torch.tensor(elem.max, dtype=torch.float32, device=amax.device)
        md, ed = torch.frexp(d)
        E = torch.where(md == 0.5, ed - 1, ed).to(torch.int64)
        E = torch.where(d == 0, -127, E)
    E = torch.where(amax == 0, -127, E)
    return E.clamp(-127, 127)


def nv_block_scales(
    amax: torch.Tensor, genc: float, gdec: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 block scales in TransformerEngine's float32 arithmetic (``quantizer.py``'s docstring):
    (the E4M3 block decode scales as float8_e4m3fn, the float32 element encode factors) of float32
    block maxima ``amax`` under the tensor scales ``genc`` = S_enc and ``gdec`` = 1 / S_enc."""

    def f32(v: float) -> torch.Tensor:
        # float32 tensors on both sides of every operation: with a Python float the CPU kernels
        # may compute in double and round twice
        return torch.tensor(v, dtype=torch.float32, device=amax.device)

    mult = f32(genc) * f32(NV_RCP6)  # S_enc * fp32(1/6)
    s = torch.clamp(amax * mult, max=E4M3.max)
    s8 = s.to(torch.float8_e4m3fn)  # round to nearest even
    fmax = f32(torch.finfo(torch.float32).max)
    enc = torch.minimum(torch.ones_like(s) / (s8.float() * f32(gdec)), fmax)
    return s8, enc  # enc: FLT_MAX where s8 == 0 (1 / 0 saturated)


def _round_reference(v: torch.Tensor, elem: ElementFormat, u: torch.Tensor | None) -> torch.Tensor:
    """Round float32 ``v`` (element units) to the grid by search: nearest, ties to the even code,
    saturate at max; or stochastically between the two neighbours when ``u`` is given."""
    grid = elem.grid().to(v.device)  # float64, ascending, index == magnitude code
    n = grid.numel()
    a = v.abs().double().contiguous()
    lo_i = (torch.searchsorted(grid, a, right=True) - 1).clamp(0, n - 1)
    hi_i = (lo_i + 1).clamp(max=n - 1)
    lo, hi = grid[lo_i], grid[hi_i]
    if u is None:
        d_lo, d_hi = a - lo, hi - a
        pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi_i % 2 == 0))
    else:
        pick_hi = u.double() < (a - lo) / (hi - lo).clamp(min=1e-300)
    q = torch.where(pick_hi, hi, lo)
    q = torch.where(a >= elem.max, elem.max, q).float()
    return torch.copysign(q, v)


def quantize_reference(x: torch.Tensor, spec: QuantSpec, axis: int = -1, key: int = 0) -> QTensor:
    """The specification of ``quantize``: slow, readable, pure torch. Not of the ``variants``
    (Four Over Six, MS-EDEN, double-block NVFP4): each is specified by its own module and tested
    against a transcription of its source; ValueError for them."""
    axis = check_args(x, spec, axis)
    if spec.variant:
        raise ValueError(
            f"quantize_reference specifies the formats' own scales and roundings; {spec.short()} "
            "is specified by its module (backends/quant/four_over_six.py, eden.py, outer_block.py)"
        )
    f, elem = spec.fmt, spec.fmt.elem
    xm = x.detach().float().movedim(axis, -1)
    K = xm.shape[-1]
    # the random stream is indexed in the axis-last row-major order, whatever x's memory layout
    index = torch.arange(x.numel(), device=x.device).view(xm.shape)
    B = spec.block or K
    Kp = -(-K // B) * B
    xm = torch.nn.functional.pad(xm, (0, Kp - K))
    index = torch.nn.functional.pad(index, (0, Kp - K))
    u = uniform24(spec_key(key), index) if spec.rounding == "sr" else None
    xb = xm.unflatten(-1, (-1, B))  # (..., nb, B)
    nonfinite = (~torch.isfinite(xb)).any(-1)  # (..., nb)
    amax = xb.abs().amax(-1)
    if spec.block_rows > 1:  # 2-D tiles of a (rows, K) tensor: one amax per tile
        R, rb = xb.shape[0], spec.block_rows
        tiles = torch.nn.functional.pad(xb, (0, 0, 0, 0, 0, -R % rb)).unflatten(0, (-1, rb))
        tile_nonfinite = (~torch.isfinite(tiles)).any(3).any(1)  # (R / rb, nb)
        tile_amax = tiles.abs().amax((1, 3))
        nonfinite = tile_nonfinite.repeat_interleave(rb, 0)[:R]
        amax = tile_amax.repeat_interleave(rb, 0)[:R]
    global_dec = global_amax = None
    scales: torch.Tensor | None
    if f.scale == "e8m0":
        E = _e8m0_exponent_reference(amax, elem, spec.scale_mode)
        enc = torch.ldexp(torch.ones_like(amax), -E)
        scales = torch.where(nonfinite, E8M0_NAN, E + 127).to(torch.uint8)
    else:
        genc, gdec, finite, gamax = global_scales(x, spec)
        global_dec = torch.tensor(gdec, dtype=torch.float32)
        if not finite:
            nonfinite = torch.ones_like(nonfinite)
        if f.scale == "nv":
            global_amax = torch.tensor(gamax, dtype=torch.float32)
            s8, enc = nv_block_scales(amax, genc, gdec)
            scales = torch.where(nonfinite, 0x7F, s8.view(torch.uint8)).to(torch.uint8)
        else:
            scales = None
            enc = torch.full_like(amax, genc)
    mul = (enc * spec.prescale_factor).unsqueeze(-1)
    v = xb * mul
    ub = None if u is None else u.unflatten(-1, (-1, B))
    q = _round_reference(v, elem, ub)
    q = torch.where(nonfinite.unsqueeze(-1), torch.nan, q).flatten(-2)
    return QTensor(elem.encode(q), scales, global_dec, spec, axis, tuple(x.shape), global_amax)


def fake_quantize_reference(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int = 0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``quantize_reference(...).dequantize()`` in ``out_dtype`` (default: x's dtype)."""
    return quantize_reference(x, spec, axis, key).dequantize(out_dtype or x.dtype)
