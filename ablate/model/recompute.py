"""Activation checkpointing per transformer block that keeps every random stream
(``train.activation_checkpointing: blocks``).

A checkpointed block keeps only its input in the forward; the backward runs the block's forward
again to rebuild what it needs. A plain ``torch.utils.checkpoint`` would be silently wrong here:
each ``QuantLinear`` training call takes its call index from ``ablate::next_call``, which advances
the layer's counter, so the recomputed forward would draw the *next* call's stochastic rounding and
random Hadamard signs (and dgrad/wgrad, keyed by the saved index, the next call's too).

So the recompute replays the forward's call indices. In eager mode the checkpoint's contexts are
a ``backends.layer.streams.CallTape``: the forward records the index each training call drew, and the
recompute hands the same indices, in the same order, to the same calls, without advancing any
counter. Under torch.compile the checkpoint is *selective* (``create_selective_checkpoint_contexts``)
with one rule: ``ablate::next_call`` is saved (``MUST_SAVE``) and everything else recomputed, so the
compiled recompute reads the saved index instead of running the op again (the checkpoint becomes a
higher-order op whose saved ``next_call`` output the backward graph reads). Every key of the
recomputed forward, and of the backward, is then the original's, so the recomputed activations are
bit for bit those that produced the loss, and a run with checkpointing equals one without (tests:
SR and random Hadamard on all three GEMMs, one process, DDP, FSDP2 with the fp32 and the bf16
all-gather, gradient accumulation, resume, compiled). No other state enters a call's numbers:
NVFP4's per-tensor scale is computed from the tensor at hand, not kept.

Why not the selective checkpoint in eager mode too: it counts every op the region dispatches and
requires the recompute to dispatch the same ones, and FSDP2's hooks do not (with
``train.fsdp_all_gather: bf16`` each linear is a unit of its own inside the block, whose
all-gathers run again in the recompute for the linears whose backward has not started, and not for
the one whose has); it also runs a Python dispatch mode over every op of the forward and the
recompute. The tape has neither cost. FSDP2 shards each block after it is wrapped here (the
recompute runs inside the block's backward, after FSDP has all-gathered its parameters).
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

from backends.layer.streams import CallTape  # (and registers ablate::next_call)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op is torch.ops.ablate.next_call.default:
        return CheckpointPolicy.MUST_SAVE  # the call index: never drawn again
    return CheckpointPolicy.PREFER_RECOMPUTE


_CONTEXTS = functools.partial(create_selective_checkpoint_contexts, _policy)


def checkpointed(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """``fn(*args)``, its activations recomputed in the backward with the forward's call indices
    (module docstring: a ``CallTape`` in eager mode, a selective checkpoint when compiled)."""
    if torch.compiler.is_compiling():
        context: Callable[[], Any] = _CONTEXTS
    else:
        tape = CallTape()

        def context() -> tuple[Any, Any]:
            return tape.recording(), tape.replaying()

    out: torch.Tensor = checkpoint(fn, *args, use_reentrant=False, context_fn=context)
    return out


class CheckpointedBlock(torch.nn.Module):
    """A transformer block that ``set_checkpointing`` switches: ``forward(x, cos, sin)`` runs the
    subclass's ``_forward``, through ``checkpointed`` while ``checkpointing`` is on and gradients
    are recorded. The base of ``model.Block`` and of a Hugging Face decoder layer's (``hf``)."""

    checkpointing = False
    """Recompute this block's activations in the backward (``set_checkpointing``)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpointing and torch.is_grad_enabled():
            return checkpointed(self._forward, x, cos, sin)
        return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


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
