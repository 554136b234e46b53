"""What a worker process sees of CUDA, and the check a cell makes before it trains.

A Ray task sees only the GPUs it asks for (Ray sets ``CUDA_VISIBLE_DEVICES``; a task that asks for
none sees none), so a cell resolved to CUDA can land in a process without a GPU. ``run_one`` calls
``check_worker_device`` first: such a cell fails at once with an error naming the cell, its device,
what the process sees and the fix, instead of training on the CPU or failing deep in CUDA. What the
process trained on is recorded beside the run's other provenance (``placement``).

Kept out of ``ablate/train`` on purpose: nothing here changes a number a run computes, so it is
not part of the training code's hash (``train.provenance.code_hash``).
"""

from __future__ import annotations

import os

from ablate.errors import CannotRunError


def cuda_seen() -> str:
    """What this process sees of CUDA, in words for messages: how many devices (or a torch built
    without CUDA) and ``CUDA_VISIBLE_DEVICES``."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    env = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"
    if torch.version.cuda is None and torch.version.hip is None:
        return f"torch {torch.__version__} is built without CUDA, {env}"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"{n} CUDA device{'' if n == 1 else 's'}, {env}"


def cuda_index(device: str) -> int | None:
    """N of ``cuda:N``, 0 for ``cuda``, None for any other device."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0


def check_worker_device(device: str, label: str) -> None:
    """Raise ``CannotRunError`` when ``device`` (a resolved ``RunConfig.device``) is CUDA and this
    process has no such device; a CPU device passes."""
    import torch

    index = cuda_index(device)
    if index is None:
        return
    if torch.cuda.is_available() and index < torch.cuda.device_count():
        return
    raise CannotRunError(
        f"cell {label}: device {device}, but this worker sees no such CUDA device ({cuda_seen()}); "
        "a Ray task sees only the GPUs it asks for, numbered from 0: set resources.gpus: 1 (GPUs "
        "per cell), run where torch has CUDA, or set device: cpu to train on CPUs"
    )


def placement(device: str) -> dict[str, str]:
    """Where this process trains a run of ``device``, for its ``env.*`` tags: ``torch_device``
    with its index (``cuda:0``, ``cpu``) and, on CUDA, ``cuda_visible_devices`` (the GPUs Ray gave
    the task; ``unset`` outside Ray)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    index = cuda_index(device)
    if index is None:
        return {"torch_device": "cpu"}
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
    return {
        "torch_device": f"cuda:{index}",
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
    }
