"""The GEMM backend interface: what a backend is, the keys of one GEMM call, and its refusal.

This module owns the interface every GEMM backend implements (``GemmBackend``), the random-stream
keys passed to each call (``GemmKeys``) and the error a backend raises for a format it cannot run
(``UnsupportedFormatError``). It imports no backend: ``emulated`` and ``native`` implement it, and
``registry`` names them.

A backend computes ``a @ b^T`` for one GEMM of a linear layer, both operands reduced over their last
dimension, from the high-precision operands and the GEMM's recipe (it quantizes them itself, unless
one comes already quantized, so a
native backend can produce packed codes and hardware scales while ``emulated`` dequantizes and
multiplies in FP32). ``check`` runs before any training step and refuses a recipe the device cannot
run, naming the device, the format and what the device supports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from backends.quant import QTensor
from backends.recipes import GemmRecipe, Recipe


@dataclass(frozen=True, slots=True)
class GemmKeys:
    """Random-stream keys of one GEMM call: per operand for SR, and for random Hadamard signs;
    ints, or () int64 tensors on the device (the training step derives them there)."""

    a: int | torch.Tensor
    b: int | torch.Tensor
    signs: int | torch.Tensor


class GemmBackend(Protocol):
    name: str

    def check(self, recipe: Recipe, device: torch.device) -> None:
        """Raise ``UnsupportedFormatError`` if ``device`` cannot run ``recipe``."""
        ...

    def mm(
        self,
        a: torch.Tensor | QTensor,
        b: torch.Tensor | QTensor,
        gemm: GemmRecipe,
        keys: GemmKeys,
        signs: torch.Tensor | None,
    ) -> torch.Tensor:
        """``a @ b^T`` (a: (M, K), b: (N, K), possibly transposed views) as float32. An operand
        given as a ``QTensor`` is already quantized along K with the GEMM's spec for it (a weight
        quantized once for fprop and dgrad); the backend multiplies those codes as they are."""
        ...


class UnsupportedFormatError(RuntimeError):
    """A backend cannot run a format on a device."""
