"""The shared trainer: a Llama-style model, data (an offline built-in corpus by default), and a loop
that evaluates, detects divergence and resumes exactly. Imports torch and ``backends`` only; it
reports through the ``Logger`` protocol.

    from ablate.train import RunConfig, TrainConfig, train
    result = train(RunConfig(train=TrainConfig(steps=100)))

Modules, one concept each:

- ``config``: ``RunConfig``/``TrainConfig``/``RunResult``, ``config_hash`` (a cell's identity) and
  ``flatten`` (the params a tracker records)
- ``loop``: ``train`` and ``evaluate``
- ``state``: ``TrainState``, the run's progress that a checkpoint stores
- ``checkpoint``: atomic checkpoints, their ``checkpoint.json`` sidecar (``checkpoint_info``), resume
- ``schedule``: the learning rate per step (``lr_at``)
- ``device``: ``resolve_device`` and the autocast policy
- ``data`` (its config and sources: ``corpus``, ``tokenizer``), ``prepared`` (tokenized once into
  memory-mapped files, ``load_data``; with ``tokenizing``), ``batches``, ``model``, ``logger``; ``bench`` measures
  throughput

This ``__init__`` loads its modules on first attribute access, so that the study spec, which needs
the configs, does not import the training loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import EvalPoint, RunConfig, RunResult, TrainConfig
    from .data import DataConfig
    from .logger import Logger, MemoryLogger, NullLogger
    from .loop import train
    from .model import ModelConfig
    from .prepared import TokenData, load_data

_LAZY = {
    "DataConfig": ".data",
    "TokenData": ".prepared",
    "load_data": ".prepared",
    "EvalPoint": ".config",
    "Logger": ".logger",
    "MemoryLogger": ".logger",
    "ModelConfig": ".model",
    "NullLogger": ".logger",
    "RunConfig": ".config",
    "RunResult": ".config",
    "TrainConfig": ".config",
    "train": ".loop",
}

__all__ = [
    "DataConfig",
    "TokenData",
    "load_data",
    "EvalPoint",
    "Logger",
    "MemoryLogger",
    "ModelConfig",
    "NullLogger",
    "RunConfig",
    "RunResult",
    "TrainConfig",
    "train",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
