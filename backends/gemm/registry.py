"""The registry of GEMM backends: a name (a run's ``backend``) -> the backend that computes it.

``emulated`` (``backends/gemm/emulated.py``) and ``native`` (``backends/gemm/native.py``) are registered when
this module is imported, each by a factory that imports its module when the backend is first asked
for (a study names and checks its backend without torch); another backend plugs in the same way
with ``register_backend``. The interface a backend implements is ``backends/gemm/base.py``'s
``GemmBackend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.gemm.base import GemmBackend

_REGISTRY: dict[str, Callable[[], GemmBackend]] = {}
_INSTANCES: dict[str, GemmBackend] = {}


def register_backend(name: str, factory: Callable[[], GemmBackend]) -> None:
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> GemmBackend:
    if name not in _REGISTRY:
        raise ValueError(f"backend: unknown {name!r}; allowed: {', '.join(sorted(_REGISTRY))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]


def _emulated() -> GemmBackend:
    from backends.gemm.emulated import EmulatedBackend

    return EmulatedBackend()


def _native() -> GemmBackend:
    from backends.gemm.native import NativeBackend

    return NativeBackend()


register_backend("emulated", _emulated)
register_backend("native", _native)
