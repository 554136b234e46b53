"""The quantized linear layer: exact nn.Linear in high precision, each GEMM equal to the
hand-composed quantize-then-matmul of its operands, model conversion and exemptions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backends import QuantLinear, QuantSpec, Recipe, convert_model, fake_quantize
from backends.layer.convert import layer_type
from backends.quant import hadamard_transform, sign_vector
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key
from backends.recipes import GEMMS, NAMED_RECIPES, GemmRecipe, HadamardSpec, named_recipe

RECIPES = {
    "mxfp4_all": Recipe.from_shorthand(GEMMS, "none"),
    "mxfp4_all_dht_fp8": Recipe.from_shorthand(GEMMS, "dht", base="fp8"),
    "mxfp4_wgrad_sr_rht64": Recipe.from_shorthand(["wgrad"], "sr+rht64", base="fp8"),
    "nvfp4_fixed_signs": Recipe.from_shorthand(["fprop", "dgrad"], "fht32", fp4_format="nvfp4"),
    "mixed_operands": Recipe(
        dgrad=GemmRecipe(a=QuantSpec(format="mxfp4", rounding="sr"), b=None),
        wgrad=GemmRecipe(a=QuantSpec(format="fp8_e5m2"), b=QuantSpec(format="mxfp8_e4m3")),
    ),
    "mx_32x32_weights_unshared": Recipe(  # 2-D W in fprop only: dgrad quantizes W^T itself
        fprop=GemmRecipe(a=QuantSpec(format="mxfp4"), b=QuantSpec(format="mxfp4", block_rows=32)),
        dgrad=GemmRecipe(a=QuantSpec(format="mxfp4"), b=QuantSpec(format="mxfp4")),
    ),
    **{name: named_recipe(name) for name in NAMED_RECIPES},
}


def _pair(in_f: int, out_f: int, recipe: Recipe, seed: int = 3) -> tuple[nn.Linear, QuantLinear]:
    torch.manual_seed(0)
    ref = nn.Linear(in_f, out_f)
    q = QuantLinear(in_f, out_f, recipe=recipe, layer_id=5, seed=seed)
    q.load_state_dict(ref.state_dict(), strict=False)
    return ref, q


@pytest.mark.parametrize("shape", [(7, 40), (2, 3, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_recipe_equals_nn_linear(shape, dtype):
    ref, q = _pair(40, 24, Recipe.bf16())
    ref, q = ref.to(dtype), q.to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ref(x1), q(x2)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    assert torch.equal(y1, y2)
    assert torch.equal(x1.grad, x2.grad)
    assert torch.equal(ref.weight.grad, q.weight.grad)
    assert torch.equal(ref.bias.grad, q.bias.grad)


def _operand(t, spec, key, h, signs):
    if spec is None:
        return (t if h is None else hadamard_transform(t, 1, h.size, signs)).float()
    had = None if h is None else (h.size, signs)  # MS-EDEN needs to know its rotation group
    return fake_quantize(t, spec, axis=1, key=key, hadamard=had, out_dtype=torch.float32)


def _expected_gemm(q: QuantLinear, gemm: str, a: torch.Tensor, b: torch.Tensor, call: int):
    """The GEMM composed by hand: Hadamard, quantize each operand, matmul in float64, compensate."""
    g = q.recipe.gemm(gemm)
    if g.high_precision:
        return a.double() @ b.double().t()
    seed, gid = int(q.sr_seed), GEMM_IDS[gemm]
    ops = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}[gemm]
    ka, kb = (derive_key(seed, q.layer_id, gid, OPERAND_IDS[o], call) for o in ops)
    h = g.hadamard
    signs = None
    if h is not None and h.vector is not None:
        signs = torch.tensor(h.vector, dtype=torch.float32)
    elif h is not None and h.signs == "random":
        signs = sign_vector(h.size, derive_key(seed, q.layer_id, gid, 0, call))
    elif h is not None and h.signs == "fixed":
        signs = sign_vector(256, derive_key(seed, q.layer_id, gid, 0))[: h.size]
    out = _operand(a, g.a, ka, h, signs).double() @ _operand(b, g.b, kb, h, signs).double().t()
    for s in (g.a, g.b):
        if s is not None and s.prescale:
            out = out / s.prescale_factor  # 3/4, or fouroversix's 16/17
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("shape", [(37, 40), (3, 11, 40)])  # dims not multiples of 32
def test_each_gemm_equals_hand_composed_quantized_matmul(recipe, shape):
    _, q = _pair(40, 50, RECIPES[recipe])
    q.train()
    x = torch.randn(*shape, requires_grad=True)
    y = q(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    x2, dy2 = x.detach().reshape(-1, 40), dy.reshape(-1, 50)
    w = q.weight.detach()
    tol = {"rtol": 1e-5, "atol": 1e-5}  # float32 accumulation order vs float64
    fprop = _expected_gemm(q, "fprop", x2, w, 0) + q.bias.detach().double()
    torch.testing.assert_close(y.detach().reshape(-1, 50).double(), fprop, **tol)
    dgrad = _expected_gemm(q, "dgrad", dy2, w.t(), 0)
    torch.testing.assert_close(x.grad.reshape(-1, 40).double(), dgrad, **tol)
    wgrad = _expected_gemm(q, "wgrad", dy2.t(), x2.t(), 0)
    torch.testing.assert_close(q.weight.grad.double(), wgrad, **tol)
    torch.testing.assert_close(q.bias.grad, dy2.sum(0))


def test_quantized_recipe_changes_every_gemm():
    ref, q = _pair(64, 64, RECIPES["mxfp4_all"])
    x = torch.randn(16, 64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(x1).sum().backward()
    q(x2).sum().backward()
    assert not torch.equal(ref(x), q(x))
    assert not torch.equal(x1.grad, x2.grad)
    assert not torch.equal(ref.weight.grad, q.weight.grad)


def test_random_streams_advance_per_training_call_and_are_saved():
    _, q = _pair(32, 32, RECIPES["mxfp4_wgrad_sr_rht64"])
    x = torch.randn(64, 32)

    def wgrad() -> torch.Tensor:
        q.zero_grad()
        q(x).sum().backward()
        return q.weight.grad.clone()

    g0, g1 = wgrad(), wgrad()
    assert int(q.calls) == 2
    assert not torch.equal(g0, g1)  # SR and random signs are redrawn per call
    state = {k: v.clone() for k, v in q.state_dict().items()}
    g2 = wgrad()
    q.load_state_dict(state)
    assert torch.equal(wgrad(), g2)  # resuming from the saved call counter reproduces the draw
    with torch.no_grad():
        q(x)
    assert int(q.calls) == 3  # no-grad forwards do not advance the streams


def test_autocast_bf16_runs_quantized_gemms_in_float32_and_returns_bf16():
    _, q = _pair(32, 16, RECIPES["mxfp4_all"])
    x = torch.randn(8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = q(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert q.weight.grad is not None and q.weight.grad.dtype == torch.float32


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(16, 16)
        self.w2 = nn.Linear(16, 16, bias=False)


class _Tiny(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 16)
        self.layers = nn.ModuleList(_Block() for _ in range(n))
        self.lm_head = nn.Linear(16, 10)


def test_convert_model_keeps_head_and_exempt_blocks_in_high_precision():
    model = _Tiny()
    recipe = Recipe.from_shorthand(GEMMS, "dht", keep_first=1, keep_last=1)
    names = convert_model(model, recipe, seed=7)
    assert names == [f"layers.{i}.{n}" for i in range(4) for n in ("wq", "w2")]
    assert type(model.lm_head) is nn.Linear and isinstance(model.embed, nn.Embedding)
    recipes = [model.layers[i].wq.recipe for i in range(4)]
    assert [r.high_precision for r in recipes] == [True, False, False, True]
    assert recipes[1].short() == "mxfp4[fprop,dgrad,wgrad]+dht16/bf16/keep1,1"
    ids = [m.layer_id for m in model.modules() if isinstance(m, QuantLinear)]
    assert ids == list(range(8))
    assert "recipe=mxfp4[fprop,dgrad,wgrad]+dht16/bf16/keep1,1" in repr(model.layers[1].wq)


def test_fixed_signs_are_buffers_saved_with_the_model():
    model = _Tiny(2)
    convert_model(model, Recipe.from_shorthand(GEMMS, "fht"), seed=1)
    sd = model.state_dict()
    assert sd["layers.0.wq.hadamard_signs"].shape == (3, 256)
    assert not torch.equal(sd["layers.0.wq.hadamard_signs"], sd["layers.1.wq.hadamard_signs"])


def test_bad_recipe_input_is_refused_with_allowed_values():
    with pytest.raises(ValueError, match="allowed: fprop, dgrad, wgrad"):
        Recipe.from_shorthand(["fprop", "wgard"])
    with pytest.raises(ValueError, match="allowed: none, sr, rht, dht, fht"):
        Recipe.from_shorthand(["wgrad"], "hadamard")
    with pytest.raises(ValueError, match="allowed: 16, 32, 64, 128, 256"):
        Recipe.from_shorthand(["wgrad"], "rht24")
    with pytest.raises(ValueError, match="allowed: mxfp4, nvfp4"):
        Recipe.from_shorthand(["wgrad"], fp4_format="mxfp8_e4m3")
    with pytest.raises(ValueError, match="high precision"):
        Recipe.from_shorthand(["wgrad"], "sr", apply_to=["fprop"])
    with pytest.raises(ValueError, match="allowed: emulated"):
        QuantLinear(4, 4, backend="cuda-magic")
    with pytest.raises(ValueError, match="needs both operands quantized"):
        GemmRecipe(a=QuantSpec(format="mxfp4"), hadamard=HadamardSpec(size=16))


def test_recipe_round_trips_through_dict():
    for r in RECIPES.values():
        assert Recipe.from_dict(r.to_dict()) == r
    sel = RECIPES["nvidia_nvfp4"].select(keep_last=1, layer_types=["mlp"], blocks=[0, -1])
    assert Recipe.from_dict(sel.to_dict()) == sel


# --- 2-D weight blocks: one quantization of W for fprop and dgrad -------------------------------


def test_two_d_weights_are_quantized_once_and_dgrad_uses_the_forward_quantization():
    # SR on W makes the point: a second quantization (dgrad's own key) would draw other values
    w_spec = QuantSpec(format="nvfp4", block_rows=16, rounding="sr")
    x_spec = QuantSpec(format="nvfp4")
    recipe = Recipe(fprop=GemmRecipe(a=x_spec, b=w_spec), dgrad=GemmRecipe(a=x_spec, b=w_spec))
    _, q = _pair(48, 40, recipe)
    assert q.shares_weight_quantization
    q.train()
    x = torch.randn(20, 48, requires_grad=True)
    y = q(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    seed, w = int(q.sr_seed), q.weight.detach()
    kw = derive_key(seed, q.layer_id, GEMM_IDS["fprop"], OPERAND_IDS["w"], 0)
    kdy = derive_key(seed, q.layer_id, GEMM_IDS["dgrad"], OPERAND_IDS["dy"], 0)
    wq = fake_quantize(w, w_spec, axis=1, key=kw)  # the forward's one quantization of W
    expect = fake_quantize(dy, x_spec, axis=1, key=kdy).double() @ wq.double()
    torch.testing.assert_close(x.grad.double(), expect, rtol=1e-5, atol=1e-5)
    kw_dgrad = derive_key(seed, q.layer_id, GEMM_IDS["dgrad"], OPERAND_IDS["w"], 0)
    own = fake_quantize(w.t(), w_spec, axis=1, key=kw_dgrad)  # what an unshared dgrad would use
    assert not torch.equal(own, wq.t())


def test_weights_are_shared_only_with_equal_2d_specs_and_no_rotation():
    nv = named_recipe("nvidia_nvfp4")
    assert QuantLinear(32, 32, recipe=nv).shares_weight_quantization
    for r in (
        RECIPES["mx_32x32_weights_unshared"],
        named_recipe("quartet"),
        Recipe.from_shorthand(GEMMS, "none", fp4_format="nvfp4"),
    ):
        assert not QuantLinear(32, 32, recipe=r).shares_weight_quantization


# --- layer selection -------------------------------------------------------------------------------


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(16, 16)


class _FF(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(16, 16)


class _TypedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = _Attn()
        self.feed_forward = _FF()
        self.gate = nn.Linear(16, 16)  # neither type


class _Typed(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_TypedBlock() for _ in range(n))
        self.lm_head = nn.Linear(16, 10)


def _quantized(model: nn.Module) -> set[str]:
    return {
        n
        for n, m in model.named_modules()
        if isinstance(m, QuantLinear) and not m.recipe.high_precision
    }


def test_layer_type_reads_the_path():
    assert layer_type("layers.3.attention.wq") == "attention"
    assert layer_type("model.layers.0.self_attn.q_proj") == "attention"
    assert layer_type("layers.3.feed_forward.w2") == "mlp"
    assert layer_type("model.layers.0.mlp.down_proj") == "mlp"
    assert layer_type("layers.0.gate") is None and layer_type("mlp") is None


@pytest.mark.parametrize(
    ("select", "expect"),
    [
        ({"layer_types": ["mlp"]}, {f"layers.{i}.feed_forward.w1" for i in range(4)}),
        (
            {"layer_types": ["attention"], "blocks": [0, -1]},
            {"layers.0.attention.wq", "layers.3.attention.wq"},
        ),
        ({"blocks": [1]}, {"layers.1.attention.wq", "layers.1.feed_forward.w1", "layers.1.gate"}),
        (
            {"keep_first": 1, "keep_last": 2, "layer_types": ["attention", "mlp"]},
            {"layers.1.attention.wq", "layers.1.feed_forward.w1"},
        ),
    ],
)
def test_layer_selection_by_type_and_block(select, expect):
    model = _Typed()
    recipe = Recipe.from_shorthand(GEMMS, "none").select(**select)
    convert_model(model, recipe)
    assert _quantized(model) == expect


def test_selection_labels_and_block_range():
    r = named_recipe("nvidia_nvfp4").select(keep_last=2, layer_types=["mlp"], blocks=[0, -1])
    assert r.short() == "nvidia_nvfp4/keep0,2/mlp/blocks0,-1"
    with pytest.raises(ValueError, match=r"layers.blocks\[1\]: block 4 does not exist .* -4 to 3"):
        convert_model(_Typed(), r.select(blocks=[0, 4]))
    with pytest.raises(ValueError, match="allowed: attention, mlp"):
        Recipe(layer_types=("attn",))
