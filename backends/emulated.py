"""The ``emulated`` GEMM backend: quantize, dequantize, multiply in FP32 (any device, CPU included).

Each operand goes through the optional Hadamard transform and then ``fake_quantize`` along the
reduction dimension (an operand already quantized, a ``QTensor``, is dequantized); the product is
accumulated in float32, and the clip-free SR prescale (3/4 per operand) is undone on the output
(16/9 when both operands use it), as a native GEMM's alpha would.
"""

from __future__ import annotations

import torch

from .gemm import GemmKeys
from .hadamard import hadamard_transform
from .quant import QTensor, QuantSpec, fake_quantize
from .recipe import GemmRecipe, Recipe


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


class EmulatedBackend:
    name = "emulated"

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
        aq = _operand(a, gemm.a, keys.a, gemm, signs)  # (M, K) float32
        bq = _operand(b, gemm.b, keys.b, gemm, signs)  # (N, K) float32
        out = aq @ bq.t()  # (M, N), float32 accumulation
        comp = gemm.output_scale  # undoes the clip-free SR prescale
        return out * comp if comp != 1.0 else out
