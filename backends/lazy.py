"""How a package's index loads its modules on first use (PEP 562), for every index of ablate and
backends that does: a study is checked, and the torch-free vocabulary imported, without torch.

An index keeps three things that say the same names: the imports under ``if TYPE_CHECKING:`` (what
mypy reads), the table of name -> module (what Python loads), and ``__all__``; ``tests/
test_indexes.py`` holds the three equal. It binds the function this module makes only where mypy
does not look::

    if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
        __getattr__ = lazy_getattr(__name__, _LAZY)

A module-level ``__getattr__`` that mypy sees makes any name of the package ``Any`` to it, so a
misspelt import would pass the type check and fail only when it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_getattr(
    package: str, table: Mapping[str, str], rooms: Iterable[str] = ()
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``'s index: a name of ``table`` imports its module
    (absolute, or relative to ``package``) and gives that module's object; a name of ``rooms``
    gives the subpackage itself (``import backends; backends.quant``); any other name raises the
    AttributeError Python's own lookup would."""
    subpackages = frozenset(rooms)

    def __getattr__(name: str) -> Any:
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    return __getattr__
