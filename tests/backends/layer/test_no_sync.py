"""No host synchronisation in the training step: a quantized layer (and a converted transformer
block) compiles as one graph with ``torch.compile(fullgraph=True)``, forward and backward, with
each quantization one opaque op (``backends.quant.ops``), and computes the same bits as eagerly.

Any ``.item()``, ``int()``/``float()``/``bool()`` of a tensor, or data-dependent Python branch in the
step would be a graph break, which ``fullgraph=True`` turns into an error: on a GPU each of those is
a device-to-host synchronisation. The ``aot_eager`` backend traces forward and backward (Dynamo and
AOTAutograd) without generating code, so the compiled graph runs the same kernels as eager mode and
the results must agree bit for bit; the CPU needs no GPU for any of it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from backends import QuantLinear, QuantSpec, Recipe
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key
from backends.recipes import GEMMS, GemmRecipe, named_recipe

RECIPES = {
    # MX on all three GEMMs (the C kernel eagerly, the torch path compiled)
    "mxfp4_all": Recipe.from_shorthand(GEMMS, "none"),
    "mxfp4_all_dht_fp8": Recipe.from_shorthand(GEMMS, "dht", base="fp8"),  # fixed signs
    # SR and random signs: keys from the device-side call counter
    "mxfp4_wgrad_sr_rht64": Recipe.from_shorthand(["wgrad"], "sr+rht64", base="fp8"),
    # NVFP4's tensor scale, computed on the device
    "nvfp4_fixed_signs": Recipe.from_shorthand(["fprop", "dgrad"], "fht32", fp4_format="nvfp4"),
    "mixed_operands": Recipe(  # per-tensor FP8 and MXFP8 operands, one high-precision operand
        dgrad=GemmRecipe(a=QuantSpec(format="mxfp4", rounding="sr"), b=None),
        wgrad=GemmRecipe(a=QuantSpec(format="fp8_e5m2"), b=QuantSpec(format="mxfp8_e4m3")),
    ),
    # 2-D weight tiles shared by fprop and dgrad, the recipe's own sign vector
    "nvidia_nvfp4": named_recipe("nvidia_nvfp4"),
    # the 2026 quantizers (torch path only): 4/6 (with SR*16/17 and 16x16 tiles), MS-EDEN after
    # a random RHT128, double-block scales
    "four_over_six": named_recipe("four_over_six"),
    "nvidia_nvfp4_4over6": named_recipe("nvidia_nvfp4_4over6"),
    "quartet_ii": named_recipe("quartet_ii"),
    "tetrajet_v2": named_recipe("tetrajet_v2"),
}
SYNC_RECIPES = list(RECIPES)


def _steps(layer: torch.nn.Module, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for x in xs:
        x = x.clone().requires_grad_()
        layer.zero_grad()
        y = layer(x)
        y.backward(torch.cos(y.detach() * 3))  # a deterministic output gradient
        out += [y.detach(), x.grad, *(p.grad.clone() for p in layer.parameters())]
    return out


@pytest.mark.parametrize("name", SYNC_RECIPES)
def test_quantized_linear_compiles_as_one_graph_with_the_eager_bits(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = QuantLinear(64, 48, recipe=RECIPES[name], layer_id=2, seed=7).train()
    layer = copy.deepcopy(eager)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=False)
    xs = [torch.randn(2, 40, 64) for _ in range(3)]  # three steps: the streams advance
    expected = _steps(eager, xs)
    got = _steps(compiled, xs)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    assert int(layer.calls) == int(eager.calls) == 3


def test_a_compiled_layer_holds_each_quantization_as_one_opaque_op():
    # the GEMM backends quantize through backends.quant.ops: traced, each quantized operand is one
    # node; the quantizer's arithmetic traced inline instead is 100-200 nodes an operand (a
    # layer's forward and backward grow from about 230 nodes to about 1,250 here, a block's
    # fourfold, and its compile time with them), which the backends once did by importing the
    # plain quantizer
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, _: object) -> object:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    layer = QuantLinear(64, 48, recipe=Recipe.from_shorthand(GEMMS, "sr+rht16"), layer_id=2)
    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    compiled = torch.compile(layer.train(), fullgraph=True, backend=backend, dynamic=False)
    compiled(torch.randn(2, 40, 64, requires_grad=True)).sum().backward()
    forward, backward = ([str(n.target) for n in g.graph.nodes] for g in graphs)
    assert forward.count("ablate.fake_quantize.default") == 2  # fprop's x and w
    assert backward.count("ablate.fake_quantize.default") == 4  # dgrad's and wgrad's operands
    assert len(forward) + len(backward) < 400, (len(forward), len(backward))


def test_device_keys_equal_the_python_derivation():
    layer = QuantLinear(32, 32, recipe=RECIPES["mxfp4_wgrad_sr_rht64"], layer_id=9, seed=2**33 + 5)
    for gemm, ops in {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}.items():
        for call in (0, 1, 7, 2**32 + 3):
            k = layer.keys(gemm, torch.tensor(call))
            seed, gid = 2**33 + 5, GEMM_IDS[gemm]
            assert int(k.a) == derive_key(seed, 9, gid, OPERAND_IDS[ops[0]], call)
            assert int(k.b) == derive_key(seed, 9, gid, OPERAND_IDS[ops[1]], call)
            assert int(k.signs) == derive_key(seed, 9, gid, 0, call)
            assert layer.keys(gemm, call) == type(k)(int(k.a), int(k.b), int(k.signs))


def test_key_prefixes_follow_a_loaded_seed():
    a = QuantLinear(32, 32, recipe=RECIPES["mxfp4_wgrad_sr_rht64"], layer_id=1, seed=1)
    b = QuantLinear(32, 32, recipe=RECIPES["mxfp4_wgrad_sr_rht64"], layer_id=1, seed=2)
    assert not torch.equal(a.key_prefix, b.key_prefix)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.key_prefix, b.key_prefix)
    assert "key_prefix" not in a.state_dict() and "recipe_signs" not in a.state_dict()


def test_recipe_signs_follow_the_recipe():
    layer = QuantLinear(32, 32, recipe=named_recipe("nvidia_nvfp4"))
    h = layer.recipe.wgrad.hadamard
    assert h is not None and h.vector is not None
    assert layer.recipe_signs[2, : h.size].tolist() == list(h.vector)
    layer.recipe = Recipe.bf16()
    assert not layer.recipe_signs.any()


@pytest.mark.slow
def test_converted_block_compiles_as_one_graph():
    """A whole converted transformer block (attention, MLP, norms) under NVIDIA's NVFP4 recipe:
    forward and backward trace without a break. The forward is bit-identical to eager mode; the
    backward of the high-precision parts is decomposed by AOTAutograd, so gradients agree closely,
    not bitwise."""
    from ablate.model import ModelConfig, build_model

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="tiny"), 256, recipe=named_recipe("nvidia_nvfp4"))
    block = model.layers[0].train()
    cos, sin = (t[:32] for t in model._rope())
    x = torch.randn(2, 32, block.attention.wq.in_features)

    def step(b: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        xx = x.clone().requires_grad_()
        y = b(xx, cos, sin)
        y.square().mean().backward()
        return y.detach(), xx.grad

    twin = copy.deepcopy(block)
    y1, dx1 = step(block)
    y2, dx2 = step(torch.compile(twin, fullgraph=True, backend="aot_eager"))
    assert torch.equal(y1, y2)
    torch.testing.assert_close(dx1, dx2, rtol=1e-3, atol=1e-5)
    calls = [int(m.calls) for m in twin.modules() if isinstance(m, QuantLinear)]
    assert calls and set(calls) == {1}
