"""The float32 arithmetic every torch path of the quantizer shares, public in one light module.

Constants of the formats (``F32_MAX``; NVFP4's ``NV_RCP6``, ``NV_DEQ`` and ``NV_ALPHA``, exact as
Python floats, TransformerEngine's; ``rcp``), the compile-static description of a quantize call
(``Elem``, ``Plan``), and the bit-level helpers the quantizers are written in: exact powers of two
(``exp2i``, ``exp2n``), ``log2_parts``, IEEE float32 division (``div``), rounding onto an element
grid (``round_to_grid``), element codes (``encode``), E8M0 exponents, tensor scales and 2-D
tiles. ``torch_path.py`` says why each rule is computed this way; ``four_over_six.py``,
``ms_eden.py`` and ``double_block.py`` build their quantizers from the same helpers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.quant.formats import E2M1, E4M3, E5M2, ElementFormat

F32_MAX = torch.finfo(torch.float32).max


def rcp(v: float) -> float:
    """fp32(1 / v), exact as a Python float."""
    return float(torch.tensor(1.0) / torch.tensor(v))


# float32 constants of TransformerEngine's NVFP4 arithmetic, exact as Python floats (so a float64
# product with a float32 operand rounds to the float32 product)
NV_RCP6 = rcp(6.0)  # fp32(1/6): the block scale multiplier
NV_DEQ = rcp(2688.0)  # fp32(1/(6 * 448)): the dequantizer
NV_ALPHA = rcp(7225344.0)  # fp32(1/2688^2): the GEMM alpha


@dataclass(frozen=True, slots=True)
class Elem:
    """The constants of an element format that the arithmetic needs (hashable, compile-static)."""

    mbits: int
    emin: int
    emax: int
    max: float
    bits: int
    fp4: bool

    @staticmethod
    def of(f: ElementFormat) -> Elem:
        # looked up, not cached on first use: Dynamo traces this call inside a compiled model,
        # where a cache wrapper draws a warning and filling a cache is a side effect
        e = _ELEMS.get(f)
        return e if e is not None else Elem._make(f)

    @staticmethod
    def _make(f: ElementFormat) -> Elem:
        fp4 = f.torch_dtype is torch.float4_e2m1fn_x2
        return Elem(f.mbits, f.emin, f.emax, f.max, f.bits, fp4)


_ELEMS: dict[ElementFormat, Elem] = {f: Elem._make(f) for f in (E2M1, E4M3, E5M2)}


E4M3_ELEM = Elem.of(E4M3)


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a quantize call specializes on (see ``plan``)."""

    elem: Elem
    scale: str  # "e8m0", "nv" or "tensor"
    block: int  # elements per scale; 0: the whole row (per-tensor formats)
    rows: int  # rows per scale: 1, or ``block`` for square 2-D tiles (a 2-D input only)
    mode: int  # E8M0 rule: 0 FLOOR, 1 CEIL, 2 EVEN, 3 RCEIL (quantizer._MODE_CODES)
    sr: bool
    prescale: float
    hadamard: int  # Hadamard size, 0 for none
    values: bool  # True: dequantized values in ``out_dtype``; False: codes, scales, tensor scale
    out_dtype: torch.dtype
    rule: str = (
        ""  # Four Over Six error measure: mse, mae, abs_max (``four_over_six.py``); "": none
    )
    pick_nearest: bool = False  # Four Over Six: compare the candidates rounded to nearest
    eden: bool = False  # MS-EDEN rounding (``ms_eden.py``), its group the Hadamard size
    outer: int = 0  # elements per FP32 scale of double-block NVFP4 (``double_block.py``); 0: none


# ----------------------------------------------------------------------------------------------
# bit-level helpers


def exp2i(e: torch.Tensor) -> torch.Tensor:
    """float32 ``2^e`` for integer ``e`` in [-149, 127], exact, subnormals included."""
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1) << 23
    sub = torch.ones_like(e) << (e + 149).clamp(0, 22)
    return torch.where(e >= -126, normal, sub).view(torch.float32)


def exp2n(e: torch.Tensor) -> torch.Tensor:
    """``exp2i`` for ``e`` known to lie in the normal range [-126, 127] (an element format's grid
    steps do): the exponent field alone, no clamping."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def log2_parts(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(floor(log2 a), the 23 fraction bits of a's normalized significand) of float32 ``a > 0``.

    Subnormals are normalized exactly: their fraction (an integer below 2^23) converts to float32
    without rounding, and its exponent and fraction fields are those of the normalized value.
    """
    bits = a.view(torch.int32)
    field = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    norm = frac.to(torch.float32).view(torch.int32)  # frac as a float: exact
    sub_log2 = ((norm >> 23) & 0xFF) - 127 - 149
    sub = field == 0
    return torch.where(sub, sub_log2, field - 127), torch.where(sub, norm & 0x7FFFFF, frac)


def div(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    """float32 ``a / b`` rounded as IEEE float32 division (computed in float64, see the docstring)."""
    b64 = b.double() if isinstance(b, torch.Tensor) else b
    return (a.double() / b64).float()


def round_to_grid(v: torch.Tensor, e: Elem, u: torch.Tensor | None) -> torch.Tensor:
    """float32 ``v`` (element units) onto the grid of ``e``: nearest-even, or stochastic with ``u``;
    magnitudes at or above ``max`` saturate to it (the reference's ``_round_reference``)."""
    a = v.abs()
    fl = ((a.view(torch.int32) >> 23) & 0xFF) - 127  # floor(log2 a) for normals; subnormals: < emin
    ex = fl.clamp(e.emin, e.emax)
    t = a * exp2n(e.mbits - ex)  # exact: a in units of the grid step of its binade
    if u is None:
        r = torch.round(t)  # ties to even: the even integer is the even code
    else:
        f = torch.floor(t)
        r = f + (u < t - f).to(torch.float32)  # up with probability t - floor(t)
    q = r * exp2n(ex - e.mbits)  # ex in [emin, emax]: a normal power of two
    q = torch.where(a >= e.max, e.max, q)
    return torch.copysign(q, v)


def encode(q: torch.Tensor, e: Elem) -> torch.Tensor:
    """uint8 codes (sign in bit ``bits - 1``) of float32 grid values; NaN -> 0x7F (FP8) or 0 (E2M1),
    as ``ElementFormat.encode``."""
    nan = torch.isnan(q)
    a = torch.where(nan, 0.0, q.abs())
    fl = ((a.view(torch.int32) >> 23) & 0xFF) - 127
    ex = fl.clamp(min=e.emin)
    normal = ((ex - e.emin + 1) << e.mbits).to(torch.float32) + (
        a * exp2i(e.mbits - ex) - float(1 << e.mbits)
    )
    sub = a * exp2i(torch.full_like(fl, e.mbits - e.emin))
    mag = torch.where(a < 2.0**e.emin, sub, normal).to(torch.int32)
    sign = torch.signbit(torch.where(nan, 0.0, q)).to(torch.int32) << (e.bits - 1)
    code = mag | sign
    if not e.fp4:
        code = torch.where(nan, 0x7F, code)
    return code.to(torch.uint8)


def e8m0_exponent(amax: torch.Tensor, e: Elem, mode: int) -> torch.Tensor:
    """The shared exponent E (int32) of float32 block maxima, clamped to [-127, 127]."""
    fl, frac = log2_parts(amax)
    if mode == 0:  # FLOOR
        E = fl - e.emax
    elif mode == 1:  # CEIL
        E = fl + (frac != 0).to(torch.int32) - e.emax
    elif mode == 2:  # EVEN: the significand rounds up to 2 at e.mbits fraction bits
        E = fl + (frac >= (1 << 23) - (1 << (22 - e.mbits))).to(torch.int32) - e.emax
    else:  # RCEIL: ceil(log2(fp32(amax / max)))
        d = div(amax, e.max)
        dl, df = log2_parts(d)
        E = torch.where(d == 0, -127, dl + (df != 0).to(torch.int32))
    return torch.where(amax == 0, -127, E).clamp(-127, 127)


def tensor_scales(
    x: torch.Tensor, e: Elem, nv: bool, top: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(encode, decode, finite, amax): the float32 tensor-level scales of NVFP4 / per-tensor FP8 on
    x's device, as ``quantizer.global_scales`` computes them (1, 1 for an all-zero or non-finite tensor;
    amax NaN for a non-finite one): encode ``top / amax``, ``top`` by default the largest value the
    format reaches (6 * 448 for NVFP4; Four Over Six gives 6 * 256)."""
    amax = x.abs().amax().float()
    finite = torch.isfinite(amax)
    if top is None:
        top = e.max * (E4M3_ELEM.max if nv else 1.0)  # 448 * 6 for NVFP4
    enc = torch.clamp(div(torch.full_like(amax, top), amax), max=F32_MAX)
    enc = torch.where((amax == 0) | ~finite, 1.0, enc)
    return enc, div(torch.ones_like(enc), enc), finite, torch.where(finite, amax, torch.nan)


def tiles(t: torch.Tensor, rows: int) -> torch.Tensor:
    """(R, nb) per-row block values -> the maximum over each tile of ``rows`` rows, repeated on
    every row of the tile (zero rows pad a ragged last tile: no amax or NaN flag changes)."""
    R = t.shape[0]
    pad = -R % rows
    tp = torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t
    m = tp.unflatten(0, (-1, rows)).amax(1)  # (ceil(R / rows), nb)
    return m.repeat_interleave(rows, 0)[:R]
