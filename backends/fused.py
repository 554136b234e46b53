"""The quantizer in branch-free torch arithmetic, for ``torch.compile`` to fuse on a GPU.

``reference.py`` holds the specification (``quantize_reference``: a grid search in float64) and
``quant.py`` runs it fast on the CPU through the C kernel. Neither suits a GPU: the search is slow there and the C kernel
is CPU-only. This module computes the same bits with integer and float32 operations that a compiler
can fuse, and on CUDA hands them to ``torch.compile`` (Inductor -> Triton), so a quantize-dequantize
(and the Hadamard transform before it) becomes a few fused kernels instead of dozens of eager ones
(for NVFP4 and FP8 the tensor's amax is a reduction before the main pass). Not yet run on a GPU:
the compiled path is checked on the CPU through Inductor's C++ backend.

How each rule becomes arithmetic (``x`` float32, ``a = |v|``):

- shared exponents from the float32 bit fields of the block maximum (``_log2_parts``): the exponent
  field gives ``floor(log2 amax)``; a subnormal is normalized exactly by converting its 23-bit
  fraction to float; the fraction bits decide CEIL (non-zero) and EVEN (round-up carry);
- powers of two ``2^e`` are assembled from bits (``_exp2i``), never from ``exp2``, whose fast GPU
  forms are approximate and flush subnormals (2^-127 is the scale of an all-zero block);
- element rounding: in the binade of ``a`` (at least ``emin``) the grid step is ``2^(e - mbits)``, so
  ``t = a / step`` is exact and ``round(t)`` (ties to even) or ``floor(t) + (u < t - floor(t))``
  (stochastic) picks the grid point; saturation at ``max`` as in the reference;
- every division is done in float64 and rounded to float32 once: Triton's float32 ``/`` is an
  approximation (``div.full.f32``), float64 division is exact-rounded, and rounding its quotient to
  float32 gives the IEEE float32 quotient (53 >= 2 * 24 + 2 bits, so the double rounding is
  innocuous); a compiler that turns ``x / c`` into ``x * (1 / c)`` cannot change the result either,
  because none of the quotients here lies within 2^-50 of a float32 rounding boundary unless it is on one;
- the random stream is ``rng.uniform24`` with the key as a device tensor (a Python int would be a
  compile-time constant and recompile at every step).

Everything static (format, scale mode, rounding, Hadamard size, output) is a ``Plan``; one compiled
function per plan, dynamic in shapes. ``tests/backends/test_quant.py`` checks this path against the
reference bit for bit on the CPU, eagerly and compiled by Inductor's C++ backend.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .formats import E2M1, E4M3, E5M2, E8M0_NAN, ElementFormat
from .hadamard import hadamard_transform_reference
from .rng import uniform24

_F32_MAX = torch.finfo(torch.float32).max
_NV_RCP6 = float(torch.tensor(1.0) / torch.tensor(6.0))  # quant.NV_RCP6 (quant imports this module)
_NV_DEQ = float(torch.tensor(1.0) / torch.tensor(2688.0))  # quant.NV_DEQ


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


_E4M3 = Elem.of(E4M3)


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a quantize call specializes on (see ``plan``)."""

    elem: Elem
    scale: str  # "e8m0", "nv" or "tensor"
    block: int  # elements per scale; 0: the whole row (per-tensor formats)
    rows: int  # rows per scale: 1, or ``block`` for square 2-D tiles (a 2-D input only)
    mode: int  # E8M0 rule: 0 FLOOR, 1 CEIL, 2 EVEN, 3 RCEIL (quant._MODE_CODES)
    sr: bool
    prescale: float
    hadamard: int  # Hadamard size, 0 for none
    values: bool  # True: dequantized values in ``out_dtype``; False: codes, scales, tensor scale
    out_dtype: torch.dtype
    rule: str = ""  # Four Over Six error measure: mse, mae, abs_max (``scale_rule.py``); "": none
    eden: bool = False  # MS-EDEN rounding (``eden.py``), its group the Hadamard size
    outer: int = 0  # elements per FP32 scale of double-block NVFP4 (``outer_block.py``); 0: none


# ----------------------------------------------------------------------------------------------
# bit-level helpers


def _exp2i(e: torch.Tensor) -> torch.Tensor:
    """float32 ``2^e`` for integer ``e`` in [-149, 127], exact, subnormals included."""
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1) << 23
    sub = torch.ones_like(e) << (e + 149).clamp(0, 22)
    return torch.where(e >= -126, normal, sub).view(torch.float32)


def _exp2n(e: torch.Tensor) -> torch.Tensor:
    """``_exp2i`` for ``e`` known to lie in the normal range [-126, 127] (an element format's grid
    steps do): the exponent field alone, no clamping."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def _log2_parts(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


def _div(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    """float32 ``a / b`` rounded as IEEE float32 division (computed in float64, see the docstring)."""
    b64 = b.double() if isinstance(b, torch.Tensor) else b
    return (a.double() / b64).float()


def _round(v: torch.Tensor, e: Elem, u: torch.Tensor | None) -> torch.Tensor:
    """float32 ``v`` (element units) onto the grid of ``e``: nearest-even, or stochastic with ``u``;
    magnitudes at or above ``max`` saturate to it (the reference's ``_round_reference``)."""
    a = v.abs()
    fl = ((a.view(torch.int32) >> 23) & 0xFF) - 127  # floor(log2 a) for normals; subnormals: < emin
    ex = fl.clamp(e.emin, e.emax)
    t = a * _exp2n(e.mbits - ex)  # exact: a in units of the grid step of its binade
    if u is None:
        r = torch.round(t)  # ties to even: the even integer is the even code
    else:
        f = torch.floor(t)
        r = f + (u < t - f).to(torch.float32)  # up with probability t - floor(t)
    q = r * _exp2n(ex - e.mbits)  # ex in [emin, emax]: a normal power of two
    q = torch.where(a >= e.max, e.max, q)
    return torch.copysign(q, v)


def _encode(q: torch.Tensor, e: Elem) -> torch.Tensor:
    """uint8 codes (sign in bit ``bits - 1``) of float32 grid values; NaN -> 0x7F (FP8) or 0 (E2M1),
    as ``ElementFormat.encode``."""
    nan = torch.isnan(q)
    a = torch.where(nan, 0.0, q.abs())
    fl = ((a.view(torch.int32) >> 23) & 0xFF) - 127
    ex = fl.clamp(min=e.emin)
    normal = ((ex - e.emin + 1) << e.mbits).to(torch.float32) + (
        a * _exp2i(e.mbits - ex) - float(1 << e.mbits)
    )
    sub = a * _exp2i(torch.full_like(fl, e.mbits - e.emin))
    mag = torch.where(a < 2.0**e.emin, sub, normal).to(torch.int32)
    sign = torch.signbit(torch.where(nan, 0.0, q)).to(torch.int32) << (e.bits - 1)
    code = mag | sign
    if not e.fp4:
        code = torch.where(nan, 0x7F, code)
    return code.to(torch.uint8)


def _e8m0_exponent(amax: torch.Tensor, e: Elem, mode: int) -> torch.Tensor:
    """The shared exponent E (int32) of float32 block maxima, clamped to [-127, 127]."""
    fl, frac = _log2_parts(amax)
    if mode == 0:  # FLOOR
        E = fl - e.emax
    elif mode == 1:  # CEIL
        E = fl + (frac != 0).to(torch.int32) - e.emax
    elif mode == 2:  # EVEN: the significand rounds up to 2 at e.mbits fraction bits
        E = fl + (frac >= (1 << 23) - (1 << (22 - e.mbits))).to(torch.int32) - e.emax
    else:  # RCEIL: ceil(log2(fp32(amax / max)))
        d = _div(amax, e.max)
        dl, df = _log2_parts(d)
        E = torch.where(d == 0, -127, dl + (df != 0).to(torch.int32))
    return torch.where(amax == 0, -127, E).clamp(-127, 127)


def _tensor_scales(
    x: torch.Tensor, e: Elem, nv: bool, top: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(encode, decode, finite, amax): the float32 tensor-level scales of NVFP4 / per-tensor FP8 on
    x's device, as ``quant._global_scales`` computes them (1, 1 for an all-zero or non-finite tensor;
    amax NaN for a non-finite one): encode ``top / amax``, ``top`` by default the largest value the
    format reaches (6 * 448 for NVFP4; Four Over Six gives 6 * 256)."""
    amax = x.abs().amax().float()
    finite = torch.isfinite(amax)
    if top is None:
        top = e.max * (_E4M3.max if nv else 1.0)  # 448 * 6 for NVFP4
    enc = torch.clamp(_div(torch.full_like(amax, top), amax), max=_F32_MAX)
    enc = torch.where((amax == 0) | ~finite, 1.0, enc)
    return enc, _div(torch.ones_like(enc), enc), finite, torch.where(finite, amax, torch.nan)


def _tiles(t: torch.Tensor, rows: int) -> torch.Tensor:
    """(R, nb) per-row block values -> the maximum over each tile of ``rows`` rows, repeated on
    every row of the tile (zero rows pad a ragged last tile: no amax or NaN flag changes)."""
    R = t.shape[0]
    pad = -R % rows
    tp = torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t
    m = tp.unflatten(0, (-1, rows)).amax(1)  # (ceil(R / rows), nb)
    return m.repeat_interleave(rows, 0)[:R]


# ----------------------------------------------------------------------------------------------
# the quantizer


def run(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, p: Plan
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Quantize ``xm`` along its last dimension.

    Returns, for ``p.values``: (dequantized values in ``p.out_dtype``, xm's shape, last dimension
    padded to the Hadamard size if any), None, None, None; otherwise: (codes (..., Kp) uint8, block
    scale codes (..., nb) uint8 or None, float32 tensor decode scale () or None, float32 tensor amax
    () of NVFP4 or None). ``key`` is a () int64 tensor on xm's device.
    """
    if p.hadamard:
        xm = hadamard_transform_reference(xm, -1, p.hadamard, signs)
    x = xm.float()
    shape = x.shape
    K = shape[-1]
    B = p.block or K
    Kp = -(-K // B) * B
    # the random stream is indexed in the axis-last row-major order of the (transformed) tensor
    index = torch.arange(x.numel(), device=x.device).view(shape)
    xb = torch.nn.functional.pad(x, (0, Kp - K)).unflatten(-1, (-1, B))  # (..., nb, B)
    nonfinite = (~torch.isfinite(xb)).any(-1)  # (..., nb)
    amax = xb.abs().amax(-1)
    if p.rows > 1:  # 2-D tiles: the maximum over the tile's rows of the row blocks' maxima
        nonfinite, amax = _tiles(nonfinite, p.rows), _tiles(amax, p.rows)
    e = p.elem
    gdec = gamax = None
    if p.scale == "e8m0":
        E = _e8m0_exponent(amax, e, p.mode)
        enc = _exp2i(-E)
        dec = _exp2i(E)
        scales = torch.where(nonfinite, E8M0_NAN, E + 127).to(torch.uint8)
    else:
        genc, gdec, finite, tamax = _tensor_scales(x, e, p.scale == "nv")
        nonfinite = nonfinite | ~finite
        if p.scale == "nv":
            # TransformerEngine's arithmetic (quant.py's docstring): s = E4M3(min(amax_b *
            # (S_enc * fp32(1/6)), 448)); elements scaled by min(1 / (s * S_dec), FLT_MAX) and
            # decoded by (s * amax) * fp32(1/2688). The constants are float32 values, so a float64
            # product with them (a compiler's choice) rounds to the float32 one
            s = amax * (genc * _NV_RCP6)
            s8 = _round(s.clamp(max=_E4M3.max), _E4M3, None)
            enc = torch.clamp(_div(torch.ones_like(s8), s8 * gdec), max=_F32_MAX)
            dec = (s8 * tamax) * _NV_DEQ
            gamax = tamax
            scales = torch.where(nonfinite, 0x7F, _encode(s8, _E4M3)).to(torch.uint8)
        else:
            enc, dec = genc.expand(amax.shape), gdec.expand(amax.shape)
            scales = None
    v = xb * (enc * p.prescale).unsqueeze(-1)
    u = None
    if p.sr:
        ub = torch.nn.functional.pad(index, (0, Kp - K)).unflatten(-1, (-1, B))
        u = uniform24(key, ub)
    q = _round(v, e, u)
    q = torch.where(nonfinite.unsqueeze(-1), torch.nan, q)
    if not p.values:
        return _encode(q.flatten(-2), e), scales, gdec, gamax
    out = q * dec.unsqueeze(-1)  # 2^E, NVFP4's (s * amax) / 2688, or the tensor decode scale
    return out.flatten(-2)[..., :K].to(p.out_dtype), None, None, None


# ----------------------------------------------------------------------------------------------
# compiled per plan on CUDA

Runner = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None],
    tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
]
_lock = threading.Lock()
_failed: dict[Plan, str] = {}


def compile_enabled(device: torch.device) -> bool:
    """Whether quantize calls on ``device`` go through ``torch.compile``: on CUDA (and ROCm), unless
    ``ABLATE_COMPILE=0``."""
    return device.type == "cuda" and os.environ.get("ABLATE_COMPILE", "1") != "0"


PlanRunner = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, Plan],
    tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
]
"""``run``, or another quantizer with its signature (``scale_rule.run``, ``eden.run``,
``outer_block.run``: the quantizers only this torch path runs)."""


@functools.cache
def compiled(p: Plan, impl: PlanRunner | None = None) -> Runner:
    """``impl`` (default ``run``) for plan ``p`` as one compiled function (dynamic shapes after the
    first recompile).

    Each plan compiles a copy of the function under its own code object: Dynamo keeps its cache and
    its recompile limit per code object, and one plan's layouts and dtypes fit in that limit where
    all plans together would not (a recipe uses up to six plans: two operands of three GEMMs).
    """
    impl = impl or run
    code = impl.__code__.replace(co_name=f"quantize_plan_{next(_plan_ids)}")
    fn = types.FunctionType(code, impl.__globals__, code.co_name, (p,))  # p as the default of p
    return torch.compile(fn, fullgraph=True)


_plan_ids = itertools.count()


def call(
    xm: torch.Tensor,
    key: int | torch.Tensor,
    signs: torch.Tensor | None,
    p: Plan,
    compile_: bool | None = None,
    impl: PlanRunner | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``impl`` (default ``run``), compiled where ``compile_enabled`` (or ``compile_``) says so,
    eager otherwise or if compiling fails (with one warning naming the error). ``key``: an int, or
    a () int64 tensor (the training step's keys, derived on the device)."""
    fn = impl or run
    if isinstance(key, torch.Tensor):
        k = (key & 0xFFFFFFFF).to(device=xm.device, dtype=torch.int64)
    else:
        k = torch.full((), key & 0xFFFFFFFF, dtype=torch.int64, device=xm.device)  # no host sync
    if torch.compiler.is_compiling():  # inside a compiled model: traced into its graph
        return fn(xm, k, signs, p)
    use = compile_enabled(xm.device) if compile_ is None else compile_
    if use and p not in _failed:
        try:
            return (compiled(p) if impl is None else compiled(p, impl))(xm, k, signs)
        except Exception as exc:  # compile errors surface at the first call
            with _lock:
                if p not in _failed:
                    _failed[p] = f"{type(exc).__name__}: {exc}"
                    warnings.warn(
                        f"ablate: torch.compile of the quantizer failed ({_failed[p][:300]}); "
                        "running it eagerly (same numerics, slower). ABLATE_COMPILE=0 skips "
                        "compiling.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    return fn(xm, k, signs, p)
