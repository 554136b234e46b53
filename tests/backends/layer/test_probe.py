"""Gradient-fidelity probes on synthetic operands with known answers: RNE errs identically across
draws and steps, SR is unbiased, a random Hadamard redrawn per call decorrelates the error while a
deterministic one keeps it, a Hadamard cancels exactly in the product, and the operand statistics
count what they say."""

from __future__ import annotations

import math

import pytest
import torch

from backends import QuantLinear, QuantSpec, Recipe
from backends.layer.probe import (
    REDRAW_STRIDE,
    ErrorHistory,
    GemmCall,
    capture,
    draws_for,
    gemm_operand_stats,
    is_random,
    operand_stats,
    probe_gemm,
    redraw,
    signs_of,
)
from backends.quant import QTensor, hadamard_transform, quantize, sign_vector
from backends.recipes import GEMMS, GemmRecipe, named_recipe


def _layer(intervention: str = "none", **kw) -> QuantLinear:
    recipe = Recipe.from_shorthand(GEMMS, intervention, **kw)
    return QuantLinear(256, 96, bias=False, recipe=recipe, layer_id=3, seed=7)


def _call(layer: QuantLinear, a: torch.Tensor, b: torch.Tensor, call: int, gemm="fprop"):
    """A GemmCall as training would have captured it at ``call``."""
    return GemmCall.of(layer, gemm, a, b, call, layer.run_gemm(gemm, a, b, call))


@pytest.fixture
def ab() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(128, 256, generator=g), torch.randn(96, 256, generator=g)


def test_capture_records_every_gemm_as_the_backend_saw_it_and_changes_nothing():
    torch.manual_seed(0)
    layer = _layer("sr+rht")
    x = torch.randn(4, 32, 256)
    dy = torch.randn(4, 32, 96)

    def step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xx = x.clone().requires_grad_()
        layer.zero_grad()
        y = layer(xx)
        y.backward(dy)
        return y.detach(), xx.grad, layer.weight.grad.clone()

    state = {k: v.clone() for k, v in layer.state_dict().items()}
    plain = step()
    layer.load_state_dict(state)
    with capture({"l": layer}) as calls:
        probed = step()
    assert layer.gemm_hook is None  # removed on exit
    for p, q in zip(plain, probed, strict=True):
        assert torch.equal(p, q)  # the hook changes nothing
    got = calls["l"]
    assert [c.gemm for c in got] == ["fprop", "dgrad", "wgrad"]
    assert all(c.call == 0 for c in got)
    fprop, dgrad, wgrad = got
    assert torch.equal(fprop.a, x.reshape(-1, 256)) and torch.equal(fprop.b, layer.weight)
    assert torch.equal(dgrad.a, dy.reshape(-1, 96)) and torch.equal(dgrad.b, layer.weight.t())
    assert torch.equal(wgrad.a, dy.reshape(-1, 96).t()) and torch.equal(
        wgrad.b, x.reshape(-1, 256).t()
    )
    assert torch.equal(fprop.out, plain[0].reshape(-1, 96))  # the output training computed
    assert torch.equal(wgrad.out, plain[2])
    # draw 0 is the captured output; a redraw is the layer's GEMM on another stream
    assert redraw(layer, wgrad, 0) is wgrad.out
    r1 = redraw(layer, wgrad, 1)
    assert torch.equal(r1, layer.run_gemm("wgrad", wgrad.a, wgrad.b, REDRAW_STRIDE))
    assert not torch.equal(r1, wgrad.out)
    assert int(layer.calls) == 1  # redraws advance nothing


@pytest.mark.parametrize(
    "recipe",
    [
        Recipe.from_shorthand(GEMMS, "none"),
        Recipe.from_shorthand(GEMMS, "sr+rht32"),
        Recipe.from_shorthand(GEMMS, "dht"),
        Recipe.from_shorthand(GEMMS, "fht64", fp4_format="nvfp4"),
        Recipe.from_shorthand(["wgrad"], "sr", base="fp8"),
        named_recipe("nvidia_nvfp4"),  # the recipe's own sign vector on wgrad
        named_recipe("four_over_six"),  # 4/6 with SR*16/17 on dy
        named_recipe("quartet_ii"),  # MS-EDEN after RHT128
        named_recipe("tetrajet_v2"),  # double-block scales
    ],
    ids=lambda r: r.short(),
)
@pytest.mark.parametrize("gemm", GEMMS)
def test_operand_statistics_see_the_operands_the_layer_quantizes(recipe, gemm):
    """The operand path (keys, Hadamard signs) reproduces the layer's GEMM: wrong keys or signs
    would differ by the quantization error (~10%), not by float32 rounding."""
    layer = QuantLinear(64, 48, bias=False, recipe=recipe, layer_id=2, seed=5)
    g = torch.Generator().manual_seed(1)
    shapes = {
        "fprop": ((40, 64), (48, 64)),
        "dgrad": ((40, 48), (64, 48)),
        "wgrad": ((48, 40), (64, 40)),
    }
    (sa, sb) = shapes[gemm]
    a, b = torch.randn(*sa, generator=g), torch.randn(*sb, generator=g)
    gr, call = recipe.gemm(gemm), 9
    keys = layer.keys(gemm, call)
    h = gr.hadamard
    had = None if h is None else (h.size, signs_of(layer, gemm, call))

    def deq(t, spec, key):
        if spec is None:
            return t.float() if h is None else hadamard_transform(t, 1, h.size, had[1])
        return quantize(t, spec, axis=1, key=key, hadamard=had).dequantize()

    mine = deq(a, gr.a, keys.a) @ deq(b, gr.b, keys.b).t() * gr.output_scale
    torch.testing.assert_close(mine, layer.run_gemm(gemm, a, b, call), rtol=1e-5, atol=1e-5)
    stats = gemm_operand_stats(layer, [GemmCall.of(layer, gemm, a, b, call, mine)], "a")
    assert (stats is None) == (gr.a is None)


def test_a_shared_2d_weight_quantization_is_probed_against_the_high_precision_weight():
    """NVIDIA's NVFP4 recipe quantizes W once in 16x16 tiles for fprop and dgrad: the captured b is
    that quantization (a QTensor), the exact GEMM uses the layer's W, and W's statistics come from
    the shared quantization (its tiles' utilisation)."""
    torch.manual_seed(0)
    layer = QuantLinear(64, 48, bias=False, recipe=named_recipe("nvidia_nvfp4"), seed=2)
    assert layer.shares_weight_quantization
    x = torch.randn(32, 64, requires_grad=True)
    with capture({"l": layer}) as calls:
        layer(x).backward(torch.randn(32, 48))
    fprop, dgrad, wgrad = calls["l"]
    assert isinstance(fprop.b, QTensor) and isinstance(dgrad.b, QTensor)
    assert torch.equal(fprop.b_exact, layer.weight) and torch.equal(dgrad.b_exact, layer.weight.t())
    for c in (fprop, dgrad, wgrad):
        m = probe_gemm(layer, [c], draws=draws_for(layer.recipe.gemm(c.gemm), 2)).metrics
        assert 0.9 < m["cos"] <= 1 and 0 < m["rel_err"] < 0.3, (c.gemm, m)
    m = probe_gemm(layer, [dgrad], draws=1).metrics
    assert 0 <= m["w.sat"] < 1 / 16 and 0.8 < m["w.util"] < 1.1 and "dy.ftz" in m
    # the tiles' statistics from the shared quantization are those of quantizing W^T afresh
    # (round-to-nearest: QTensor.t() is bit for bit that quantization)
    fresh = operand_stats(layer.weight.detach().t(), layer.recipe.dgrad.b, key=0).metrics()
    assert fresh == gemm_operand_stats(layer, [dgrad], "b").metrics()


def test_rne_errs_identically_across_draws_and_steps(ab):
    """RNE of a fixed tensor: every draw and every probe step gives the same error (cosine 1), so
    the error summed over K steps is K times one step's (sum_ratio 1)."""
    a, b = ab
    layer = _layer("none")
    assert not is_random(layer.recipe.fprop) and draws_for(layer.recipe.fprop, 8) == 1
    hist = ErrorHistory(window=4)
    for call in range(6):
        p = probe_gemm(layer, [_call(layer, a, b, call)], draws=4)  # redraws forced
        m = p.metrics
        assert m["draw_cos"] == pytest.approx(1.0, abs=1e-12)
        assert m["bias_ratio"] == pytest.approx(1.0, abs=1e-12)
        assert m["noise"] == pytest.approx(0.0, abs=1e-12)
        assert m["bias"] == pytest.approx(m["rel_err"], rel=1e-12)
        s = hist.update("l.fprop", p.error)
        if call:
            assert s["step_cos"] == pytest.approx(1.0, abs=1e-6)
        if call >= 3:
            assert s["sum_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert 0.05 < m["rel_err"] < 0.3  # a real FP4 error, not a vacuous zero
    assert m["sqnr_db"] == pytest.approx(-20 * math.log10(m["rel_err"]))


def test_stochastic_rounding_is_unbiased(ab):
    """SR (with its clip-free prescale compensated on the output): the alignment <q, g>/<g, g> over
    64 draws has mean 1 within 4 standard errors, and that interval is narrow (+-0.003 here); the
    mean error over R draws shrinks as 1/sqrt(R) (bias_ratio), the errors of two draws are
    uncorrelated."""
    a, b = ab
    layer = _layer("sr")
    assert is_random(layer.recipe.fprop) and draws_for(layer.recipe.fprop, 8) == 8
    R = 64
    p = probe_gemm(layer, [_call(layer, a, b, 0)], draws=R)
    al = torch.tensor(p.alignments, dtype=torch.float64)
    mean, se = float(al.mean()), float(al.std() / math.sqrt(R))
    assert abs(mean - 1.0) < 4 * se
    assert 4 * se < 0.003
    m = p.metrics
    assert m["bias_ratio"] * math.sqrt(R) == pytest.approx(1.0, abs=0.2)
    assert abs(m["draw_cos"]) < 0.02
    assert m["noise"] > 5 * m["bias"]  # the error is noise, not bias


def test_round_to_nearest_is_biased_where_sr_is_not():
    """The negative control of the SR test: positive operands whose block elements all lie at 2.4
    units round down to 2 under RNE, so the GEMM shrinks (alignment 2/2.4 squared, far outside the
    interval SR passes)."""
    a = torch.full((32, 64), 2.4) * torch.tensor([4.0 / 2.4] + [1.0] * 31).repeat(2)
    b = torch.full((16, 64), 2.4) * torch.tensor([4.0 / 2.4] + [1.0] * 31).repeat(2)
    rne = probe_gemm(_layer_small("none"), [_call(_layer_small("none"), a, b, 0)], draws=1)
    assert rne.metrics["align"] < 0.8
    sr = _layer_small("sr")
    p = probe_gemm(sr, [_call(sr, a, b, 0)], draws=64)
    assert abs(sum(p.alignments) / 64 - 1.0) < 0.01


def _layer_small(intervention: str) -> QuantLinear:
    return QuantLinear(64, 16, bias=False, recipe=Recipe.from_shorthand(GEMMS, intervention))


def test_random_hadamard_redrawn_per_call_decorrelates_the_error_a_deterministic_one_keeps_it(ab):
    """On the same operands at consecutive calls (probe steps): the random Hadamard's errors are
    nearly uncorrelated (|cosine| < 0.15: the small shared part is RNE's shrinkage toward zero),
    the deterministic and the fixed-sign Hadamard's are identical (cosine 1)."""
    a, b = ab
    for iv, lo, hi in (
        ("rht", -0.15, 0.15),
        ("dht", 1 - 1e-6, 1 + 1e-6),
        ("fht", 1 - 1e-6, 1 + 1e-6),
    ):
        layer = _layer(iv)
        hist = ErrorHistory(window=4)
        cosines, ratios = [], []
        for call in range(8):
            p = probe_gemm(layer, [_call(layer, a, b, call)], draws=1)
            s = hist.update("l.fprop", p.error, p.exact)
            cosines += [s["step_cos"]] if "step_cos" in s else []
            if "step_cos_perp" in s:
                assert lo < s["step_cos_perp"] < hi and (
                    iv != "rht" or abs(s["step_cos_perp"]) < 0.1
                )
            ratios += [s["sum_ratio"]] if "sum_ratio" in s else []
        assert all(lo < c < hi for c in cosines), (iv, cosines)
        if iv == "rht":  # independent-ish errors: |sum of 4| ~ sqrt(4) x one
            assert all(0.4 < r < 0.65 for r in ratios), ratios
        else:
            assert all(r == pytest.approx(1.0, abs=1e-6) for r in ratios)


@pytest.mark.parametrize("intervention", ["dht", "rht", "fht32"])
def test_a_hadamard_that_cancels_exactly_leaves_the_exact_gemm_unchanged(intervention):
    """Operands whose transform lands on the MXFP4 grid: quantization after the transform is
    lossless, so the probe's error is the float32 rounding of the transform alone (the product of
    the transformed operands is the exact product); without the transform the same operands
    quantize with an ordinary FP4 error."""
    layer = QuantLinear(64, 16, bias=False, recipe=Recipe.from_shorthand(GEMMS, intervention))
    call, h = 5, layer.recipe.fprop.hadamard
    signs = signs_of(layer, "fprop", call)
    g = torch.Generator().manual_seed(3)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    pa = grid[torch.randint(0, 8, (32, 64), generator=g)] * torch.where(
        torch.rand(32, 64, generator=g) < 0.5, -1.0, 1.0
    )
    pb = grid[torch.randint(0, 8, (16, 64), generator=g)]
    pa[:, ::32], pb[:, ::32] = 6.0, 6.0  # every block's amax is 6: scale 1
    # the inverse transform: x = y H diag(signs) / sqrt(n) blockwise (H symmetric and orthogonal)
    hm = torch.ones(1, 1, dtype=torch.float64)
    while hm.shape[0] < h.size:
        hm = torch.cat([torch.cat([hm, hm], 1), torch.cat([hm, -hm], 1)], 0)
    inv = hm / math.sqrt(h.size)
    if signs is not None:
        inv = inv * signs.double()
    a = (pa.double().view(32, -1, h.size) @ inv).reshape(32, 64).float()
    b = (pb.double().view(16, -1, h.size) @ inv).reshape(16, 64).float()
    torch.testing.assert_close(hadamard_transform(a, 1, h.size, signs), pa, atol=1e-5, rtol=0)
    m = probe_gemm(layer, [_call(layer, a, b, call)], draws=1).metrics
    assert m["rel_err"] < 1e-6 and m["sqnr_db"] > 120 and m["cos"] == pytest.approx(1.0, abs=1e-9)
    plain = QuantLinear(64, 16, bias=False, recipe=Recipe.from_shorthand(GEMMS, "none"))
    assert probe_gemm(plain, [_call(plain, a, b, call)], draws=1).metrics["rel_err"] > 0.02


def test_operand_statistics_count_saturated_flushed_and_block_utilisation():
    """MXFP4 (floor): a block with amax 7 gets scale 2^0, so 7 clips to 6 (one saturated element),
    0.1 and 0.2 round to 0 (two flushed; 0.25 would tie to 0 as well, 0.3 rounds to 0.5), the
    block's utilisation is 7/6; an all-zero block is neither flushed nor counted in the mean."""
    row = torch.zeros(64)
    row[:32] = 1.0
    row[:4] = torch.tensor([7.0, 0.1, 0.2, 0.3])
    x = torch.stack([row, -row])  # (2, 64): 4 blocks, 2 of them zero
    s = operand_stats(x, QuantSpec(format="mxfp4"), key=0).metrics()
    assert s == {"sat": 2 / 128, "ftz": 4 / 128, "util": pytest.approx(7 / 6)}
    # SR with the 3/4 prescale never clips; the prescaled block uses 7 * 3/4 / 6 of the range
    s = operand_stats(x, QuantSpec(format="mxfp4", rounding="sr", prescale=True), key=1).metrics()
    assert s["sat"] == 0 and s["util"] == pytest.approx(7 * 0.75 / 6)
    # a ragged last block: the padding is not counted
    s = operand_stats(x[:, :40], QuantSpec(format="mxfp4"), key=0).metrics()
    assert s["sat"] == 2 / 80 and s["ftz"] == 4 / 80
    # NVFP4 maps a block's amax to 6 through an E4M3 scale, rounded to 3 mantissa bits: where it
    # rounds down the amax element clips (by < 6.25%), so up to about one element in 16 saturates
    y = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    nv = operand_stats(y, QuantSpec(format="nvfp4"), key=0).metrics()
    assert 0 < nv["sat"] < 1 / 16 and 1 - 1 / 16 < nv["util"] < 1 + 1 / 16


def test_error_history_of_independent_errors_shrinks_as_one_over_sqrt_k():
    g = torch.Generator().manual_seed(0)
    hist = ErrorHistory(window=9)
    for _ in range(12):
        s = hist.update("k", torch.randn(100_000, generator=g))
    assert abs(s["step_cos"]) < 0.02
    assert s["sum_ratio"] == pytest.approx(1 / 3, abs=0.01)
    with pytest.raises(ValueError, match="window"):
        ErrorHistory(window=1)
    with pytest.raises(ValueError, match="shape changed"):
        hist.update("k", torch.randn(10))


def test_a_shared_shrinkage_is_told_apart_from_a_kept_pattern():
    """Errors e_t = -0.3 g + independent noise: consecutive errors share the shrinkage along g
    (step_cos = 0.09 / (0.09 + 1) here), their parts orthogonal to g share nothing."""
    gen = torch.Generator().manual_seed(0)
    n = 200_000
    g = torch.randn(n, generator=gen)
    hist = ErrorHistory(window=2)
    for _ in range(4):
        noise = torch.randn(n, generator=gen)
        s = hist.update("k", -0.3 * g + noise, exact=g)
    assert s["step_cos"] == pytest.approx(0.09 / 1.09, abs=0.01)
    assert abs(s["step_cos_perp"]) < 0.01
    hist = ErrorHistory(window=2)
    pattern = torch.randn(n, generator=gen)
    for _ in range(3):
        s = hist.update("k", pattern - 0.3 * g, exact=g)
    assert s["step_cos_perp"] == pytest.approx(1.0, abs=1e-6)


def test_one_draw_of_a_random_gemm_reports_no_spread(ab):
    a, b = ab
    layer = _layer("sr")
    m = probe_gemm(layer, [_call(layer, a, b, 0)], draws=1).metrics
    assert "bias_ratio" not in m and "draw_cos" not in m
    assert {"cos", "align", "rel_err", "sqnr_db", "x.sat", "w.ftz"} <= set(m)
    with pytest.raises(ValueError, match="draws"):
        probe_gemm(layer, [_call(layer, a, b, 0)], draws=0)


def test_high_precision_operand_has_no_statistics():
    recipe = Recipe(fprop=GemmRecipe(a=QuantSpec(format="mxfp4"), b=None))
    layer = QuantLinear(64, 16, bias=False, recipe=recipe)
    a, b = torch.randn(8, 64), torch.randn(16, 64)
    m = probe_gemm(layer, [_call(layer, a, b, 0)], draws=1).metrics
    assert "x.sat" in m and "w.sat" not in m


def test_the_nvfp4_variants_are_measured_with_their_own_scales():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 256, generator=g) * torch.exp(torch.randn(64, 256, generator=g))
    plain = operand_stats(x, QuantSpec(format="nvfp4"), key=0).metrics()
    # Four Over Six: blocks mapped to 4 use two thirds of the range, and never clip
    fos = operand_stats(x, QuantSpec(format="nvfp4", scale_rule="mse"), key=0).metrics()
    assert 4 / 6 < fos["util"] < plain["util"] - 0.05
    assert fos["sat"] < plain["sat"]
    # MS-EDEN (scaled maximum 6.07 before its correction) and double-block scales: a block's
    # maximum lands near the top of the grid, as with NVFP4's own scale
    signs = sign_vector(128, 3)
    eden = operand_stats(
        x, QuantSpec(format="nvfp4", rounding="eden"), key=0, hadamard=(128, signs)
    ).metrics()
    assert 0.95 < eden["util"] < 1.1 and eden["sat"] > 0
    outer = operand_stats(x, QuantSpec(format="nvfp4", outer_block=128), key=0).metrics()
    assert 0.95 < outer["util"] < 1.07
    assert all(0 <= m[k] < 1 for m in (fos, eden, outer) for k in ("sat", "ftz"))
