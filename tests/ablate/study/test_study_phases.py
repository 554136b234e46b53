"""Precision schedules in a study (``ablate.study.phases``): ``warmup`` and ``tail`` sections,
varied by their dotted paths, resolved into the trainer's phases; what changes nothing keeps the
cell's key; bad input refused at its path, naming what is allowed; the speedup model weighs each
segment by its share of the steps."""

from __future__ import annotations

import json

import pytest

from ablate.errors import StudyError
from ablate.report.speedup import recipe_gain, schedule_time
from ablate.study import parse_study
from ablate.study.speedup import SpeedupSection
from backends import Recipe

BASE = {"train": {"steps": 40, "batch_size": 4, "eval_every": 10}, "base_format": "fp8"}
FULL = ["fprop", "dgrad", "wgrad"]


def study(**kw):
    kw.setdefault("grid", {"seed": [0]})
    doc = {"name": "t", "base": {**BASE, **kw.pop("base", {})}, **kw}
    return parse_study(doc)


def errors_of(**kw) -> list[str]:
    with pytest.raises(StudyError) as e:
        study(**kw)
    return e.value.errors


def test_a_warmup_axis_gives_each_cell_its_phases_and_zero_is_the_cell_without_one():
    s = study(
        base={"fp4_gemms": FULL, "intervention": "dht", "warmup": {"recipe": "fp8", "first": 0}},
        grid={"warmup.first": [0, 0.05, 0.1, 8]},
    )
    plain = study(base={"fp4_gemms": FULL, "intervention": "dht"})
    keys = [c.key for c in s.cells]
    assert keys[0] == plain.cells[0].key and len(set(keys)) == 4
    fp8 = Recipe.from_shorthand([], base="fp8")
    got = [[(p.name, p.start, p.end, p.recipe == fp8) for p in c.config.phases] for c in s.cells]
    assert got == [[], [("warmup", 0, 2, True)], [("warmup", 0, 4, True)], [("warmup", 0, 8, True)]]
    assert all(c.config.recipe == plain.cells[0].config.recipe for c in s.cells)
    assert "phases" not in s.cells[0].recipe_axes
    segments = json.loads(s.cells[1].recipe_axes["phases"])
    assert [seg["share"] for seg in segments] == [0.05, 0.95]
    assert segments[0]["gemms"]["wgrad"] == {"format": "fp8"}
    assert segments[1]["gemms"]["wgrad"] == {"format": "mxfp4", "intervention": "dht16"}


def test_a_tail_replaces_only_its_gemms_on_the_last_steps():
    s = study(
        base={"fp4_gemms": FULL, "tail": {"recipe": "bf16", "gemms": ["fprop"], "last": 0.25}}
    )
    (phase,) = s.cells[0].config.phases
    own = s.cells[0].config.recipe
    assert (phase.name, phase.start, phase.end) == ("tail", 30, 40)
    assert phase.recipe.fprop.high_precision and phase.recipe.dgrad == own.dgrad
    assert phase.recipe.wgrad == own.wgrad


@pytest.mark.parametrize(
    "base, words",
    [
        ({"warmup": {"recipe": "fp9", "first": 0.1}}, ["warmup.recipe", "unknown recipe 'fp9'",
                                                     "allowed: bf16, fp8, mxfp8"]),
        ({"warmup": {"recipe": "fp8", "first": 1.5}}, ["warmup.first", "past the budget"]),
        ({"warmup": {"recipe": "fp8", "first": 41}}, ["warmup.first: 41 steps is past the budget",
                                                     "train.steps = 40"]),
        ({"warmup": {"recipe": "fp8", "first": True}}, ["warmup.first", "not a length"]),
        ({"warmup": {"recipe": "fp8", "first": -2}}, ["warmup.first", "not a length"]),
        ({"warmup": {"recipe": "fp8"}}, ["base.warmup.first: required"]),
        ({"tail": {"recipe": "bf16", "last": 0.1, "gemms": ["fprop", "fprop"]}},
         ["tail.gemms", "distinct GEMMs"]),
        ({"tail": {"recipe": "bf16", "last": 0.1, "from": 0.9}}, ["tail.from: unknown key; allowed: recipe, gemms, last"]),
        (
            {"warmup": {"recipe": "fp8", "first": 0.6}, "tail": {"recipe": "bf16", "last": 0.5}},
            ["tail.last", "overlap", "train.steps = 40"],
        ),
    ],
)  # fmt: skip
def test_a_bad_phase_is_refused_at_its_path_naming_what_is_allowed(base, words):
    text = " ".join(errors_of(base={"fp4_gemms": FULL, **base}))
    for w in words:
        assert w in text, (w, text)


def test_an_unknown_field_of_a_phase_axis_is_refused_with_its_fields():
    text = " ".join(errors_of(grid={"warmup.until": [0.1]}))
    assert "warmup has no field 'until'" in text and "first" in text


def test_the_speedup_model_weighs_each_segment_by_its_share_of_the_steps():
    spec = SpeedupSection()  # mi355x: fp8 2x, mxfp4 4x; half of a BF16 step in the GEMMs
    s = study(
        base={"fp4_gemms": FULL, "warmup": {"recipe": "fp8", "first": 0.5}},
        grid={"fp4_gemms": [[], FULL]},
        baseline={"fp4_gemms": []},
    )
    base, cell = s.baseline_cells[0], next(c for c in s.cells if not c.baseline)
    assert base.config.phases == ()  # the warmup repeats the FP8 baseline's own recipe
    fp8, mx = 0.5 + 0.5 / 2, 0.5 + 0.5 / 4
    assert schedule_time(cell.recipe_axes, spec) == pytest.approx(0.5 * fp8 + 0.5 * mx)
    assert recipe_gain(cell.recipe_axes, base.recipe_axes, spec) == pytest.approx(
        fp8 / (0.5 * fp8 + 0.5 * mx)
    )


def test_a_named_schedule_sets_its_recipe_and_phases_and_a_cell_overrides_them_key_by_key():
    named = study(base={"schedule": "nvidia_nvfp4_bf16_tail", "train": {"steps": 100}})
    spelled = study(
        base={
            "recipe": "nvidia_nvfp4",
            "tail": {"recipe": "bf16", "gemms": ["fprop"], "last": 0.18},
            "train": {"steps": 100},
        }
    )
    assert named.cells[0].key == spelled.cells[0].key
    (tail,) = named.cells[0].config.phases
    assert (tail.name, tail.start, tail.end, tail.recipe.fprop.high_precision) == (
        "tail",
        82,
        100,
        True,
    )
    varied = study(
        base={"schedule": "nvidia_nvfp4_bf16_tail", "train": {"steps": 100}},
        grid={"tail.last": [0.1, 0.3]},
    )
    assert [[(p.start, p.recipe.fprop.high_precision) for p in c.config.phases]
            for c in varied.cells] == [[(90, True)], [(70, True)]]  # fmt: skip
    # the MLPerf MXFP4 schedule trains no FP8 step: its cell is amd_mxfp4_h16's
    mlperf = study(base={"schedule": "amd_mlperf_mxfp4"}, grid={"warmup.first": [0, 0.1]})
    plain = study(base={"recipe": "amd_mxfp4_h16"})
    assert mlperf.cells[0].key == plain.cells[0].key and mlperf.cells[1].config.phases
    text = " ".join(errors_of(base={"schedule": "nvidia_nvfp4_tail"}))
    assert "schedule: unknown 'nvidia_nvfp4_tail'" in text and "amd_mlperf_mxfp4" in text


def test_ablate_recipe_prints_a_named_schedule_with_its_source():
    from click.testing import CliRunner

    from ablate.cli import main

    res = CliRunner().invoke(main, ["recipe", "nvidia_nvfp4_bf16_tail"])
    assert res.exit_code == 0, res.output
    assert "arXiv 2509.25149" in res.output and "tail: bf16 on fprop for 0.18" in res.output
    assert "recipe: nvidia_nvfp4" in res.output
    res = CliRunner().invoke(main, ["recipe", "amd_mlperf_mxfp4", "--json"])
    doc = json.loads(res.output)
    assert doc["keys"]["recipe"] == "amd_mxfp4_h16" and "SYNTH_WARMUP_STEPS=20" in doc["source"]


def test_a_phase_recipe_this_device_cannot_run_is_refused_naming_the_phase():
    from ablate.driver.preflight import check_devices
    from ablate.errors import CannotRunError

    # native FP8 runs on this CPU (per-tensor scaled_mm); native MXFP4 does not
    s = study(
        base={
            "backend": "native",
            "device": "cpu",
            "tail": {"recipe": "amd_mxfp4_h16", "last": 0.25},
        },
    )
    with pytest.raises(CannotRunError) as e:
        check_devices(s)
    assert "this machine cannot run the study" in str(e.value)
    assert "tail: " in str(e.value) and "mxfp4" in str(e.value)
    check_devices(study(base={"backend": "native", "device": "cpu"}))  # the FP8 cell itself runs
