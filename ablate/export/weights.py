"""Reading a run's model weights out of its checkpoint, without building the model or starting a
process group: ``read_checkpoint`` takes either form ``ablate.train.checkpoint`` writes, the
one-process ``checkpoint.pt`` or a distributed run's sharded (``torch.distributed.checkpoint``)
folder, whose model shards are gathered into whole tensors in this process. Also the optional
``transformers`` and ``safetensors`` imports, with the error that says how to install them."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ablate.errors import ExportError
from ablate.train.checkpoint import (
    CHECKPOINT,
    SHARDED,
    TRAIN_STATE_KEYS,
    checkpoint_info,
    load_file,
)
from ablate.train.untrusted import dcp_load, dcp_metadata

_EXTRA = "pip install 'ablate[hf]'"
__all__ = [
    "ExportError",
    "RunWeights",
    "read_checkpoint",
    "safetensors_torch",
    "transformers_module",
]


def transformers_module() -> Any:
    """``transformers``, or an ``ImportError`` that says how to install it."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"export: needs the transformers package; {_EXTRA}") from e
    return transformers


def safetensors_torch() -> Any:
    """``safetensors.torch``, or an ``ImportError`` that says how to install it."""
    try:
        import safetensors.torch
    except ImportError as e:
        raise ImportError(f"export: needs the safetensors package; {_EXTRA}") from e
    return safetensors.torch


@dataclass
class RunWeights:
    """A run's model weights and what its checkpoint says about them."""

    state: dict[str, torch.Tensor]
    """The model's state dict, on the CPU, under the trainer's names."""
    step: int
    status: str | None
    """``finished`` or ``diverged``; None for a checkpoint taken while it trained (every
    ``train.checkpoint_every`` steps, or where it was stopped): ``unfinished`` in the export."""
    config_hash: str
    format: str
    """``single`` (``checkpoint.pt``) or ``sharded``."""
    evals: list[dict[str, Any]] = field(default_factory=list)
    """The validation history up to this step: ``{"step", "tokens", "val_loss"}``."""

    @property
    def val_loss(self) -> float | None:
        """The validation loss the run recorded at this checkpoint's step, if it evaluated there."""
        at = [e["val_loss"] for e in self.evals if e["step"] == self.step]
        return float(at[-1]) if at else None


def read_checkpoint(checkpoint_dir: str | Path) -> RunWeights:
    """The model weights in ``checkpoint_dir`` (a ``checkpoint.pt``, or the sharded checkpoint its
    sidecar names); ``ExportError`` when there is none."""
    d = Path(checkpoint_dir)
    info = checkpoint_info(d)
    if info is not None and info.get("format") == SHARDED:
        return _read_sharded(d / info["path"])
    path = d / CHECKPOINT if d.is_dir() else d
    if not path.is_file():
        raise ExportError(f"export: no checkpoint in {d}")
    ck = load_file(path, keys=("config_hash", "state", "model"))
    st = ck["state"]
    return RunWeights(
        state=dict(ck["model"]),
        step=int(st["step"]),
        status=st.get("status"),
        config_hash=str(ck["config_hash"]),
        format="single",
        evals=list(st.get("evals", [])),
    )


def _read_sharded(path: Path) -> RunWeights:
    """The model part of a DCP checkpoint, every shard gathered here (``no_dist``): whole tensors of
    the sizes and dtypes its metadata records are allocated, then filled by ``dcp.load``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp_metadata(path).state_dict_metadata
    model: dict[str, torch.Tensor] = {}
    for key, m in meta.items():
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata):
            model[key.removeprefix("model.")] = torch.empty(m.size, dtype=m.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load({"model": model}, path, no_dist=True)
    ts = load_file(path / "train_state.pt", keys=TRAIN_STATE_KEYS)
    st = ts["state"]
    return RunWeights(
        state=model,
        step=int(st["step"]),
        status=st.get("status"),
        config_hash=str(ts["config_hash"]),
        format="sharded",
        evals=list(st.get("evals", [])),
    )
