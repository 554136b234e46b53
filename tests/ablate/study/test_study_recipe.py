"""The recipe vocabulary of a study beyond the shorthands (``ablate.study.recipe``): named recipes in
``base`` and as an axis, the explicit per-GEMM form, layer selection, the shorthands expanded into the
explicit form, and an error naming the YAML path and the allowed values for each new field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.errors import StudyError
from ablate.study import parse_study
from ablate.study.recipe import ExplicitRecipe
from backends.recipes import GEMMS, NAMED_RECIPES, Recipe, named_recipe

ROOT = Path(__file__).resolve().parents[3]
BASE = {"name": "t", "base": {"train": {"steps": 5, "batch_size": 4, "eval_every": 5}}}


def study(**kw):
    return parse_study({**BASE, **kw})


def errors_of(**kw) -> list[str]:
    with pytest.raises(StudyError) as e:
        parse_study({**BASE, **kw})
    return e.value.errors


def test_the_vocabulary_lists_what_the_numerics_have():
    from typing import get_args

    from ablate.study.recipe import FormatName, HadamardOptions
    from backends.quant import FORMATS, SIZES

    assert set(get_args(FormatName)) == {"bf16", *FORMATS}
    assert get_args(HadamardOptions.model_fields["size"].annotation) == SIZES


def test_named_recipes_as_an_axis_next_to_shorthand_baselines():
    s = study(
        grid=[
            {"base_format": ["bf16", "fp8"], "seed": [0, 1]},
            {"recipe": list(NAMED_RECIPES), "seed": [0, 1]},
        ],
        baseline={"base_format": "fp8", "recipe": None},
    )
    assert {c.config_label for c in s.cells} == {
        "bf16",
        "fp8",
        "nvidia_nvfp4",
        "tseng_mxfp4/bf16",
        "amd_mxfp4_h16",
        "quartet",
        "four_over_six",
        "nvidia_nvfp4_4over6",
        "quartet_ii",
        "tetrajet_v2",
    }
    by = {c.config_label: c for c in s.cells if c.seed == 0}
    assert by["nvidia_nvfp4"].config.recipe == named_recipe("nvidia_nvfp4")
    assert by["tseng_mxfp4/bf16"].config.recipe.fprop.high_precision
    # the report's terms, derived from the resolved GEMMs
    assert dict(by["nvidia_nvfp4"].recipe_axes) == {
        "fp4_gemms": "fprop+dgrad+wgrad",
        "intervention": "fprop:none,dgrad:sr,wgrad:sr+fht16",
        "fp4_format": "nvfp4",
        "base_format": "bf16",
    }
    assert by["tseng_mxfp4/bf16"].recipe_axes["fp4_gemms"] == "dgrad+wgrad"
    assert by["tseng_mxfp4/bf16"].recipe_axes["intervention"] == "sr+rht64"
    assert by["amd_mxfp4_h16"].recipe_axes["intervention"] == "dht16"
    assert by["quartet"].recipe_axes["intervention"] == "fprop:dht32,dgrad:sr+rht32,wgrad:sr+rht32"
    # the 2026 recipes' quantizers are named too (the speedup model charges them)
    assert by["four_over_six"].recipe_axes["intervention"] == (
        "fprop:4over6,dgrad:sr+4over6,wgrad:sr+4over6+fht16"
    )
    assert by["quartet_ii"].recipe_axes["intervention"] == (
        "fprop:4over6,dgrad:eden+rht128,wgrad:eden+rht128"
    )
    assert (
        by["tetrajet_v2"].recipe_axes["intervention"] == "fprop:none,dgrad:sr+rht16,wgrad:sr+rht16"
    )
    assert [c.label for c in s.baseline_cells] == ["fp8/seed0", "fp8/seed1"]


def test_a_named_recipe_in_base_with_keep_last_and_layers():
    s = study(
        base={**BASE["base"], "recipe": "nvidia_nvfp4", "keep_last": 1},
        grid={"layers": [{"types": ["mlp"]}, {"blocks": [0, -1]}]},
    )
    labels = [c.label for c in s.cells]
    assert labels == ["nvidia_nvfp4/keep0,1/mlp", "nvidia_nvfp4/keep0,1/blocks0,-1"]
    r = s.cells[0].config.recipe
    assert r.keep_last == 1 and r.layer_types == ("mlp",) and r.blocks is None
    assert s.cells[1].config.recipe.blocks == (0, -1)


def test_explicit_gemms_build_the_named_recipe_and_the_shorthands():
    # nvidia_nvfp4 written out by hand, TE's sign vector included
    te = list(named_recipe("nvidia_nvfp4").wgrad.hadamard.vector)  # type: ignore[union-attr]
    gemms = {
        "name": "te_by_hand",
        "fprop": {"format": "nvfp4", "w": {"block": [16, 16]}},
        "dgrad": {"format": "nvfp4", "dy": {"rounding": "sr"}, "w": {"block": [16, 16]}},
        "wgrad": {
            "format": "nvfp4",
            "dy": {"rounding": "sr"},
            "hadamard": {"size": 16, "signs": "fixed", "vector": te},
        },
    }
    s = study(base={**BASE["base"], "gemms": gemms}, grid={"seed": [0]})
    r, nv = s.cells[0].config.recipe, named_recipe("nvidia_nvfp4")
    assert (r.fprop, r.dgrad, r.wgrad) == (nv.fprop, nv.dgrad, nv.wgrad)
    assert s.cells[0].label == "te_by_hand"


@pytest.mark.parametrize(
    "shorthand",
    [
        (["fprop", "dgrad", "wgrad"], "dht", "mxfp4", "fp8", None),
        (["dgrad", "wgrad"], "sr+rht64", "mxfp4", "bf16", None),
        (["wgrad"], "fht32", "nvfp4", "mxfp8", None),
        (["fprop"], "sr", "nvfp4", "fp8", ["fprop", "wgrad"]),
        ([], "none", "mxfp4", "fp8", None),
    ],
)
def test_the_shorthands_expand_into_the_explicit_form(shorthand):
    fp4, intervention, fmt, base, apply_to = shorthand
    r = Recipe.from_shorthand(fp4, intervention, fp4_format=fmt, base=base, apply_to=apply_to)
    built = ExplicitRecipe.model_validate(r.explicit()).build(base)
    assert (built.fprop, built.dgrad, built.wgrad) == (r.fprop, r.dgrad, r.wgrad)


@pytest.mark.parametrize("name", list(NAMED_RECIPES))
def test_named_recipes_written_out_build_back(name):
    r = named_recipe(name)
    built = ExplicitRecipe.model_validate(r.explicit()).build("bf16")
    assert (built.fprop, built.dgrad, built.wgrad) == (r.fprop, r.dgrad, r.wgrad)


def test_gemms_not_given_run_in_the_base_format():
    s = study(
        base={**BASE["base"], "base_format": "fp8"},
        grid={"gemms": [{"wgrad": {"format": "mxfp4", "prescale": True}}]},
    )
    r = s.cells[0].config.recipe
    assert r.fprop == Recipe.from_shorthand([], base="fp8").fprop
    assert r.wgrad.a is not None and r.wgrad.a.prescale and r.wgrad.a.rounding == "rne"
    assert s.cells[0].recipe_axes["fp4_gemms"] == "wgrad"
    assert s.cells[0].label.endswith("/fp8")


def test_shorthand_only_studies_keep_their_keys_and_labels():
    # the shipped shorthand studies: the same keys as before the vocabulary grew (pinned in
    # tests/ablate/train/test_config.py for three recipes; here: a new field left unset changes
    # nothing, whatever spelling of "unset" a study uses)
    a = study(grid={"fp4_gemms": [["wgrad"]], "seed": [0]})
    b = study(
        base={**BASE["base"], "recipe": None, "gemms": None, "layers": None},
        grid={"fp4_gemms": [["wgrad"]], "seed": [0]},
    )
    assert a.cells[0].key == b.cells[0].key and a.cells[0].label == b.cells[0].label


@pytest.mark.parametrize(
    "kw, path, words",
    [
        ({"grid": {"recipe": ["nvidia_nvfp"]}}, "grid.recipe[0]", ["did you mean 'nvidia_nvfp4'", "quartet"]),
        (
            {"base": {"recipe": "quartet", "fp4_gemms": ["fprop"]}, "grid": {"seed": [0]}},
            "base.recipe",
            ["does not combine with the shorthand fp4_gemms"],
        ),
        (
            {"base": {"recipe": "quartet"}, "grid": {"intervention": ["sr"]}},
            "grid.intervention[0]",
            ["does not combine with the shorthand intervention"],
        ),
        (
            {"base": {"recipe": "quartet", "gemms": {"fprop": {"format": "mxfp4"}}}, "grid": {"seed": [0]}},
            "base.gemms",
            ["not both"],
        ),
        ({"grid": {"gemms": [{"fprp": {}}]}}, "grid.gemms[0].fprp", ["did you mean 'fprop'", "wgrad"]),
        ({"grid": {"gemms": [{"fprop": {"format": "nvfp5"}}]}}, "grid.gemms[0].fprop.format", ["'nvfp4'", "'bf16'"]),
        ({"grid": {"gemms": [{"fprop": {"dy": {}}}]}}, "grid.gemms[0].fprop.dy", ["allowed:", "x, w"]),
        ({"grid": {"gemms": [{"dgrad": {"x": {}}}]}}, "grid.gemms[0].dgrad.x", ["dy, w"]),
        ({"grid": {"gemms": [{"wgrad": {"x": {"format": "mxfp4"}}}]}}, "grid.gemms[0].wgrad.dy.format", ["no format", "bf16, mxfp4"]),
        ({"grid": {"gemms": [{"fprop": {"format": "mxfp4", "rounding": "up"}}]}}, "grid.gemms[0].fprop.rounding", ["'rne'", "'sr'", "'eden'"]),
        ({"grid": {"gemms": [{"fprop": {"format": "mxfp4", "scale_rule": "mse"}}]}}, "grid.gemms[0].fprop.scale_rule", ["needs E4M3", "nvfp4"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "rounding": "eden"}}]}}, "grid.gemms[0].wgrad.hadamard", ["rounding eden", "Hadamard"]),
        ({"grid": {"gemms": [{"fprop": {"format": "nvfp4", "outer_block": 100}}]}}, "grid.gemms[0].fprop.outer_block", ["allowed: 32, 64, 128"]),
        ({"grid": {"gemms": [{"fprop": {"format": "mxfp4", "prescale": "yes please"}}]}}, "grid.gemms[0].fprop.prescale", ["true (3/4)", "16/17"]),
        ({"grid": {"gemms": [{"fprop": {"format": "mxfp4", "scale_mode": "round"}}]}}, "grid.gemms[0].fprop.scale_mode", ["'floor'", "'rceil'"]),
        ({"grid": {"gemms": [{"fprop": {"format": "mxfp4", "w": {"block": [16, 32]}}}]}}, "grid.gemms[0].fprop.w.block", ["[1, N] or [N, N]"]),
        ({"grid": {"gemms": [{"fprop": {"format": "mxfp4", "x": {"block": [32, 32]}}}]}}, "grid.gemms[0].fprop.x.block", ["weight operand w only"]),
        ({"grid": {"gemms": [{"fprop": {"format": "fp8_e4m3", "block": [1, 32]}}]}}, "grid.gemms[0].fprop.block", ["per tensor"]),
        ({"grid": {"gemms": [{"fprop": {"format": "bf16", "x": {"rounding": "sr"}}}]}}, "grid.gemms[0].fprop.x.rounding", ["bf16 (high precision)"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "hadamard": {"size": 24}}}]}}, "grid.gemms[0].wgrad.hadamard.size", ["16, 32, 64, 128 or 256"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "hadamard": {"signs": "sometimes"}}}]}}, "grid.gemms[0].wgrad.hadamard.signs", ["'none'", "'fixed'", "'random'"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "hadamard": {"signs": "fixed", "vector": [1, -1]}}}]}}, "grid.gemms[0].wgrad.hadamard.vector", ["16 entries of 1 or -1"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "hadamard": {"vector": [1] * 16}}}]}}, "grid.gemms[0].wgrad.hadamard.vector", ["signs 'fixed'"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "x": {"format": "bf16"}, "hadamard": {}}}]}}, "grid.gemms[0].wgrad.hadamard", ["both operands"]),
        ({"grid": {"gemms": [{"wgrad": {"format": "nvfp4", "hadamard": {"operands": ["dy"]}}}]}}, "grid.gemms[0].wgrad.hadamard.operands", ["allowed: size, signs, vector"]),
        ({"base": {"layers": {"types": ["attn"]}}, "grid": {"seed": [0]}}, "base.layers.types[0]", ["'attention'", "'mlp'"]),
        ({"grid": {"layers": [{"blocks": [0, 9]}]}}, "grid.layers[0].blocks[1]", ["block 9 does not exist", "-4 to 3"]),
        ({"grid": {"layers": [{"blocks": []}]}}, "grid.layers[0].blocks", ["non-empty"]),
        ({"grid": {"layers": [{"types": ["mlp", "mlp"]}]}}, "grid.layers[0].types", ["distinct"]),
        ({"grid": {"layers": [{"block": [0]}]}}, "grid.layers[0].block", ["did you mean 'blocks'", "types"]),
    ],
)  # fmt: skip
def test_each_new_field_errs_at_its_yaml_path_naming_what_is_allowed(kw, path, words):
    if "base" in kw:
        kw = {**kw, "base": {**BASE["base"], **kw["base"]}}
    errs = errors_of(**kw)
    hit = [e for e in errs if e.startswith(path + ":")]
    assert hit, errs
    for w in words:
        assert any(w in e for e in hit), (w, hit)


def test_every_gemm_of_an_explicit_recipe_is_checked_at_once():
    errs = errors_of(
        grid={
            "gemms": [
                {
                    "fprop": {"format": "mxfp4", "x": {"block": [32, 32]}},
                    "wgrad": {"format": "fp8_e4m3", "block": [1, 32]},
                }
            ]
        }
    )
    assert any(e.startswith("grid.gemms[0].fprop.x.block:") for e in errs)
    assert any(e.startswith("grid.gemms[0].wgrad.block:") for e in errs)


@pytest.mark.parametrize("name", ["recipes", "recipes_gpu"])
def test_shipped_recipe_studies_compare_every_named_recipe_with_baselines(name):
    from ablate.study import load_study

    s = load_study(ROOT / "studies" / f"{name}.yaml", check_files=False)
    configs = {c.config_label for c in s.cells}
    for recipe in NAMED_RECIPES:
        cells = [c for c in s.cells if c.values.get("recipe") == recipe]
        assert cells, (name, recipe, configs)
        for c in cells:  # every named cell resolves to its recipe's GEMMs
            r, want = c.config.recipe, named_recipe(recipe, c.values["base_format"])
            assert all(r.gemm(g) == want.gemm(g) for g in GEMMS)
    # and a partial override: NVIDIA's recipe without its wgrad RHT, named as a variant
    variant = [c for c in s.cells if c.config_label.startswith("nvidia_nvfp4~")]
    assert variant and all(c.config.recipe.wgrad.hadamard is None for c in variant)
    assert {"bf16", "fp8"} <= configs
    assert len(s.baseline_cells) >= 2 and len({c.seed for c in s.cells}) >= 2
