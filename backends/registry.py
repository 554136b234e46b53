"""GEMM backends: how a quantized GEMM is computed, and the registry that names them.

A backend computes ``a @ b^T`` for one GEMM of a linear layer, both operands reduced over their last
dimension, from the high-precision operands and the GEMM's recipe (it quantizes them itself, so a
native backend can produce packed codes and hardware scales while ``emulated`` dequantizes and
multiplies in FP32). ``check`` runs before any training step and refuses a recipe the device cannot
run, naming the device, the format and what the device supports.

``emulated`` (``backends/emulated.py``) and ``native`` (``backends/native.py``) are registered here
on first use; another backend plugs in the same way with ``register_backend``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .recipe import GemmRecipe, Recipe


@dataclass(frozen=True, slots=True)
class GemmKeys:
    """Random-stream keys of one GEMM call: per operand for SR, and for random Hadamard signs."""

    a: int
    b: int
    signs: int


class GemmBackend(Protocol):
    name: str

    def check(self, recipe: Recipe, device: torch.device) -> None:
        """Raise ``UnsupportedFormatError`` if ``device`` cannot run ``recipe``."""
        ...

    def mm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        gemm: GemmRecipe,
        keys: GemmKeys,
        signs: torch.Tensor | None,
    ) -> torch.Tensor:
        """``a @ b^T`` (a: (M, K), b: (N, K), possibly transposed views) as float32."""
        ...


class UnsupportedFormatError(RuntimeError):
    """A backend cannot run a format on a device."""


_REGISTRY: dict[str, Callable[[], GemmBackend]] = {}
_INSTANCES: dict[str, GemmBackend] = {}


def register_backend(name: str, factory: Callable[[], GemmBackend]) -> None:
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def available_backends() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_backend(name: str) -> GemmBackend:
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"backend: unknown {name!r}; allowed: {', '.join(sorted(_REGISTRY))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]


def _load_builtin() -> None:
    if "emulated" not in _REGISTRY:
        from .emulated import EmulatedBackend

        register_backend("emulated", EmulatedBackend)
    if "native" not in _REGISTRY:
        from .native import NativeBackend

        register_backend("native", NativeBackend)
