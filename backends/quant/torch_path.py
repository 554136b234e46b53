"""The quantizer in branch-free torch arithmetic, for ``torch.compile`` to fuse on a GPU.

``reference.py`` holds the specification (``quantize_reference``: a grid search in float64) and
``quantizer.py`` runs it fast on the CPU through the C kernel. Neither suits a GPU: the search is slow there and the C kernel
is CPU-only. This module computes the same bits with integer and float32 operations that a compiler
can fuse, and on CUDA hands them to ``torch.compile`` (Inductor -> Triton), so a quantize-dequantize
(and the Hadamard transform before it) becomes a few fused kernels instead of dozens of eager ones
(for NVFP4 and FP8 the tensor's amax is a reduction before the main pass). Not yet run on a GPU:
the compiled path is checked on the CPU through Inductor's C++ backend.

How each rule becomes arithmetic (``x`` float32, ``a = |v|``):

- shared exponents from the float32 bit fields of the block maximum (``log2_parts``): the exponent
  field gives ``floor(log2 amax)``; a subnormal is normalized exactly by converting its 23-bit
  fraction to float; the fraction bits decide CEIL (non-zero) and EVEN (round-up carry);
- powers of two ``2^e`` are assembled from bits (``exp2i``), never from ``exp2``, whose fast GPU
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
function per plan, dynamic in shapes. ``tests/backends/quant/test_quant.py`` checks this path against the
reference bit for bit on the CPU, eagerly and compiled by Inductor's C++ backend.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
import warnings
from collections.abc import Callable

import torch

from backends.env import flag, text
from backends.quant.arith import (
    E4M3_ELEM,
    F32_MAX,
    NV_DEQ,
    NV_RCP6,
    Plan,
    div,
    e8m0_exponent,
    encode,
    exp2i,
    round_to_grid,
    tensor_scales,
    tiles,
)
from backends.quant.formats import E8M0_NAN
from backends.quant.hadamard import hadamard_transform_reference
from backends.quant.rng import uniform24

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
        nonfinite, amax = tiles(nonfinite, p.rows), tiles(amax, p.rows)
    e = p.elem
    gdec = gamax = None
    if p.scale == "e8m0":
        E = e8m0_exponent(amax, e, p.mode)
        enc = exp2i(-E)
        dec = exp2i(E)
        scales = torch.where(nonfinite, E8M0_NAN, E + 127).to(torch.uint8)
    else:
        genc, gdec, finite, tamax = tensor_scales(x, e, p.scale == "nv")
        nonfinite = nonfinite | ~finite
        if p.scale == "nv":
            # TransformerEngine's arithmetic (quant.py's docstring): s = E4M3(min(amax_b *
            # (S_enc * fp32(1/6)), 448)); elements scaled by min(1 / (s * S_dec), FLT_MAX) and
            # decoded by (s * amax) * fp32(1/2688). The constants are float32 values, so a float64
            # product with them (a compiler's choice) rounds to the float32 one
            s = amax * (genc * NV_RCP6)
            s8 = round_to_grid(s.clamp(max=E4M3_ELEM.max), E4M3_ELEM, None)
            enc = torch.clamp(div(torch.ones_like(s8), s8 * gdec), max=F32_MAX)
            dec = (s8 * tamax) * NV_DEQ
            gamax = tamax
            scales = torch.where(nonfinite, 0x7F, encode(s8, E4M3_ELEM)).to(torch.uint8)
        else:
            enc, dec = genc.expand(amax.shape), gdec.expand(amax.shape)
            scales = None
    v = xb * (enc * p.prescale).unsqueeze(-1)
    u = None
    if p.sr:
        ub = torch.nn.functional.pad(index, (0, Kp - K)).unflatten(-1, (-1, B))
        u = uniform24(key, ub)
    q = round_to_grid(v, e, u)
    q = torch.where(nonfinite.unsqueeze(-1), torch.nan, q)
    if not p.values:
        return encode(q.flatten(-2), e), scales, gdec, gamax
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
    ``ABLATE_COMPILE=0`` (an on/off switch, ``backends.env.flag``: ``0``/``false``/``no``/``off``
    or ``1``/``true``/``yes``/``on``; another value raises ``ValueError``)."""
    return device.type == "cuda" and flag("ABLATE_COMPILE", True)


def check_env() -> None:
    """Raise ``ValueError`` if ``ABLATE_COMPILE`` or ``ABLATE_COMPILE_BACKEND`` is set to a value
    it does not allow."""
    flag("ABLATE_COMPILE", True)
    compile_backend()


COMMON_BACKENDS = ("inductor", "aot_eager", "eager")
"""The ``torch.compile`` backends taken without asking torch (which imports Dynamo, seconds)."""


def compile_backend() -> str:
    """The ``torch.compile`` backend of the quantizer's plans and of a compiled model (the trainer's
    ``train.compile``): ``ABLATE_COMPILE_BACKEND``, else (unset or empty) ``inductor``. A name that
    is none of torch's backends raises ``ValueError`` naming the variable and some it allows."""
    name = text("ABLATE_COMPILE_BACKEND", "inductor")
    if name not in COMMON_BACKENDS:
        _check_backend(name)
    return name


@functools.cache
def _check_backend(name: str) -> None:
    import torch._dynamo

    if name not in torch._dynamo.list_backends(exclude_tags=()):
        shown = sorted(set(COMMON_BACKENDS) | set(torch._dynamo.list_backends()))
        raise ValueError(
            f"environment variable ABLATE_COMPILE_BACKEND: unknown {name!r}; allowed: a "
            f"torch.compile backend such as {', '.join(shown)} (or unset: inductor)"
        )


PlanRunner = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, Plan],
    tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
]
"""``run``, or another quantizer with its signature (``four_over_six.run``, ``ms_eden.run``,
``double_block.run``: the quantizers only this torch path runs)."""


RECOMPILE_LIMIT = 64
"""Dynamo's recompile limit once a quantizer plan compiles (raised, never lowered; process-wide, as
Dynamo keeps it). Its default, 8 variants per code object, is too few for one plan: an operand and
its transpose (two stride orders), FP32 and BF16 inputs, calls from eager autograd and from inside a
compiled model's op (different dispatch keys), each first with static sizes, then dynamic ones. A
training step of full MXFP4 with SR met 9 and more on an H200 and on the CPU, and past the limit a
``fullgraph`` compile fails: the plan then ran eagerly, many times slower."""


@functools.cache
def compiled(p: Plan, impl: PlanRunner | None = None) -> Runner:
    """``impl`` (default ``run``) for plan ``p`` as one compiled function (dynamic shapes after the
    first recompile), by ``compile_backend()`` (default Inductor).

    Each plan compiles a copy of the function under its own code object: Dynamo keeps its cache and
    its recompile limit per code object, and one plan's variants fit in that limit
    (``RECOMPILE_LIMIT``) where all plans together would not (a recipe uses up to six plans: two
    operands of three GEMMs).
    """
    impl = impl or run
    code = impl.__code__.replace(co_name=f"quantize_plan_{next(_plan_ids)}")
    fn = types.FunctionType(code, impl.__globals__, code.co_name, (p,))  # p as the default of p
    import torch._dynamo

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    _codes.append(code)
    return torch.compile(fn, fullgraph=True, backend=compile_backend())


_plan_ids = itertools.count()
_codes: list[types.CodeType] = []


def compiled_variants() -> int:
    """How many graphs the compiled plans hold (Dynamo's cache entries, summed over plans): what a
    quantizer has compiled in this process, apart from a compiled model's own graphs."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return sum(len(_debug_get_cache_entry_list(c)) for c in list(_codes))


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
        compile_backend()  # a bad name raises here, not as a failed compile that runs eagerly
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
