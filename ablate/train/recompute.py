"""Activation checkpointing per transformer block that keeps every random stream
(``train.activation_checkpointing: blocks``).

A checkpointed block keeps only its input in the forward; the backward runs the block's forward
again to rebuild what it needs. A plain ``torch.utils.checkpoint`` would be silently wrong here:
each ``QuantLinear`` training call takes its call index from ``ablate::next_call``, which advances
the layer's counter, so the recomputed forward would draw the *next* call's stochastic rounding and
random Hadamard signs (and dgrad/wgrad, keyed by the saved index, the next call's too).

So the checkpoint is *selective* (``create_selective_checkpoint_contexts``) with one rule:
``ablate::next_call`` is saved (``MUST_SAVE``) and everything else recomputed. In the recompute
the op does not run again: it returns the index it returned in the forward, and the counter is not
advanced a second time. Every key of the recomputed forward, and of the backward, is then the
original's, so the recomputed activations are bit for bit those that produced the loss, and a run
with checkpointing equals one without (tests: SR and random Hadamard on all three GEMMs, one
process, DDP, FSDP2, gradient accumulation, resume, compiled). No other state enters a call's
numbers: NVFP4's per-tensor scale is computed from the tensor at hand, not kept.

The same rule holds under ``torch.compile``: the checkpoint becomes a higher-order op whose saved
``next_call`` output the backward graph reads. FSDP2 shards each block after it is wrapped here
(the recompute runs inside the block's backward, after FSDP has all-gathered its parameters).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import backends.linear  # noqa: F401  (registers ablate::next_call)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op is torch.ops.ablate.next_call.default:
        return CheckpointPolicy.MUST_SAVE  # the call index: never drawn again
    return CheckpointPolicy.PREFER_RECOMPUTE


_CONTEXTS = functools.partial(create_selective_checkpoint_contexts, _policy)


def checkpointed(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """``fn(*args)``, its activations recomputed in the backward with the forward's call indices."""
    out: torch.Tensor = checkpoint(fn, *args, use_reentrant=False, context_fn=_CONTEXTS)
    return out


def set_checkpointing(model: torch.nn.Module, mode: str) -> None:
    """Switch ``model``'s transformer blocks (``model.layers``) to checkpointing (``blocks``) or
    not (``none``); before ``torch.compile`` and before DDP or FSDP2 wrap the model."""
    if mode not in ("none", "blocks"):
        raise ValueError(f"train.activation_checkpointing: unknown {mode!r}; allowed: none, blocks")
    blocks = getattr(model, "layers", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise TypeError(
            f"train.activation_checkpointing: needs transformer blocks in .layers; "
            f"{type(model).__name__} has none"
        )
    for block in blocks:
        setattr(block, "checkpointing", mode == "blocks")  # noqa: B010  (a Block attribute)
