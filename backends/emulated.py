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

import os
from typing import Literal

import torch

from .gemm import GemmKeys
from .hadamard import hadamard_transform
from .quant import QTensor, QuantSpec, _rcp, fake_quantize, nv_alpha, quantize
from .recipe import GemmRecipe, Recipe

GemmMode = Literal["fp32", "bf16"]
GEMM_MODES = ("fp32", "bf16")


def default_mode(device: torch.device) -> GemmMode:
    """``bf16`` on CUDA, ``fp32`` elsewhere, unless ``ABLATE_EMULATED_GEMM`` says otherwise."""
    env = os.environ.get("ABLATE_EMULATED_GEMM")
    if env:
        if env not in GEMM_MODES:
            raise ValueError(f"ABLATE_EMULATED_GEMM: unknown {env!r}; allowed: fp32, bf16")
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
    h = gemm.hadamard
    if spec is None:
        return (t if h is None else hadamard_transform(t, 1, h.size, signs)).float()
    had = None if h is None else (h.size, signs)  # fused into the quantizer where it can be
    return fake_quantize(t, spec, axis=1, key=key, out_dtype=torch.float32, hadamard=had)


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
    h = gemm.hadamard
    had = None if h is None else (h.size, signs)
    if not isinstance(t, QTensor):
        if spec is None:  # high precision: exact in bfloat16 only if it already is bfloat16
            return (t, None) if h is None and t.dtype == torch.bfloat16 else None
        if spec.fmt.scale == "e8m0":  # MX: the fused pass, straight to bf16
            return fake_quantize(
                t, spec, axis=1, key=key, out_dtype=torch.bfloat16, hadamard=had
            ), None
        if spec.outer_block:
            return None
        t = quantize(t, spec, axis=1, key=key, hadamard=had)
    if t.outer_scales is not None:
        return None
    values, scale = t.block_values(torch.bfloat16)
    top = t.spec.nv_top
    if top is not None:  # the amax itself: TE's alpha multiplies the two amaxes first
        assert t.global_amax is not None
        return values, ("nv", t.global_amax.float().to(values.device), top)
    return values, None if scale is None else ("tensor", scale, 1.0)


def _alpha(sa: Scale, sb: Scale) -> torch.Tensor | None:
    """The output's factor from the operands' tensor-level scales (None: 1)."""
    if sa is not None and sb is not None and sa[0] == sb[0] == "nv":
        return (sa[1] * sb[1]) * nv_alpha(sa[2], sb[2])  # TransformerEngine's NVFP4 GEMM alpha
    out = None
    for s in (sa, sb):
        if s is not None:
            # NVFP4: amax / top (2688, or 1536 with 4/6); FP8, MS-EDEN: the decode scale
            f = s[1] * _rcp(s[2]) if s[0] == "nv" else s[1]
            out = f if out is None else out * f
    return out


def mm_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` of bfloat16 operands with FP32 accumulation and output: one BF16 GEMM on CUDA;
    elsewhere (no ``mm.dtype`` kernel) the same exact products in an FP32 GEMM."""
    if a.device.type == "cuda":
        try:
            return torch.mm(a, b.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # a torch without mm(out_dtype=)
            pass
    return a.float() @ b.float().t()


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
        if (self.gemm or default_mode(device)) == "bf16":
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
