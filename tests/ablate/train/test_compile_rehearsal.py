"""A CPU rehearsal of how a cell trains on a GPU: the trainer's own step (``loop._Run``), compiled
per block and head with ``fullgraph`` (``ablate.train.compiling``), under bf16 autocast with the
emulated backend's BF16 GEMM path (``ABLATE_EMULATED_GEMM=bf16``) and fused AdamW, in one process
and under DDP and FSDP2 (process groups of one, gloo), native FP8 through the CPU's
``torch._scaled_mm``.

Pinned per step: the graphs compiled (the first step compiles one graph for all blocks, which share
a recipe, and one for the head; later steps compile nothing: no recompile), no graph break (each
unit is ``fullgraph``: a break would raise), and the losses equal the eager step's within a stated
tolerance (rel 5e-3 after 2 steps; observed: at most ~1e-3): the quantizers compute the eager bits
(opaque ops on the CPU, traced inline on CUDA: ``backends.quant.ops``), so a compiled step differs
from the eager one only where the compiler fuses the high-precision arithmetic around them
(RMSNorm, RoPE, SwiGLU, the loss) and rounds its bf16 casts elsewhere, which can move an element
across a quantization boundary.

Two compilers, for the suite's time on a 2-core CPU (Inductor's C++ build of one recipe's block
takes a minute or more there):

- **Inductor**, CUDA's compiler (here its C++ code generation, at ``-O0`` and without SIMD: what is
  rehearsed is the lowering, not the CPU's speed), on one recipe that holds every kind of operation
  the main recipes put into a block's graph (``COMPOSITE``: NVFP4 with 16x16 weight tiles quantized
  once for fprop and dgrad, its FP8 block scales and tensor amaxes; stochastic rounding's keys;
  MXFP4 after a Hadamard transform with signs redrawn per call), in one process; native FP8's
  ``_scaled_mm`` under Inductor is ``tests/backends/gemm/test_native.py``'s.
- **aot_eager** (Dynamo and AOTAutograd, whose graphs, guards and recompiles Inductor gets as
  they are) on every main recipe (BF16, native FP8, MXFP4 + SR, + RHT16, + DHT16, NVFP4,
  ``nvidia_nvfp4``) in one process, and on the composite recipe under DDP and FSDP2 (what the
  wrappers change is the same for every recipe: hooks around the compiled blocks, which under
  FSDP2 see the unsharded parameters its hooks put in place, not what is inside them).

On a GPU (``make gpu-check``, marker ``gpu``) Inductor compiles every main recipe.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from ablate.data import DataConfig
from ablate.model import ModelConfig
from ablate.train import RunConfig, TrainConfig
from ablate.train.device import resolve_device
from ablate.train.logger import NullLogger
from ablate.train.loop import build_run
from ablate.train.parallel import process_group
from ablate.train.state import TrainState
from backends import QuantLinear, Recipe, named_recipe
from backends.gemm.native import NativeBackend
from backends.quant import QuantSpec, ckernel, torch_path
from backends.recipes import GEMMS, GemmRecipe, HadamardSpec

pytestmark = pytest.mark.slow

FULL = list(GEMMS)
_X, _DY = QuantSpec(format="nvfp4"), QuantSpec(format="nvfp4", rounding="sr")
_W = QuantSpec(format="nvfp4", block_rows=16)
_MX = QuantSpec(format="mxfp4", rounding="sr")
COMPOSITE = Recipe(
    fprop=GemmRecipe(a=_X, b=_W),
    dgrad=GemmRecipe(a=_DY, b=_W),  # W^T: fprop's 16x16 quantization, transposed
    wgrad=GemmRecipe(a=_MX, b=_MX, hadamard=HadamardSpec(size=16, signs="random")),
)
RECIPES = {
    "composite": lambda: COMPOSITE,
    "bf16": lambda: None,
    "fp8_native": lambda: Recipe.from_shorthand([], base="fp8"),
    "mxfp4_sr": lambda: Recipe.from_shorthand(FULL, "sr"),
    "mxfp4_rht16": lambda: Recipe.from_shorthand(FULL, "rht16"),
    "mxfp4_dht16": lambda: Recipe.from_shorthand(FULL, "dht16"),
    "nvfp4": lambda: Recipe.from_shorthand(FULL, fp4_format="nvfp4"),
    "nvidia_nvfp4": lambda: named_recipe("nvidia_nvfp4"),
}
STEPS = 2  # the first compiles, the second must not
# two blocks (one shared graph), GQA (2 query heads per KV head), every dimension a multiple of
# 32 (MX blocks) and 16 (NVFP4's 16x16 weight tiles)
MODEL = ModelConfig(
    preset=None, dim=64, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=128, max_seq_len=64
)


@pytest.fixture(autouse=True)
def _cuda_like(monkeypatch):
    monkeypatch.setenv("ABLATE_EMULATED_GEMM", "bf16")
    monkeypatch.setenv("TORCHINDUCTOR_DEBUG_COMPILE", "1")  # -O0: a fast C++ build
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):  # scalar C++: builds faster
        yield


def _cfg(name: str, parallel: str, compiled: bool, device: str) -> RunConfig:
    recipe = RECIPES[name]()
    return RunConfig(
        model=MODEL,
        data=DataConfig(val_tokens=1024),
        train=TrainConfig(
            steps=STEPS,
            batch_size=4,
            seq_len=32,
            warmup_steps=1,
            precision="bf16",
            compile=compiled,
            fused_adamw=True,
            parallel=parallel,  # type: ignore[arg-type]
        ),
        recipe=recipe if recipe is not None else Recipe.bf16(),
        # native FP8 where a GPU checks it (on the CPU: swapped in below)
        backend="native" if name == "fp8_native" and device == "cuda" else "emulated",
        device=device,
    )


def _steps(
    name: str, parallel: str, compiled: bool, device: str
) -> tuple[list[float], list[int], int]:
    """(losses, graphs compiled in each step, graph breaks) of ``STEPS`` trainer steps."""
    cfg = _cfg(name, parallel, compiled, device)
    losses, graphs = [], []
    breaks = sum(counters["graph_break"].values())
    with process_group(cfg, resolve_device(device)):
        run = build_run(cfg, NullLogger(), None)
        if name == "fp8_native" and device == "cpu":  # the CPU's _scaled_mm runs per-tensor FP8
            # (convert_model's check refuses native on a CPU, which has no device to check)
            for m in run.model.modules():
                if isinstance(m, QuantLinear):
                    m.backend = NativeBackend()
        state = TrainState()
        for _ in range(STEPS):
            # the model's graphs: Dynamo counts a quantizer plan's compiles (on CUDA) with them
            before = counters["stats"]["unique_graphs"] - torch_path.compiled_variants()
            step = run.optimizer_step(state)
            losses.append(float(step.loss))
            after = counters["stats"]["unique_graphs"] - torch_path.compiled_variants()
            graphs.append(after - before)
    return losses, graphs, sum(counters["graph_break"].values()) - breaks


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MAIN = [n for n in RECIPES if n != "composite"]
CASES = [pytest.param("composite", "none", "cpu", "inductor", id="composite-none-cpu")]
CASES += [pytest.param(n, "none", "cpu", "aot_eager", id=f"{n}-none-cpu-aot_eager") for n in MAIN]
CASES += [
    pytest.param("composite", p, "cpu", "aot_eager", id=f"composite-{p}-cpu-aot_eager")
    for p in ("ddp", "fsdp")
]
# on a GPU: Inductor (Triton) on every main recipe in one process, and each mode once (NCCL)
CASES += [
    pytest.param(n, p, "cuda", "inductor", id=f"{n}-{p}-cuda", marks=[pytest.mark.gpu, _CUDA])
    for n, p in [*((n, "none") for n in RECIPES), ("mxfp4_rht16", "ddp"), ("nvidia_nvfp4", "fsdp")]
]


@pytest.mark.parametrize(("name", "parallel", "device", "compiler"), CASES)
def test_the_compiled_step_compiles_once_and_trains_as_the_eager_one(
    name, parallel, device, compiler, monkeypatch
):
    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", compiler)
    eager, _, _ = _steps(name, parallel, compiled=False, device=device)
    compiled, graphs, breaks = _steps(name, parallel, compiled=True, device=device)
    assert graphs == [2] + [0] * (STEPS - 1)  # blocks + head, then no recompile
    assert breaks == 0
    assert compiled == pytest.approx(eager, rel=5e-3)
    if compiler == "inductor":
        # the next model compiles from AOTAutograd's cache (its autocast region and custom
        # Function allowed: ``compiling.allow_aot_cache``) and trains to the same bits
        counters["aot_autograd"].clear()
        again, graphs, _ = _steps(name, parallel, compiled=True, device=device)
        assert graphs == [2] + [0] * (STEPS - 1)
        aot = counters["aot_autograd"]
        assert (aot["autograd_cache_hit"], aot["autograd_cache_bypass"]) == (2, 0), aot
        assert again == compiled


def test_the_quantizer_compiled_per_plan_trains_eager_and_compiled_models_as_on_a_gpu(monkeypatch):
    """What CUDA runs: every quantize call on the torch path, compiled per plan, from an eager model
    and then from inside a compiled one (its opaque op). Each plan meets more variants than Dynamo's
    default limit of 8 (layouts, dtypes, dispatch keys, static then dynamic sizes); past it the
    plan's compile fails and it runs eagerly, with a warning (an error here). Forced on the CPU, the
    plans and the model compiled by ``aot_eager`` (Dynamo's guards, and so its recompiles, are the
    backend's and the device's alike). Full MXFP4 with SR passed 8 at a plan of its own."""
    name = "mxfp4_sr"
    monkeypatch.setattr(torch_path, "compile_enabled", lambda device: True)
    monkeypatch.setattr(ckernel, "usable", lambda x: False)  # the torch path, as on a GPU
    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", "aot_eager")
    before = torch_path.compiled_variants()
    eager, _, _ = _steps(name, "none", compiled=False, device="cpu")
    compiled, graphs, breaks = _steps(name, "none", compiled=True, device="cpu")
    assert torch_path.compiled_variants() > before  # the plans did compile
    assert graphs == [2] + [0] * (STEPS - 1) and breaks == 0
    assert compiled == pytest.approx(eager, rel=5e-3)
