"""The GEMM backends: one GEMM of a linear layer from two high-precision operands and its recipe.

- ``base``: the interface (``GemmBackend``), the random-stream keys of one call (``GemmKeys``) and
  the refusal of a format a device cannot run (``UnsupportedFormatError``);
- ``emulated``: quantize, dequantize and multiply with FP32 accumulation, on any device;
- ``native``: the hardware's scaled GEMM (``torch.nn.functional.scaled_mm``) on the same codes
  and scales;
- ``layouts``: where each device's scaled GEMM reads its block scales (cuBLAS's 128x4 tiles,
  ROCm's row-major and hipBLASLt's pre-swizzled 32x8 tiles), as pure functions;
- ``capabilities``: which device runs which format natively, and the check before a run;
- ``selfcheck``: the native GEMMs held to the emulation before a cell trains (``ablate
  native-check``);
- ``registry``: a run's ``backend`` name to its backend.

This ``__init__`` loads its modules on first attribute access, and the registry imports a
backend's module when it is first asked for: a study names and checks its backend without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from backends.gemm.base import GemmBackend, GemmKeys, UnsupportedFormatError
    from backends.gemm.capabilities import check_recipe, supported_formats
    from backends.gemm.registry import available_backends, get_backend, register_backend

_LAZY = {
    "GemmBackend": "backends.gemm.base",
    "GemmKeys": "backends.gemm.base",
    "UnsupportedFormatError": "backends.gemm.base",
    "check_recipe": "backends.gemm.capabilities",
    "supported_formats": "backends.gemm.capabilities",
    "available_backends": "backends.gemm.registry",
    "get_backend": "backends.gemm.registry",
    "register_backend": "backends.gemm.registry",
}

__all__ = [
    "GemmBackend",
    "GemmKeys",
    "UnsupportedFormatError",
    "available_backends",
    "check_recipe",
    "get_backend",
    "register_backend",
    "supported_formats",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
