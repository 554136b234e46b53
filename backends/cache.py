"""Where ablate keeps what it builds once per machine: the C quantization kernel, the native GEMM
self-check, the built-in corpus and the empty MLflow store template.

``cache_dir()`` is ``$ABLATE_CACHE_DIR``, else ``~/.cache/ablate``; an empty ``ABLATE_CACHE_DIR``
counts as unset (as an empty ``ABLATE_DATA_CACHE`` does), never as the current folder. Every
reader of the variable reads it here: ``backends`` (which imports nothing of ``ablate``) and
``ablate`` alike.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ABLATE_CACHE_DIR"


def cache_dir() -> Path:
    """``$ABLATE_CACHE_DIR``, else ``~/.cache/ablate``; an empty one counts as unset."""
    if given := os.environ.get(ENV):
        return Path(given)
    return Path.home() / ".cache" / "ablate"
