"""How the trainer compiles a model (``train.compile``): every transformer block, and the head
with its loss, as graphs of their own, compiled in place before DDP or FSDP2 wraps the model.

Why these units and this order (as torchtitan does it):

- **Compile time.** Compiling the whole model would inline every block into one graph, and
  Inductor's time grows with the graph: an 8B model's 32 blocks would compile 32 times over. Each
  block here calls the one compiled ``Block.forward``, whose graph every block with the same recipe
  shares (Dynamo's guards check shapes and the recipe, not which block): a model compiles one block
  graph per distinct block recipe (``keep_first``/``keep_last`` and ``layers`` make more), plus the
  head. Evaluation (no autograd) compiles once more for each.
- **FSDP2.** ``fully_shard`` puts hooks around each block (all-gather the block's parameters before
  its forward, free them after): the hooks run eagerly around the compiled ``forward``. A model
  compiled as a whole stops at those hooks (Dynamo does not trace them) and leaves the embedding,
  head and loss eager.
- **DDP.** DDP all-reduces a bucket of gradients as soon as the backward has produced it. With a
  compiled block, each block's backward is its own autograd node, so the all-reduce of later blocks
  overlaps the backward of earlier ones; a model compiled before DDP wraps it has one backward node
  for all of it, and every all-reduce waits for its end.
- **Fullgraph.** Each unit compiles with ``fullgraph=True``: a graph break inside a block is an
  error, not a silent slow path. The quantizers inside a block are traced into its graph on CUDA
  and are opaque ops of one node each on the CPU (``RunConfig.quantizer_graph``,
  ``backends.quant.ops``).
- **Warm compiles.** A quantized block's graph holds an autocast region (the layer leaves bf16
  autocast around its GEMMs) and a custom autograd Function: torch 2.11-2.13 do not let
  AOTAutograd's cache keep such a graph, so every later compile of it (the next cell of a study,
  a restarted worker) traced and partitioned it again (60 s against BF16's 3.4 s for the second
  native FP8 cell of the GPU check's study on an H100). ``allow_aot_cache`` opts in through
  torch's own switches: the autocast enter/exit functions as cacheable (their behaviour is their
  arguments, which are in the graph and so in the key) and custom autograd Functions (whose
  forward and backward are traced into the graph), as upstream intends to by default (pytorch
  issue 191106).

In place: a block's ``forward`` and the model's ``output`` become their compiled versions on the
instances, so parameter and buffer names, hence checkpoints, are those of the eager model. The
token embedding (one gather) stays eager. The backend is Inductor unless ``ABLATE_COMPILE_BACKEND``
names another (as ``backends.quant.torch_path.compile_backend`` reads it, for the quantizer too;
tests use ``aot_eager`` where they need only Dynamo's and AOTAutograd's tracing).
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["allow_aot_cache", "compile_model"]

AUTOCAST_REGION = (
    "torch.amp.autocast_mode._enter_autocast",
    "torch.amp.autocast_mode._exit_autocast",
)
"""What Dynamo writes into a graph for an autocast region: marked cacheable by ``allow_aot_cache``."""


def allow_aot_cache() -> None:
    """Let AOTAutograd's cache keep the graphs of quantized blocks (module docstring, "Warm
    compiles"): for this process, mark the autocast region's two functions cacheable (keyed by the
    torch version) and allow custom autograd Functions in cached graphs. A torch without either
    switch is left as it is."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    marked = getattr(inductor_config, "unsafe_marked_cacheable_functions", None)
    if isinstance(marked, dict) and not all(name in marked for name in AUTOCAST_REGION):
        mine = dict.fromkeys(AUTOCAST_REGION, torch.__version__)
        inductor_config.unsafe_marked_cacheable_functions = {**mine, **marked}
    if hasattr(functorch_config, "autograd_cache_allow_custom_autograd_functions"):
        # torch's TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=0 overrides this
        functorch_config.autograd_cache_allow_custom_autograd_functions = True


def compile_model(model: nn.Module, backend: str | None = None) -> None:
    """Compile ``model``'s blocks (``model.layers``) and head (``model.output``) in place, each
    ``fullgraph`` (module docstring). Call before DDP or FSDP2 wraps the model."""
    from backends.quant.torch_path import compile_backend

    backend = backend or compile_backend()
    blocks = getattr(model, "layers", None)
    output = getattr(model, "output", None)
    if not isinstance(blocks, nn.ModuleList) or not callable(output):
        raise TypeError(
            "train.compile: compiles a model with transformer blocks in .layers and a head "
            f"method .output; {type(model).__name__} has not both"
        )
    allow_aot_cache()
    # one function per model and unit, each with a code object of its own: Dynamo caches compiled
    # graphs, and counts recompiles against its limit (8), per code object, so models built one
    # after the other in a process (a study's cells on the local executor, a benchmark's recipes)
    # neither share that limit nor fall back to eager mode past it
    forward = _fresh(type(blocks[0]).forward)
    for block in blocks:
        setattr(block, "forward", _compiled(forward, block, backend))  # noqa: B010
    head = _fresh(getattr(type(model), "output"))  # noqa: B009
    setattr(model, "output", _compiled(head, model, backend))  # noqa: B010


def _compiled(fn: types.FunctionType, owner: nn.Module, backend: str) -> Callable[..., Any]:
    return torch.compile(types.MethodType(fn, owner), backend=backend, fullgraph=True)


_ids = itertools.count()


def _fresh(fn: Callable[..., Any]) -> types.FunctionType:
    """A copy of function ``fn`` under a code object of its own (``fn`` itself unchanged)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_compiled_{next(_ids)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def warn_slow_gemms(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Warn, once per reason, about every emulated GEMM of ``model`` that will not run in its
    device's BF16 GEMM (``backends.gemm.emulated.slow_path``), for operands of ``dtype`` (bfloat16
    under autocast). An eager model says it at its first GEMM; a compiled one cannot (a warning
    inside a graph would break it), so the trainer asks before it compiles."""
    from backends.gemm.emulated import EmulatedBackend, default_mode, slow_path, warn_slow_path
    from backends.layer import QuantLinear
    from backends.recipes import GEMMS

    for m in model.modules():
        if isinstance(m, QuantLinear) and isinstance(m.backend, EmulatedBackend):
            mode = m.backend.gemm or default_mode(device)
            for g in GEMMS:
                warn_slow_path(slow_path(m.recipe.gemm(g), device, (dtype, dtype), mode))
