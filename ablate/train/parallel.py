"""Data parallelism of one run: which rank this process is, how it shares the model, its slice of
every batch, and the few collectives the loop needs (``Ranks``).

A run with ``train.parallel`` ddp or fsdp trains in a ``torch.distributed`` process group of
``train.workers`` processes: Ray Train starts them for a multi-worker cell (``ablate.executor``,
NCCL on GPUs, gloo on CPUs), and ``process_group`` makes a group of one for a single process (the
distributed code path on one device). ``none`` is the plain one-process path, with no group.

How the numbers are shared, so that W workers train the run one worker would:

- **Batches.** Every rank draws the same global batch (the sampler is the same on every rank) and
  trains on its own contiguous rows: rank r of W takes rows [r B/W, (r+1) B/W) of each step's B
  sequences, in ``grad_accum`` micro-batches. The loss of each rank is the mean over its tokens, so
  the mean over ranks of their gradients (DDP's all-reduce, FSDP's reduce-scatter, both averages)
  is the gradient of the global batch's mean loss.
- **The model.** DDP (``DistributedDataParallel``, gradients all-reduced in fp32 buckets, buffers
  not broadcast: each rank's quantized layers keep their own random-stream keys) or FSDP2
  (``fully_shard`` on every transformer block and on the root; ``MixedPrecisionPolicy`` with fp32
  parameters and fp32 gradient reduction, explicitly: the bf16 compute comes from autocast, as on
  one device, so the fp32 master weights, the optimizer and the reduction are the same in every
  mode). Both start from the same initial weights on every rank (the same seed builds them).
  With ``train.fsdp_all_gather: bf16`` every linear inside a block is a ``fully_shard`` unit of
  its own with ``param_dtype=bfloat16`` (and fp32 reduction; ``cast_forward_inputs=False``: the
  linear casts its input under autocast as before), the block's unit keeping its norms fp32: the
  all-gather moves bf16, and the gathered bf16 weight is what the GEMMs read, so autocast keeps
  no second copy for the backward (FSDP2 frees the gathered storage after the forward and
  gathers it again for the backward). What it changes in the numbers: nothing, under bf16
  autocast. A linear there reads its weight's bf16 rounding either way (``nn.Linear`` through
  autocast, ``QuantLinear.forward`` by its own cast, so a recipe quantizes W from its bf16
  rounding in both, as TransformerEngine's FP8 and NVFP4 recipes do), and its weight gradient
  is rounded to bf16 on its way back in both (the bf16 GEMM output, cast to fp32 by autocast's
  cast's backward, or by FSDP2 for the fp32 reduce-scatter). Tested bit-identical to the fp32
  all-gather on the CPU. fp32 precision cannot use it (``RunConfig`` refuses it): the weights
  would be rounded to bf16 where the run computes in fp32; nor can a compiled one (each linear's
  FSDP2 hooks inside a ``fullgraph`` block are untraceable).
- **Logged values.** A step's loss and gradient norm are averaged over the ranks (one all-reduce
  of two numbers per step): every rank then holds the same values and takes the same decision
  (divergence guard, non-finite step), so no rank leaves a collective the others enter.
- **Validation.** Each evaluation batch is split by rows like a training batch; the ranks' token-
  weighted sums are added up. A rank whose slice of a short last batch is empty runs a forward on
  one row with weight 0 (FSDP's forward is a collective: every rank runs each one).
- **Quantized layers** are told their rank (``backends.layer.streams.set_rank``): see that module for
  which random streams include it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from ablate.train.config import RunConfig
from backends.layer.streams import set_rank

Mode = Literal["none", "ddp", "fsdp"]


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: ``rank`` of ``world``, sharing the model by ``mode``."""

    mode: Mode = "none"
    rank: int = 0
    world: int = 1
    all_gather: Literal["fp32", "bf16"] = "fp32"
    """FSDP2's all-gather dtype of the block linears (``train.fsdp_all_gather``)."""
    draws: Literal["per_rank", "shared"] = "per_rank"
    """Whose random streams a rank's own operands draw (``train.rank_draws``)."""

    @property
    def distributed(self) -> bool:
        return self.mode != "none"

    @property
    def leader(self) -> bool:
        """Rank 0: the one that logs and writes what is written once."""
        return self.rank == 0

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of ``x``'s first dimension (may be empty)."""
        if self.world == 1:
            return x
        return torch.tensor_split(x, self.world)[self.rank]

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the ranks (every rank gets the same value); ``t`` itself on one."""
        if self.world == 1:
            return t
        return self.sum(t) / self.world  # gloo has no AVG

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` added up over the ranks."""
        if not self.distributed or self.world == 1:
            return t
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    @contextlib.contextmanager
    def accumulating(self, model: nn.Module, *, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward: DDP reduces gradients only with the
        step's last one (``no_sync``: a replica holds its full gradients anyway); FSDP
        reduce-scatters every one, so gradients accumulate sharded (skipping it would keep the
        whole model's fp32 gradients unsharded on every device: 30 GiB at 8B)."""
        if last or self.mode != "ddp":
            yield
        else:
            with model.no_sync():  # type: ignore[operator]
                yield

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """``model`` shared by ``mode`` (DDP returns a wrapper; FSDP shards in place), with its
        quantized layers told this rank."""
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index] if device.type == "cuda" else None
            with warnings.catch_warnings():  # torch 2.13 deprecates it, and says to keep it where
                # rank-local buffers must not be synced at init until a replacement exists
                warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated")
                model = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        elif self.mode == "fsdp":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
            bf16 = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
            )
            blocks = getattr(model, "layers", None)
            if not isinstance(blocks, nn.ModuleList):
                raise TypeError("train.parallel: fsdp needs a model whose blocks are .layers")
            for block in blocks:
                if self.all_gather == "bf16":  # each linear its own unit, before its block's
                    for linear in [m for m in block.modules() if isinstance(m, nn.Linear)]:
                        fully_shard(linear, mp_policy=bf16)
                fully_shard(block, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
        if self.rank and self.draws == "per_rank":  # after DDP's broadcast of rank 0's buffers:
            # each rank's own keys (rank 0 has them from construction; nothing set here on a
            # compiled one-process model); shared: every rank keeps rank 0's
            set_rank(model, self.rank)
        return model


def ranks_of(config: RunConfig) -> Ranks:
    """This process's ``Ranks`` for ``config``: from the initialized process group, which must
    have ``train.workers`` members, for ddp and fsdp; ``Ranks()`` for none."""
    mode = config.train.resolved_parallel
    if mode == "none":
        return Ranks()
    if not dist.is_initialized():
        raise RuntimeError(
            f"train.parallel: {mode} needs a torch.distributed process group (Ray Train starts "
            "one for a multi-worker cell; `process_group` for one process)"
        )
    world = dist.get_world_size()
    if world != config.train.workers:
        raise RuntimeError(
            f"resources.workers: the run trains with {config.train.workers} workers, but its "
            f"process group has {world}"
        )
    tc = config.train
    return Ranks(mode, dist.get_rank(), world, tc.fsdp_all_gather, tc.rank_draws)


def backend_for(device: torch.device) -> str:
    """The collective backend of a device kind: NCCL on CUDA, gloo on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


@contextlib.contextmanager
def process_group(config: RunConfig, device: torch.device) -> Iterator[None]:
    """A process group of one for a ddp or fsdp run in a single process (nothing when the run is
    ``none``, or when a group exists already: Ray Train's); destroyed on exit."""
    if config.train.resolved_parallel == "none" or dist.is_initialized():
        yield
        return
    if config.train.workers != 1:
        raise RuntimeError(
            f"resources.workers: {config.train.workers} workers are started by Ray Train (the ray "
            "executor), not in this process"
        )
    if device.type == "cuda":  # NCCL's collectives (and object broadcasts) use the current GPU
        # (``cuda`` names no index: the current device, as torch.cuda.set_device will not take it)
        torch.cuda.set_device(
            device.index if device.index is not None else torch.cuda.current_device()
        )
    with tempfile.TemporaryDirectory(prefix="ablate-pg-") as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group(backend_for(device), store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
