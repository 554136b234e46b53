"""The ``ABLATE_*`` environment variables that steer more than one room, read one way.

``cache_dir()`` is ``$ABLATE_CACHE_DIR``, where ablate keeps what it builds once per machine (the
C quantization kernel, the native GEMM self-check, the built-in corpus, the empty MLflow store
template), else ``~/.cache/ablate``; an empty value counts as unset (as an empty
``ABLATE_DATA_CACHE`` does), never as the current folder. Every reader of the variable reads it
here: ``backends`` (which imports nothing of ``ablate``) and ``ablate`` alike.

The switches, whose values form a closed set: ``choice`` reads one: unset (or empty) gives the
reader's default, a value the reader allows gives itself, any other raises ``ValueError`` naming the
variable and what it allows. ``flag`` reads an on/off switch: ``1``, ``true``, ``yes``, ``on``
(``ON``) and ``0``, ``false``, ``no``, ``off`` (``OFF``), in any case; any other value is refused,
so that ``false`` never means on. ``truthy`` reads a variable another tool owns (``HF_HUB_OFFLINE``)
as that tool does: one of ``ON`` is on, anything else off. Each reader keeps its variable's name and
values beside the code it steers and exposes a ``check_env`` that reads it
(``backends.gemm.emulated``: ``ABLATE_EMULATED_GEMM``; ``backends.quant.torch_path``:
``ABLATE_COMPILE``, and ``ABLATE_COMPILE_BACKEND``, read by ``text`` and checked against torch's
compile backends; ``backends.quant.ops``: ``ABLATE_QUANT_OPS``; ``backends.quant.ckernel``:
``ABLATE_NO_KERNEL``; ``backends.gemm.selfcheck``: ``ABLATE_NATIVE_CHECK``); ``ablate``'s preflight
calls them all before a study starts, so a typo is refused there rather than when the first cell
trains.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_DIR", "FLAG", "OFF", "ON", "cache_dir", "choice", "flag", "text", "truthy"]

CACHE_DIR = "ABLATE_CACHE_DIR"

ON = ("1", "true", "yes", "on")
"""What turns an on/off switch on (in any case)."""

OFF = ("0", "false", "no", "off")
"""What turns an on/off switch off (in any case)."""

FLAG = tuple(v for pair in zip(OFF, ON, strict=True) for v in pair)
"""What an on/off switch allows, pairwise: ``0, 1, false, true, no, yes, off, on``."""


def choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    """The value of the environment variable ``name``: ``default`` when unset or empty, else one
    of ``allowed``; any other value raises ``ValueError`` naming ``name`` and ``allowed``."""
    value = os.environ.get(name, "")
    if not value:
        return default
    if value not in allowed:
        raise ValueError(
            f"environment variable {name}: unknown {value!r}; allowed: {', '.join(allowed)} "
            "(or unset)"
        )
    return value


def flag(name: str, default: bool) -> bool:
    """The on/off switch ``name``: one of ``ON`` or ``OFF`` in any case, ``default`` when unset or
    empty; any other value raises ``ValueError`` naming ``name`` and ``FLAG``."""
    value = os.environ.get(name, "")
    if not value:
        return default
    if value.lower() in ON:
        return True
    if value.lower() in OFF:
        return False
    raise ValueError(
        f"environment variable {name}: unknown {value!r}; allowed: {', '.join(FLAG)} in any case "
        "(or unset)"
    )


def text(name: str, default: str) -> str:
    """The value of the environment variable ``name``, ``default`` when unset or empty (for a
    variable whose reader checks the value itself)."""
    return os.environ.get(name) or default


def truthy(value: str | None) -> bool:
    """Whether ``value`` (an environment variable's, None when unset) is one of ``ON`` in any case;
    anything else is off. For a variable another tool reads this way too (``HF_HUB_OFFLINE``)."""
    return (value or "").lower() in ON


def cache_dir() -> Path:
    """``$ABLATE_CACHE_DIR``, else ``~/.cache/ablate``; an empty one counts as unset."""
    if given := os.environ.get(CACHE_DIR):
        return Path(given)
    return Path.home() / ".cache" / "ablate"
