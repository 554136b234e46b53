"""Where a run executes and in what precision: ``resolve_device`` turns ``RunConfig.device`` into a
``torch.device``, ``autocast`` is the mixed-precision policy of ``train.precision``, and
``numerics_policy`` the process-wide matmul settings a run trains under.

The matmul policy is explicit, not whatever a library left behind: no TF32 anywhere (it would
round the float32 operands of the emulated backend's FP32 GEMMs, e.g. NVFP4 values carrying their
tensor scale, to 10 mantissa bits, and change emulated numerics), and no reduced-precision
reductions in BF16/FP16 GEMMs (the emulated backend multiplies exact block values in BF16 and needs
FP32 accumulation throughout). Both are cuBLAS settings; on the CPU they change nothing.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from ablate.train.config import Precision, resolved_precision
from ablate.train.resolve import check_device_name


def resolve_device(name: str) -> torch.device:
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``; ValueError naming
    the ``device`` field for an unknown name or a CUDA device that is not there."""
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but no CUDA device is available; use cpu")
    return dev


def numerics_policy() -> dict[str, object]:
    """Set the matmul policy of the module docstring; returns what it set (logged with the run)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    return {"tf32": False, "reduced_precision_reduction": False}


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[Any]:
    """The context of one forward pass: bfloat16 autocast for ``bf16``, and for ``auto`` on a CUDA
    device (``config.resolved_precision``, the rule the cell key records); float32 otherwise."""
    if resolved_precision(precision, device.type) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
