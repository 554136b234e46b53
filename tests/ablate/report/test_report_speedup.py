"""The step-time model, its calibration, the measured/model choice, and the interval of a ratio."""

from __future__ import annotations

import math
import subprocess
import sys

import pydantic
import pytest

from ablate.errors import ReportError
from ablate.report.metrics import per_cell, per_config
from ablate.report.speedup import projected_speedup, role_formats, step_time, throughput_gain
from ablate.report.stats import t975
from ablate.study.speedup import DEVICES, SpeedupSection

FULL_MXFP4 = role_formats("fprop+dgrad+wgrad", "mxfp4", "fp8")
ALL_FP8 = role_formats("", "mxfp4", "fp8")


def test_role_formats_put_the_named_gemms_in_fp4_and_the_rest_in_the_base_format():
    assert role_formats("fprop+dgrad", "nvfp4", "mxfp8") == {
        "fprop": "nvfp4",
        "dgrad": "nvfp4",
        "wgrad": "mxfp8",
    }
    assert role_formats("", "mxfp4", "bf16") == {"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16"}
    with pytest.raises(ReportError, match="names bprop; allowed: fprop, dgrad, wgrad"):
        role_formats("fprop+bprop", "mxfp4", "fp8")


def test_default_model_gives_full_mxfp4_on_mi355x_the_papers_20_percent_over_fp8():
    # FP8 step 0.5 + 0.5/2 = 0.75, MXFP4 step 0.5 + 0.5/4 = 0.625 (in BF16 steps): 0.75/0.625 = 1.2
    spec = SpeedupSection()
    assert spec.device == "mi355x"
    assert step_time(ALL_FP8, spec) == pytest.approx(0.75)
    assert step_time(FULL_MXFP4, spec) == pytest.approx(0.625)
    assert throughput_gain(FULL_MXFP4, ALL_FP8, spec) == pytest.approx(1.2)
    assert step_time(role_formats("", "mxfp4", "bf16"), spec) == pytest.approx(1.0)


def test_projected_speedup_is_gain_over_one_plus_token_cost():
    # the paper: +20% step throughput, +8.5% tokens -> 1.2 / 1.085 = 1.10599 (9-10% faster)
    assert projected_speedup(1.2, 0.085) == pytest.approx(1.2 / 1.085)
    assert math.isnan(projected_speedup(1.2, math.nan))


def test_role_share_and_overrides_change_the_model_as_documented():
    # wgrad alone takes 0.3 of a BF16 step; fprop/dgrad 0.1 each; mxfp4 overridden to 3x BF16 and a
    # 10% quantization overhead: all-FP8 = 0.5 + 0.5 * (1/2 + 0.1) = 0.8; full MXFP4 = 0.5 + 0.5 *
    # (1/3 + 0.1) = 0.716667 -> gain 1.116279
    spec = SpeedupSection(
        role_share={"fprop": 0.1, "dgrad": 0.1, "wgrad": 0.3},
        throughput={"mxfp4": 3.0},
        quant_overhead=0.1,
    )
    assert throughput_gain(FULL_MXFP4, ALL_FP8, spec) == pytest.approx(
        0.8 / (0.5 + 0.5 * (1 / 3 + 0.1))
    )
    # only fprop (0.1 of the step) in MXFP4: 0.5 + 0.1 * (1/3 + 0.1) + 0.4 * (1/2 + 0.1) = 0.783333
    fprop = role_formats("fprop", "mxfp4", "fp8")
    assert step_time(fprop, spec) == pytest.approx(0.5 + 0.1 * (1 / 3 + 0.1) + 0.4 * 0.6)


def test_a_format_the_device_cannot_run_is_a_plain_error_naming_both():
    with pytest.raises(ReportError, match="device 'mi355x' has no native nvfp4 GEMM"):
        step_time(role_formats("fprop", "nvfp4", "fp8"), SpeedupSection())
    assert throughput_gain(
        role_formats("fprop+dgrad+wgrad", "nvfp4", "fp8"), ALL_FP8, SpeedupSection(device="b200")
    ) == pytest.approx(1.2)
    assert "nvfp4" not in DEVICES["h100"].throughput and "mxfp4" not in DEVICES["h100"].throughput


def test_the_speedup_section_rejects_bad_input_with_what_is_allowed():
    with pytest.raises(
        pydantic.ValidationError, match="unknown device 'tpu'; allowed: mi355x, b200"
    ):
        SpeedupSection(device="tpu")
    with pytest.raises(pydantic.ValidationError, match="gemm_share or role_share, not both"):
        SpeedupSection(gemm_share=0.5, role_share={"fprop": 0.1, "dgrad": 0.1, "wgrad": 0.1})
    with pytest.raises(pydantic.ValidationError, match="missing wgrad"):
        SpeedupSection(role_share={"fprop": 0.1, "dgrad": 0.1})
    with pytest.raises(pydantic.ValidationError, match="unknown format 'int4'"):
        SpeedupSection(throughput={"int4": 8})
    with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
        SpeedupSection(devices="b200")


def test_measured_throughput_is_used_only_when_both_ran_native(study):
    def runs(backend_x):
        return {
            "b0": {
                "config": "fp8",
                "baseline": True,
                "ppl": [8, 4],
                "backend": "native",
                "tokens_per_s": 1000.0,
            },
            "x0": {
                "config": "x",
                "fp4_gemms": "fprop+dgrad+wgrad",
                "ppl": [8, 4],
                "backend": backend_x,
                "tokens_per_s": 1300.0,
            },
        }

    cells, evals = study(runs("native"))
    x = per_config(per_cell(cells, evals, 4.0)).set_index("config").loc["x"]
    assert x["speedup_source"] == "measured" and x["throughput_gain"] == pytest.approx(1.3)
    cells, evals = study(runs("emulated"))
    x = (
        per_config(per_cell(cells, evals, 4.0), SpeedupSection(device="b200"))
        .set_index("config")
        .loc["x"]
    )
    assert x["speedup_source"] == "model:b200" and x["throughput_gain"] == pytest.approx(1.2)
    assert x["projected_speedup"] == pytest.approx(1.2)  # both reach at 200k tokens: cost 0


def test_the_report_reads_labels_without_torch():
    # the grammar of backends.recipes.intervention imports no torch, nor does what the report
    # reads labels with (its speedup model, its sort order, its plot styles)
    code = (
        "import sys, ablate.report.speedup, ablate.report.metrics, ablate.report.plots, "
        "ablate.study.speedup; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_label_is_charged_with_the_grammars_default_size():
    from ablate.report.speedup import intervention_costs
    from backends.recipes.intervention import DEFAULT_SIZE

    assert intervention_costs("dht") == intervention_costs(f"dht{DEFAULT_SIZE}")
    assert intervention_costs("sr+rht").points == DEFAULT_SIZE
    with pytest.raises(ReportError, match="only one Hadamard transform"):
        intervention_costs("rht16+dht16")


def test_speedup_module_and_package_import_without_pandas_or_matplotlib():
    code = (
        "import sys, ablate.report, ablate.report.speedup; "
        "bad = {'pandas', 'matplotlib', 'numpy'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- stats --------------------------------------------------------------------------------------


def test_t_quantiles_match_published_values():
    # two-sided 95% critical values from any t table
    for df, t in (
        (1, 12.7062),
        (2, 4.3027),
        (5, 2.5706),
        (10, 2.2281),
        (30, 2.0423),
        (120, 1.9799),
    ):
        assert t975(df) == pytest.approx(t, abs=1e-4)
    assert t975(math.inf) == pytest.approx(1.959964, abs=1e-6)


def test_t_quantiles_agree_with_scipy_at_fractional_degrees_of_freedom():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 1.3, 3.48, 7, 12.5, 33, 75, 500):
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-6)


def test_interventions_cost_throughput_in_the_model():
    from ablate.report.speedup import intervention_costs, role_interventions

    spec = SpeedupSection()  # hadamard 1% per 16 points, SR 1%, of the GEMM's BF16 time
    full = role_formats("fprop+dgrad+wgrad", "mxfp4", "fp8")
    base = role_formats("", "mxfp4", "fp8")

    def gain(intervention):
        return throughput_gain(
            full, base, spec, role_interventions("fprop+dgrad+wgrad", intervention)
        )

    # FP8 step 0.75; MXFP4 step 0.625 + 3 GEMMs x (1/6) x overhead
    assert gain("none") == pytest.approx(0.75 / 0.625)
    assert gain("dht16") == pytest.approx(0.75 / (0.625 + 0.5 * 0.01))
    assert gain("rht64") == pytest.approx(0.75 / (0.625 + 0.5 * 0.04))
    assert gain("sr") == pytest.approx(0.75 / (0.625 + 0.5 * 0.01))
    assert gain("sr+rht16") == pytest.approx(0.75 / (0.625 + 0.5 * 0.02))
    assert gain("none") > gain("dht16") > gain("sr+rht16") > gain("rht64")
    assert intervention_costs("sr+dht32") == (32, True, False, False)
    with pytest.raises(ReportError, match="unknown part 'xyz'"):
        intervention_costs("xyz")
    # interventions apply to the FP4 GEMMs only
    assert role_interventions("wgrad", "dht16") == {"wgrad": (16, False, False, False)}


def test_a_per_gemm_intervention_is_charged_gemm_by_gemm():
    # a named recipe whose GEMMs differ (NVIDIA's: SR on dgrad and wgrad, RHT16 on wgrad only)
    from ablate.report.speedup import role_interventions

    per = role_interventions("fprop+dgrad+wgrad", "fprop:none,dgrad:sr,wgrad:sr+fht16")
    assert per == {
        "fprop": (0, False, False, False),
        "dgrad": (0, True, False, False),
        "wgrad": (16, True, False, False),
    }
    spec = SpeedupSection(device="b200")  # runs NVFP4
    full = role_formats("fprop+dgrad+wgrad", "nvfp4", "fp8")
    base = role_formats("", "nvfp4", "fp8")
    uniform = role_interventions("fprop+dgrad+wgrad", "sr+fht16")
    assert throughput_gain(full, base, spec, per) > throughput_gain(full, base, spec, uniform)
    with pytest.raises(ReportError, match="ROLE:INTERVENTION"):
        role_interventions("wgrad", "wgard:sr")


def test_four_over_six_and_ms_eden_are_charged_on_the_gemms_that_use_them():
    from ablate.report.speedup import Costs, intervention_costs, role_interventions

    assert intervention_costs("sr+4over6+fht16") == Costs(16, True, True, False)
    assert intervention_costs("eden+rht128") == Costs(128, False, False, True)
    spec = SpeedupSection(device="b200")  # 4/6 and MS-EDEN 1% each by default
    full = role_formats("fprop+dgrad+wgrad", "nvfp4", "fp8")
    base = role_formats("", "nvfp4", "fp8")
    plain = throughput_gain(full, base, spec, role_interventions("fprop+dgrad+wgrad", "none"))
    four = throughput_gain(full, base, spec, role_interventions("fprop+dgrad+wgrad", "4over6"))
    # FP8 step 0.75; NVFP4 0.625 + 3 GEMMs x (1/6) x 0.01
    assert plain == pytest.approx(0.75 / 0.625)
    assert four == pytest.approx(0.75 / (0.625 + 0.5 * 0.01))
    qii = role_interventions(
        "fprop+dgrad+wgrad", "fprop:4over6,dgrad:eden+rht128,wgrad:eden+rht128"
    )
    want = 0.625 + (0.01 + 2 * (0.01 * 128 / 16 + 0.01)) / 6
    assert throughput_gain(full, base, spec, qii) == pytest.approx(0.75 / want)
    free = SpeedupSection(device="b200", scale_rule_overhead=0, eden_overhead=0)
    assert throughput_gain(full, base, free, role_interventions("fprop+dgrad+wgrad", "4over6")) == (
        pytest.approx(plain)
    )
    assert "Four Over Six" in spec.describe() and "MS-EDEN" in spec.describe()


def test_the_speedup_models_gemms_are_the_recipes():
    from ablate.study.speedup import ROLES
    from backends.recipes import GEMMS

    assert ROLES == GEMMS
