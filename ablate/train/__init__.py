"""The training loop: one run of one configuration, from a ``RunConfig`` to a ``RunResult``.
Imports torch, ``backends``, ``ablate.model`` and ``ablate.data`` only; it reports through the
``Logger`` protocol, never to a tracking library.

    from ablate.train import RunConfig, TrainConfig, train
    result = train(RunConfig(train=TrainConfig(steps=100)))

Modules, one concept each:

- ``config``: ``RunConfig``/``TrainConfig``, ``config_hash`` (a cell's identity)
  and ``flatten`` (the params a tracker records); ``result``: ``RunResult``, what a run returns
- ``resolve``: what ``auto`` and the other per-device settings mean on a device kind
- ``loop``: ``train`` and ``evaluate``; ``state``: ``TrainState``, the progress a checkpoint stores
- ``checkpoint``: atomic checkpoints, their ``checkpoint.json`` sidecar, resume; ``untrusted``:
  their files read as untrusted (tensors and plain values only, DCP's metadata checked);
  ``damage``: whether a run would set a damaged checkpoint aside, found before it loads one
- ``schedule``: the learning rate per step; ``device``: ``resolve_device`` and the autocast policy
- ``parallel``: DDP and FSDP2 over ``torch.distributed``; ``compiling``: ``torch.compile``
- ``memory``: the memory estimate of a cell; ``probe``: gradient-fidelity probes during training,
  ``probe_config``: their settings (``ProbeConfig``)
- ``phases``: precision schedules, the steps a run trains under another recipe
- ``provenance``: the code, device and precision a run records; ``logger``: the ``Logger`` protocol
- ``branch``: decay branches, the shorter budgets of a wsd run trained from its checkpoints

This ``__init__`` loads its modules on first attribute access, so that the study, which needs
the configs, does not import the training loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from ablate.train.config import RunConfig, TrainConfig
    from ablate.train.logger import Logger, MemoryLogger, NullLogger
    from ablate.train.loop import train
    from ablate.train.probe_config import ProbeConfig
    from ablate.train.result import EvalPoint, RunResult

_LAZY = {
    "EvalPoint": "ablate.train.result",
    "ProbeConfig": "ablate.train.probe_config",
    "RunConfig": "ablate.train.config",
    "RunResult": "ablate.train.result",
    "TrainConfig": "ablate.train.config",
    "Logger": "ablate.train.logger",
    "MemoryLogger": "ablate.train.logger",
    "NullLogger": "ablate.train.logger",
    "train": "ablate.train.loop",
}

__all__ = [
    "EvalPoint",
    "Logger",
    "MemoryLogger",
    "NullLogger",
    "ProbeConfig",
    "RunConfig",
    "RunResult",
    "TrainConfig",
    "train",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
