"""Checkpoints of a run: everything the next optimizer step depends on, written atomically.

``checkpoint.pt`` in the run's ``checkpoint_dir`` holds the configuration's hash, the ``TrainState``
(as its plain dict), the model (including the quantized layers' random-stream counters), the
optimizer, the data position and the CPU and CUDA RNG states. ``checkpoint.json`` beside it says
what it holds (step, status, config hash) without loading it, for the runner and ``ablate plan``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .batches import BatchSampler
from .state import TrainState

CHECKPOINT = "checkpoint.pt"
_SIDECAR = "checkpoint.json"


def checkpoint_info(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """{"step", "status", "config_hash"} of the checkpoint in ``checkpoint_dir``, or None."""
    try:
        info: dict[str, Any] = json.loads((Path(checkpoint_dir) / _SIDECAR).read_text())
    except (OSError, ValueError):
        return None
    return info


def save_checkpoint(
    checkpoint_dir: Path,
    *,
    config_hash: str,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
) -> None:
    """Write ``checkpoint.pt`` and its sidecar in ``checkpoint_dir`` (created if missing)."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    obj = {
        "config_hash": config_hash,
        "state": state.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    _atomic_save(checkpoint_dir / CHECKPOINT, obj)


def load_checkpoint(
    checkpoint_dir: Path,
    *,
    config_hash: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
) -> TrainState | None:
    """Restore model, optimizer, sampler and RNG states from the checkpoint in ``checkpoint_dir``
    and return its ``TrainState``; None (and nothing restored) when there is no checkpoint.
    ValueError when a different configuration wrote it."""
    path = checkpoint_dir / CHECKPOINT
    if not path.exists():
        return None
    # on the CPU: the RNG states must stay CPU tensors (torch.set_rng_state refuses CUDA ones), and
    # load_state_dict moves the model's and the optimizer's tensors to their parameters' device
    ck = torch.load(path, map_location="cpu", weights_only=False)
    if ck["config_hash"] != config_hash:
        raise ValueError(
            f"checkpoint_dir: {path} was written by a different configuration "
            f"({ck['config_hash']} != {config_hash}); use a new checkpoint_dir for a new config"
        )
    model.load_state_dict(ck["model"])
    optimizer.load_state_dict(ck["optimizer"])
    sampler.load_state_dict(ck["sampler"])
    torch.set_rng_state(ck["rng_cpu"])
    if ck["rng_cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ck["rng_cuda"])
    return TrainState.from_dict(ck["state"])


def rekey_checkpoint(checkpoint_dir: Path, config_hash: str) -> bool:
    """Record a new config hash in the checkpoint in ``checkpoint_dir`` (``ablate adopt``: the same
    training under a key that now also names its device and precision); False when there is none."""
    path = checkpoint_dir / CHECKPOINT
    if not path.exists():
        return False
    ck = torch.load(path, map_location="cpu", weights_only=False)
    ck["config_hash"] = config_hash
    _atomic_save(path, ck)
    return True


def _atomic_save(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: a reader sees the old or the new checkpoint, never half of one
    # a small sidecar that says what the checkpoint holds without loading it (runner, `ablate plan`)
    st = obj["state"]
    info = {"step": st["step"], "status": st["status"], "config_hash": obj["config_hash"]}
    side = path.with_suffix(".json")
    side.with_suffix(".json.tmp").write_text(json.dumps(info))
    os.replace(side.with_suffix(".json.tmp"), side)
