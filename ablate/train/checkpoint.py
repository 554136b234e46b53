"""Checkpoints of a run: everything the next optimizer step depends on, written atomically.

``checkpoint.pt`` in the run's ``checkpoint_dir`` holds the configuration's hash, the ``TrainState``
(as its plain dict), the model (including the quantized layers' random-stream counters), the
optimizer, the data position and the CPU and CUDA RNG states. ``checkpoint.json`` beside it says
what it holds (step, status, config hash) without loading it, for the runner and ``ablate plan``.

A distributed run (``train.parallel`` ddp or fsdp: ``ablate.train.parallel``) writes a sharded
checkpoint instead, with ``torch.distributed.checkpoint`` (DCP): each rank writes its own shards of
the model and optimizer (FSDP's shards, or one copy of DDP's replicas) into
``sharded/step-<step>-<id>/`` together with its RNG states (``rng-rank<r>.pt``), and rank 0 the
``TrainState``, the data position and the configuration's hash (``train_state.pt``). Atomic per
step: the ranks write into ``<name>.tmp``, rank 0 renames it once every rank has finished, then
points the sidecar at it (``"format": "sharded"``, ``"path"``) and only then deletes older steps;
a kill at any point leaves the sidecar naming a complete checkpoint (or none).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ablate.data import BatchSampler
from ablate.train.state import TrainState

if TYPE_CHECKING:
    from ablate.train.parallel import Ranks

CHECKPOINT = "checkpoint.pt"
_SIDECAR = "checkpoint.json"
SHARDED = "sharded"


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
        **_rng_states(),
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
    info = checkpoint_info(checkpoint_dir)
    if info is not None and info.get("format") == SHARDED:
        raise ValueError(
            f"checkpoint_dir: {checkpoint_dir} holds a sharded checkpoint of a distributed run "
            f"(train.parallel: {info.get('parallel')}), but this run trains in one process; use "
            "a new checkpoint_dir"
        )
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
    _set_rng_states(ck)
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
    _write_sidecar(path.parent, info)


def remove_checkpoint(checkpoint_dir: str | Path) -> None:
    """Delete the checkpoint in ``checkpoint_dir`` (either kind), so that a run there starts from
    step 0; the sidecar goes first, so a kill midway leaves no sidecar naming a partial one."""
    d = Path(checkpoint_dir)
    (d / _SIDECAR).unlink(missing_ok=True)
    (d / CHECKPOINT).unlink(missing_ok=True)
    shutil.rmtree(d / SHARDED, ignore_errors=True)


def _rng_states() -> dict[str, Any]:
    return {
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_states(ck: dict[str, Any]) -> None:
    torch.set_rng_state(ck["rng_cpu"])
    if ck["rng_cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ck["rng_cuda"])


def _write_sidecar(checkpoint_dir: Path, info: dict[str, Any]) -> None:
    side = checkpoint_dir / _SIDECAR
    tmp = side.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, side)


def save_sharded(
    checkpoint_dir: Path,
    *,
    config_hash: str,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
    ranks: Ranks,
) -> None:
    """Every rank: write this step's sharded checkpoint (module docstring); collective."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = checkpoint_dir / SHARDED
    name = [f"step-{state.step:09d}-{uuid.uuid4().hex[:8]}" if ranks.leader else ""]
    dist.broadcast_object_list(name, src=0)  # one name for every rank's shards
    tmp = root / f"{name[0]}.tmp"
    if ranks.leader:
        tmp.mkdir(parents=True, exist_ok=True)
    ranks.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save(_rng_states(), tmp / f"rng-rank{ranks.rank}.pt")
    if ranks.leader:
        torch.save(
            {
                "config_hash": config_hash,
                "state": state.to_dict(),
                "sampler": sampler.state_dict(),
                "world": ranks.world,
                "parallel": ranks.mode,
            },
            tmp / "train_state.pt",
        )
    ranks.barrier()  # every rank's shards are on disk
    if ranks.leader:
        final = root / name[0]
        os.replace(tmp, final)
        info = {
            "step": state.step,
            "status": state.status,
            "config_hash": config_hash,
            "format": SHARDED,
            "path": f"{SHARDED}/{name[0]}",
            "world": ranks.world,
            "parallel": ranks.mode,
        }
        _write_sidecar(checkpoint_dir, info)
        for old in root.iterdir():  # older steps and any write a kill left unfinished
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    ranks.barrier()


def load_sharded(
    checkpoint_dir: Path,
    *,
    config_hash: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
    ranks: Ranks,
) -> TrainState | None:
    """Every rank: restore the sharded checkpoint the sidecar names (model and optimizer shards,
    data position, this rank's RNG states) and return its ``TrainState``; None when there is none.
    ValueError when another configuration, or another number of workers, wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    info = checkpoint_info(checkpoint_dir)
    if info is None or info.get("format") != SHARDED:
        if (checkpoint_dir / CHECKPOINT).exists():
            raise ValueError(
                f"checkpoint_dir: {checkpoint_dir} holds a one-process checkpoint, but this run "
                f"is distributed (train.parallel: {ranks.mode}); use a new checkpoint_dir"
            )
        return None
    path = checkpoint_dir / info["path"]
    ts = torch.load(path / "train_state.pt", map_location="cpu", weights_only=False)
    if ts["config_hash"] != config_hash:
        raise ValueError(
            f"checkpoint_dir: {path} was written by a different configuration "
            f"({ts['config_hash']} != {config_hash}); use a new checkpoint_dir for a new config"
        )
    if ts["world"] != ranks.world:
        raise ValueError(
            f"resources.workers: {path} was written by {ts['world']} workers, this run has "
            f"{ranks.world}"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))  # in place
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    sampler.load_state_dict(ts["sampler"])
    rng = torch.load(path / f"rng-rank{ranks.rank}.pt", map_location="cpu", weights_only=False)
    _set_rng_states(rng)
    return TrainState.from_dict(ts["state"])
