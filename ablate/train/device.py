"""Where a run executes and in what precision: ``resolve_device`` turns ``RunConfig.device`` into a
``torch.device``, and ``autocast`` is the mixed-precision policy of ``train.precision``."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from .config import Precision, resolved_precision


def resolve_device(name: str) -> torch.device:
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``; ValueError naming
    the ``device`` field for an unknown name or a CUDA device that is not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device: unknown {name!r}; allowed: auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but no CUDA device is available; use cpu")
    return dev


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[Any]:
    """The context of one forward pass: bfloat16 autocast for ``bf16``, and for ``auto`` on a CUDA
    device (``config.resolved_precision``, the rule the cell key records); float32 otherwise."""
    if resolved_precision(precision, device.type) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
