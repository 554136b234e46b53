"""The report's probe section from hand-built probe metrics: present only when there are probes,
its table holds the final and late values per configuration and GEMM (means over seeds), its three
figures are written and embedded."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ablate.report import build_report
from ablate.report.probes import by_config, layer_matrix, probe_keys, probe_table

CONFIGS = {
    "fp8": {"baseline": True, "fp4_gemms": "", "intervention": "none"},
    "mxfp4+none": {"fp4_gemms": "fprop+dgrad+wgrad", "intervention": "none"},
    "mxfp4+sr": {"fp4_gemms": "fprop+dgrad+wgrad", "intervention": "sr"},
}
STEPS = [0, 10, 20, 30, 40]


def _probes(runs):
    """Known probe values: rel_err = base + seed/100 at every step; step_cos by config."""
    rows = []
    for key, spec in runs.items():
        cfg, seed = spec["config"], spec["seed"]
        base = {"fp8": 0.01, "mxfp4+none": 0.15, "mxfp4+sr": 0.2}[cfg]
        cos = {"fp8": 0.9, "mxfp4+none": 0.6, "mxfp4+sr": 0.01}[cfg]
        for s in STEPS:
            for g in ("dgrad", "wgrad"):
                rows.append((key, s, f"probe.{g}.rel_err", base + seed / 100))
                rows.append((key, s, f"probe.{g}.align", 1.0 - base / 4))
                rows.append((key, s, f"probe.{g}.cos", 1.0 - base / 10))
                for b in range(2):
                    rows.append((key, s, f"probe.{g}.rel_err.L{b}", base + b / 10))
            if s:
                rows.append((key, s, "probe.wgrad.step_cos", cos + (s >= 20) * 0.1))
                rows.append((key, s, "probe.cost", 2.0 + seed))
            if s >= 30:
                rows.append((key, s, "probe.wgrad.sum_ratio", 0.5 + cos / 2))
    return pd.DataFrame(rows, columns=["key", "step", "metric", "value"])


@pytest.fixture
def runs():
    return {
        f"{c}-{seed}": {"config": c, "seed": seed, "ppl": [50, 20, 10, 8], **extra}
        for c, extra in CONFIGS.items()
        for seed in (0, 1)
    }


def test_probe_section_reports_final_and_late_values_per_configuration_and_gemm(
    tmp_path, study, runs
):
    cells, evals = study(runs)
    probes = _probes(runs)
    res = build_report(
        cells, evals, {"val_ppl": 12}, None, tmp_path, study="p", probes=probes,
        probe_settings={"every": 10, "window": 4},
    )  # fmt: skip
    md = res.report_md.read_text()
    assert "## Gradient fidelity (probes)" in md and "Settings: every 10, window 4" in md
    assert "cost 2.50x a training step (median; 2.00-3.00x)" in md
    for name in ("probe_metrics", "probe_layers", "probe_structure"):
        assert (tmp_path / f"{name}.png").exists() and (tmp_path / f"{name}.svg").exists()
        assert f"({name}.png)" in md
    assert md.index("Gradient fidelity") < md.index("## Runs")
    html = res.report_html.read_text()
    plain = build_report(cells, evals, {"val_ppl": 12}, None, tmp_path / "plain", study="p")
    base = plain.report_html.read_text().count("data:image/png;base64")
    assert html.count("data:image/png;base64") == base + 3  # the 3 probe figures, embedded
    agg = by_config(res.cell_table, probes)
    t = probe_table(res.config_table, agg).set_index(["config", "gemm"])
    assert list(t.index.get_level_values("gemm").unique()) == ["dgrad", "wgrad"]
    assert t.loc[("mxfp4+none", "wgrad"), "rel_err"] == pytest.approx(0.155)  # seeds 0.15, 0.16
    # late = from 50% of the last probe step (20 of 40) on: step_cos 0.6 + 0.1
    assert t.loc[("mxfp4+none", "wgrad"), "step_cos"] == pytest.approx(0.7)
    assert t.loc[("mxfp4+sr", "wgrad"), "sum_ratio"] == pytest.approx(0.505)
    assert math.isnan(t.loc[("mxfp4+sr", "dgrad"), "step_cos"])
    mat, blocks = layer_matrix(agg, "mxfp4+sr")
    assert blocks == [0, 1]
    np.testing.assert_allclose(mat, [[np.nan, 0.2, 0.2], [np.nan, 0.3, 0.3]])


def test_no_probe_section_without_probes(tmp_path, study, runs):
    cells, evals = study(runs)
    empty = pd.DataFrame(columns=["key", "step", "metric", "value"])
    for probes in (None, empty):
        res = build_report(
            cells, evals, {"val_ppl": 12}, None, tmp_path, study="p", probes=probes, figures=()
        )
        assert "Gradient fidelity" not in res.report_md.read_text()
        assert "probe_metrics" not in res.figures


def test_the_report_reads_the_probe_metrics_it_shows():
    names = [
        "probe.wgrad.rel_err", "probe.wgrad.rel_err.L3", "probe.wgrad.cos.L3",
        "probe.wgrad.dy.sat", "probe.wgrad.step_cos", "probe.cost", "probe.seconds",
        "probe.fprop.sum_ratio", "train_loss",
    ]  # fmt: skip
    assert probe_keys(names) == [
        "probe.cost", "probe.fprop.sum_ratio", "probe.wgrad.rel_err", "probe.wgrad.rel_err.L3",
        "probe.wgrad.step_cos",
    ]  # fmt: skip
