"""The ``emulated`` GEMM backend: quantize, then multiply the quantized values (any device, CPU included).

Each operand goes through the optional Hadamard transform and then the quantizer along the
reduction dimension (an operand already quantized, a ``QTensor``, is used as it is); the product is
accumulated in float32, and the clip-free SR prescale (3/4 per operand) is undone on the output
(16/9 when both operands use it), as a native GEMM's alpha would.

Two ways to multiply, the same products:

- ``fp32``: both operands dequantized to float32 (tensor scales included) and multiplied in FP32.
  The CPU's default: its FP32 GEMM is its fastest, and the fused quantize-dequantize of the C kernel
  feeds it directly.
- ``bf16``: the operands' block values, element x block scale, which are exact in bfloat16 (an E2M1
  or FP8 element has at most 4 significant bits, an E8M0 scale is a power of two, an E4M3 scale has
  4 more bits: at most 8 with the element, bfloat16's precision), go into a BF16 GEMM with FP32
  accumulation (``torch.mm(..., out_dtype=torch.float32)``, tensor cores on a GPU), and tensor-level
  scales (NVFP4's ``amax / 2688``, per-tensor FP8's decode scale) multiply the output, as the
  hardware's alpha does; for NVFP4 x NVFP4 that is TransformerEngine's alpha
  ``(amax_a * amax_b) * fp32(1/7225344)``. Every product is exact, so the two ways differ only in
  the order of the FP32 accumulation and, for tensor-scaled formats, in applying the tensor scale
  to each element (``fp32``) or to the sum (``bf16``). CUDA's default. A GEMM with an operand that
  is not exact in bfloat16 (a high-precision float32 operand, or one through a Hadamard transform
  without quantization) runs in ``fp32``.

``ABLATE_EMULATED_GEMM=fp32|bf16`` overrides the default for every device; ``EmulatedBackend(gemm=)``
for one backend object.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch

from backends.env import choice
from backends.gemm.base import GemmKeys
from backends.quant import QTensor, QuantSpec, hadamard_transform, nv_alpha
from backends.quant.arith import rcp
from backends.quant.ops import (  # one opaque op each in a compiled graph
    block_values,
    fake_quantize,
    quantized_block_values,
)
from backends.recipes import GemmRecipe, Recipe

GemmMode = Literal["fp32", "bf16"]
F = TypeVar("F", bound=Callable[..., Any])
GEMM_MODES = ("fp32", "bf16")


def constant_when_traced(fn: F) -> F:
    """``torch.compiler.assume_constant_result`` without importing Dynamo, which that function
    does (2 s of CPU on a slow machine at the start of every process that imports this backend
    and never traces: the CLI's, a SLURM job's driver): the same mark on ``fn``, which Dynamo reads
    when it traces a call (pinned to Dynamo's own by tests/backends/gemm/test_emulated_bf16.py)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@constant_when_traced
def _mode_asked() -> str:
    """``ABLATE_EMULATED_GEMM`` ("" unset; another value than ``GEMM_MODES`` raises
    ``ValueError``); a traced model reads it once, at trace time, as a constant (Dynamo tracing
    ``os.environ`` at each GEMM was 3% of a quantized block's trace)."""
    return choice("ABLATE_EMULATED_GEMM", GEMM_MODES, "")


def check_env() -> None:
    """Raise ``ValueError`` if ``ABLATE_EMULATED_GEMM`` is set to a value it does not allow."""
    _mode_asked()


def default_mode(device: torch.device) -> GemmMode:
    """``bf16`` on CUDA, ``fp32`` elsewhere, unless ``ABLATE_EMULATED_GEMM`` says otherwise."""
    env = _mode_asked()
    if env:
        return env  # type: ignore[return-value]
    return "bf16" if device.type == "cuda" else "fp32"


def _operand(
    t: torch.Tensor | QTensor,
    spec: QuantSpec | None,
    key: int | torch.Tensor,
    gemm: GemmRecipe,
    signs: torch.Tensor | None,
) -> torch.Tensor:
    if isinstance(t, QTensor):  # quantized by the caller (a weight shared by fprop and dgrad)
        return t.dequantize(torch.float32)
    rot = gemm.rotation(signs)
    if spec is None:
        return (t if rot is None else hadamard_transform(t, 1, rot.size, rot.signs)).float()
    # the rotation is fused into the quantizer where it can be
    return fake_quantize(t, spec, axis=1, key=key, out_dtype=torch.float32, hadamard=rot)


Scale = tuple[str, torch.Tensor, float] | None
"""("nv", the tensor amax, QuantSpec.nv_top) or ("tensor", the tensor decode scale, 1.0)."""


def _operand_bf16(
    t: torch.Tensor | QTensor,
    spec: QuantSpec | None,
    key: int | torch.Tensor,
    gemm: GemmRecipe,
    signs: torch.Tensor | None,
) -> tuple[torch.Tensor, Scale] | None:
    """(bfloat16 block values, tensor-level scale) of an operand, or None when its values are not
    exact in bfloat16 (high precision, or double-block NVFP4's scale per outer block)."""
    rot = gemm.rotation(signs)
    if not isinstance(t, QTensor):
        if spec is None:  # high precision: exact in bfloat16 only if it already is bfloat16
            return (t, None) if rot is None and t.dtype == torch.bfloat16 else None
        if spec.fmt.scale == "e8m0":  # MX: the fused pass, straight to bf16
            return fake_quantize(
                t, spec, axis=1, key=key, out_dtype=torch.bfloat16, hadamard=rot
            ), None
        if spec.outer_block:
            return None
        values, scale, amax = quantized_block_values(t, spec, 1, key, rot, torch.bfloat16)
    else:
        if t.outer_scales is not None:
            return None
        values, scale = block_values(t, torch.bfloat16)
        spec, amax = t.spec, t.global_amax
    top = spec.nv_top
    if top is not None:  # the amax itself: TE's alpha multiplies the two amaxes first
        assert amax is not None
        return values, ("nv", amax.float().to(values.device), top)
    return values, None if scale is None else ("tensor", scale, 1.0)


def _alpha(sa: Scale, sb: Scale) -> torch.Tensor | None:
    """The output's factor from the operands' tensor-level scales (None: 1)."""
    if sa is not None and sb is not None and sa[0] == sb[0] == "nv":
        return (sa[1] * sb[1]) * nv_alpha(sa[2], sb[2])  # TransformerEngine's NVFP4 GEMM alpha
    out = None
    for s in (sa, sb):
        if s is not None:
            # NVFP4: amax / top (2688, or 1536 with 4/6); FP8, MS-EDEN: the decode scale
            f = s[1] * rcp(s[2]) if s[0] == "nv" else s[1]
            out = f if out is None else out * f
    return out


_BF16_GEMM: dict[str, bool] = {}
"""Device type -> whether ``torch.mm(..., out_dtype=torch.float32)`` runs there on bfloat16
operands (``bf16_gemm_available``)."""


def bf16_gemm_available(device: torch.device) -> bool:
    """Whether ``device`` has a BF16 GEMM with FP32 output (``torch.mm(out_dtype=)``): tried once
    per device type, eagerly (CUDA has it; torch's CPU build has no ``mm.dtype`` kernel). Inside a
    traced model the answer found before is used (CUDA's when none was)."""
    kind = device.type
    if kind not in _BF16_GEMM:
        if torch.compiler.is_compiling():
            return kind == "cuda"
        try:
            a = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
            _BF16_GEMM[kind] = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _BF16_GEMM[kind] = False
    return _BF16_GEMM[kind]


def mm_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` of bfloat16 operands with FP32 accumulation and output: one BF16 GEMM where the
    device has one (``bf16_gemm_available``); elsewhere the same exact products in an FP32 GEMM
    (after the warning of ``slow_path``)."""
    if bf16_gemm_available(a.device):
        return torch.mm(a, b.t(), out_dtype=torch.float32)
    return a.float() @ b.float().t()


def slow_path(
    gemm: GemmRecipe, device: torch.device, dtypes: tuple[torch.dtype, torch.dtype], mode: GemmMode
) -> str | None:
    """Why a GEMM of ``gemm`` with high-precision operands of ``dtypes`` (a, b) does not run in a
    BF16 GEMM with FP32 accumulation although ``mode`` is bf16, or None when it does (or ``mode``
    is fp32): an operand that is not exact in bfloat16, or a device without such a GEMM. What
    ``mm`` decides, and what a trainer can ask before it compiles a model (``warn_slow_path``)."""
    if mode != "bf16" or gemm.high_precision:
        return None
    for name, spec, dt in (("a", gemm.a, dtypes[0]), ("b", gemm.b, dtypes[1])):
        if spec is None and dt != torch.bfloat16:  # (a Hadamard needs both quantized)
            return (
                f"emulated GEMM {gemm.short()}: operand {name} is high precision and not exact in "
                f"bfloat16 ({dt}), so it runs as an FP32 GEMM instead of a BF16 one"
            )
    if not bf16_gemm_available(device):
        return (
            f"emulated GEMM {gemm.short()}: {device.type} has no BF16 GEMM with FP32 output in "
            f"torch {torch.__version__} (torch.mm(out_dtype=torch.float32)), so its exact BF16 "
            "products run as an FP32 GEMM"
        )
    return None


_WARNED: set[str] = set()


def warn_slow_path(reason: str | None) -> None:
    """Warn once per process and reason (``slow_path``); nothing for None."""
    if reason is None or reason in _WARNED:
        return
    _WARNED.add(reason)
    warnings.warn(f"ablate: {reason}", RuntimeWarning, stacklevel=3)


class EmulatedBackend:
    name = "emulated"

    def __init__(self, gemm: GemmMode | None = None) -> None:
        if gemm is not None and gemm not in GEMM_MODES:
            raise ValueError(f"gemm: unknown {gemm!r}; allowed: fp32, bf16")
        self.gemm = gemm
        """fp32 or bf16 (module docstring); None: ``default_mode`` of the operands' device."""

    def check(self, recipe: Recipe, device: torch.device) -> None:
        return None  # every format runs everywhere

    def mm(
        self,
        a: torch.Tensor | QTensor,
        b: torch.Tensor | QTensor,
        gemm: GemmRecipe,
        keys: GemmKeys,
        signs: torch.Tensor | None,
    ) -> torch.Tensor:
        device = (a.codes if isinstance(a, QTensor) else a).device
        out: torch.Tensor | None = None
        mode = self.gemm or default_mode(device)
        if not torch.compiler.is_compiling():  # a traced model: its trainer asked before
            dtypes = tuple(torch.bfloat16 if isinstance(t, QTensor) else t.dtype for t in (a, b))
            warn_slow_path(slow_path(gemm, device, dtypes, mode))  # type: ignore[arg-type]
        if mode == "bf16":
            pa = _operand_bf16(a, gemm.a, keys.a, gemm, signs)
            pb = _operand_bf16(b, gemm.b, keys.b, gemm, signs) if pa is not None else None
            if pa is not None and pb is not None:
                out = mm_bf16(pa[0], pb[0])  # (M, N), FP32 accumulation
                alpha = _alpha(pa[1], pb[1])
                if alpha is not None:
                    out = out * alpha
        if out is None:
            aq = _operand(a, gemm.a, keys.a, gemm, signs)  # (M, K) float32
            bq = _operand(b, gemm.b, keys.b, gemm, signs)  # (N, K) float32
            out = aq @ bq.t()  # (M, N), float32 accumulation
        comp = gemm.output_scale  # undoes the clip-free SR prescale
        return out * comp if comp != 1.0 else out
