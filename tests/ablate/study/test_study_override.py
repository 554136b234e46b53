"""Partial overrides of a named recipe (``ablate.study.override``): each kind of change lands on the
GEMM or operand it names and nowhere else, a variant's cells say they are one, and every problem
names its path below ``recipe`` and what is allowed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ablate.errors import StudyError
from ablate.study import parse_study
from ablate.study.override import RecipeOverride
from backends.recipes import GEMMS, HadamardSpec, named_recipe
from backends.recipes.named import TE_WGRAD_SIGNS

BASE = {"name": "t", "base": {"train": {"steps": 5, "batch_size": 4, "eval_every": 5}}}


def variant(**kw):
    return RecipeOverride.parse(kw).build("bf16")


def unchanged(r, named, but: set[str]) -> None:
    for g in GEMMS:
        if g not in but:
            assert r.gemm(g) == named.gemm(g), g


def test_a_null_hadamard_removes_the_transform_and_nothing_else():
    nv = named_recipe("nvidia_nvfp4")
    r = variant(name="nvidia_nvfp4", wgrad={"hadamard": None})
    assert r.wgrad.hadamard is None
    assert (r.wgrad.a, r.wgrad.b) == (nv.wgrad.a, nv.wgrad.b)
    unchanged(r, nv, {"wgrad"})
    assert r.short() == "nvidia_nvfp4~wgrad.hadamard=none"


def test_a_gemm_key_changes_both_operands_an_operand_key_one():
    fos = named_recipe("four_over_six")
    r = variant(name="four_over_six", fprop={"scale_rule": None}, dgrad={"dy": {"rounding": "rne"}})
    assert r.fprop.a is not None and r.fprop.b is not None
    assert r.fprop.a.scale_rule is None and r.fprop.b.scale_rule is None
    assert r.dgrad.a == replace(fos.dgrad.a, rounding="rne")  # type: ignore[arg-type]
    assert r.dgrad.b == fos.dgrad.b
    unchanged(r, fos, {"fprop", "dgrad"})
    assert r.short() == "four_over_six~fprop.scale_rule=none,dgrad.dy.rounding=rne"


def test_a_hadamard_key_keeps_the_others_and_a_new_policy_drops_the_vector():
    nv = named_recipe("nvidia_nvfp4")
    r = variant(name="nvidia_nvfp4", wgrad={"hadamard": {"signs": "random"}})
    assert r.wgrad.hadamard == HadamardSpec(size=16, signs="random")
    r = variant(name="nvidia_nvfp4", fprop={"hadamard": {"size": 32}})
    assert r.fprop.hadamard == HadamardSpec(size=32, signs="none")
    assert r.wgrad.hadamard == nv.wgrad.hadamard  # TE's vector stays where nothing changed
    assert r.wgrad.hadamard is not None and r.wgrad.hadamard.vector == TE_WGRAD_SIGNS


def test_a_new_format_takes_its_own_defaults_and_bf16_drops_every_key():
    r = variant(name="nvidia_nvfp4", fprop={"format": "mxfp4"})
    assert r.fprop.b is not None and r.fprop.b.format == "mxfp4"
    assert r.fprop.b.block_rows == 1 and r.fprop.b.block == 32  # the 16x16 tile went with nvfp4
    r = variant(name="nvidia_nvfp4", dgrad={"format": "bf16"})
    assert r.dgrad.high_precision
    r = variant(name="quartet_ii", dgrad={"format": "bf16", "hadamard": None})
    assert r.dgrad.high_precision and r.wgrad == named_recipe("quartet_ii").wgrad


def test_an_explicit_label_names_the_variant():
    r = variant(name="tetrajet_v2", label="tj2-no-outer", fprop={"outer_block": None})
    assert r.short() == "tj2-no-outer"
    assert r.fprop.a is not None and r.fprop.a.outer_block is None


def test_variants_are_an_axis_next_to_their_recipe_and_a_baseline():
    s = parse_study(
        {
            **BASE,
            "grid": [
                {"base_format": ["fp8"], "seed": [0, 1]},
                {
                    "recipe": [
                        "nvidia_nvfp4",
                        {"name": "nvidia_nvfp4", "wgrad": {"hadamard": None}},
                        {"name": "nvidia_nvfp4", "dgrad": {"dy": {"rounding": "rne"}}},
                    ],
                    "seed": [0, 1],
                },
            ],
            "baseline": {"base_format": "fp8", "recipe": None},
        }
    )
    labels = sorted({c.config_label for c in s.cells})
    assert labels == [
        "fp8",
        "nvidia_nvfp4",
        "nvidia_nvfp4~dgrad.dy.rounding=rne",
        "nvidia_nvfp4~wgrad.hadamard=none",
    ]
    keys = {c.key for c in s.cells}
    assert len(keys) == len(s.cells)  # variants are cells of their own
    v = next(c for c in s.cells if c.config_label == "nvidia_nvfp4~wgrad.hadamard=none")
    assert v.values["recipe"] == {"name": "nvidia_nvfp4", "wgrad": {"hadamard": None}}
    assert v.recipe_axes["intervention"] == "fprop:none,dgrad:sr,wgrad:sr"
    assert v.config.recipe.short() == v.config_label
    # a variant in base, selected onto the last blocks like any recipe
    s = parse_study(
        {
            **BASE,
            "base": {
                **BASE["base"],
                "recipe": {"name": "quartet_ii", "fprop": {"scale_rule": "mae"}},
                "keep_last": 1,
            },
            "grid": {"seed": [0]},
        }
    )
    r = s.cells[0].config.recipe
    assert r.keep_last == 1 and r.fprop.a is not None and r.fprop.a.scale_rule == "mae"
    assert s.cells[0].label == "quartet_ii~fprop.scale_rule=mae/keep0,1"


@pytest.mark.parametrize(
    "rec, path, words",
    [
        ({"name": "nvidia", "wgrad": {"hadamard": None}}, "recipe.name", ["did you mean 'nvidia_nvfp4'", "tetrajet_v2"]),
        ({"name": "nvidia_nvfp4"}, "recipe", ["changes at least one GEMM"]),
        ({"name": "nvidia_nvfp4", "wgard": {}}, "recipe.wgard", ["did you mean 'wgrad'", "fprop, dgrad, wgrad"]),
        ({"name": "nvidia_nvfp4", "wgrad": {"hadmard": None}}, "recipe.wgrad.hadmard", ["did you mean 'hadamard'"]),
        ({"name": "nvidia_nvfp4", "fprop": {"dy": {}}}, "recipe.fprop.dy", ["allowed:", "x, w"]),
        ({"name": "nvidia_nvfp4", "dgrad": {"dy": {"rounding": "up"}}}, "recipe.dgrad.dy.rounding", ["'rne'", "'eden'"]),
        ({"name": "nvidia_nvfp4", "fprop": {"scale_rule": "l2"}}, "recipe.fprop.scale_rule", ["'mse'", "'abs_max'"]),
        ({"name": "tseng_mxfp4", "dgrad": {"scale_rule": "mse"}}, "recipe.dgrad.dy.scale_rule", ["needs E4M3", "nvfp4"]),
        ({"name": "quartet_ii", "wgrad": {"hadamard": None}}, "recipe.wgrad.hadamard", ["rounding eden", "Hadamard transform"]),
        ({"name": "nvidia_nvfp4", "wgrad": {"hadamard": {"size": 24}}}, "recipe.wgrad.hadamard.size", ["16, 32, 64, 128 or 256"]),
        ({"name": "nvidia_nvfp4", "fprop": {"x": {"block": [16, 16]}}}, "recipe.fprop.x.block", ["weight operand w only"]),
        ({"name": "tetrajet_v2", "fprop": {"outer_block": 24}}, "recipe.fprop.x.outer_block", ["allowed: 32, 64, 128"]),
        ({"name": "four_over_six", "dgrad": {"dy": {"prescale": 2}}}, "recipe.dgrad.dy.prescale", ["(0, 1]", "16/17"]),
    ],
)  # fmt: skip
def test_each_problem_names_its_path_below_recipe_and_what_is_allowed(rec, path, words):
    with pytest.raises(StudyError) as e:
        parse_study({**BASE, "grid": {"recipe": [rec]}})
    errs = e.value.errors
    hit = [m for m in errs if m.startswith(f"grid.{path.replace('recipe', 'recipe[0]', 1)}:")]
    assert hit, errs
    for w in words:
        assert any(w in m for m in hit), (w, hit)


def test_a_prescale_fraction_is_read_as_a_number():
    r = variant(name="nvidia_nvfp4", dgrad={"dy": {"prescale": "16/17"}})
    assert r.dgrad.a is not None and r.dgrad.a.prescale_factor == 16 / 17
    assert r.short() == "nvidia_nvfp4~dgrad.dy.prescale=0.9412"
