"""Probes end to end: a study with a probe: section logs the probe metrics into each cell's MLflow
run and its report grows the probe section; `ablate probe` runs the same probes on the saved
checkpoints (the numbers the run logged at that step), refuses checkpoints and cells that are not
the study's, and with --log records into a run that trained without probes."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from ablate.cli import main
from ablate.study import load_study
from ablate.tracking import read_histories, read_metric_keys, study_status

STUDY = """
name: probetest
base:
  model: {preset: tiny, n_layers: 2}
  data: {val_tokens: 4096}
  train: {steps: 4, batch_size: 4, seq_len: 32, eval_every: 2, eval_batches: 4,
          warmup_steps: 1}
  base_format: fp8
grid:
  - fp4_gemms: [[]]
  - fp4_gemms: [[fprop, dgrad, wgrad]]
    intervention: [none, sr]
baseline: {fp4_gemms: []}
"""
PROBE = "probe: {every: 2, gemms: [fprop, dgrad, wgrad], window: 2}\n"

pytestmark = pytest.mark.slow


def _run(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["run", str(p), "-o", str(out), "--executor", "local", "--quiet"]
    )
    assert res.exit_code == 0, res.output
    return p, out


def _logged(study):
    runs = {cs.cell.label: cs.run.run_id for cs in study_status(study)}
    names = read_metric_keys(study.tracking_uri, list(runs.values()), prefix="probe.")
    return runs, names


def test_a_probed_study_logs_probes_reports_them_and_probes_its_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p, out = _run(tmp_path, STUDY + PROBE)
    study = load_study(p, output=out)
    runs, names = _logged(study)
    for label, rid in runs.items():
        assert {"probe.wgrad.rel_err", "probe.fprop.cos.L1", "probe.dgrad.dy.sat"} <= set(
            names[rid]
        ), label  # the FP8 baseline's GEMMs are quantized too: probed
    rid = runs["mxfp4[fprop,dgrad,wgrad]+sr/fp8"]
    hist = read_histories(study.tracking_uri, [rid], ["probe.wgrad.rel_err"])[rid]
    assert [s for s, _ in hist["probe.wgrad.rel_err"]] == [0, 2, 4]
    md = (tmp_path / "reports" / "probetest" / "report.md").read_text()
    assert "## Gradient fidelity (probes)" in md and "probe_structure.png" in md
    # post hoc on the saved (last) checkpoints: the numbers logged at step 4
    res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--csv", "p.csv"])
    assert res.exit_code == 0, res.output
    assert "mxfp4[fprop,dgrad,wgrad]+sr/fp8 @ step 4:" in res.output
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert {r["label"] for r in rows} == set(runs) and {r["step"] for r in rows} == {"4"}
    got = {r["metric"]: float(r["value"]) for r in rows if r["label"].endswith("+sr/fp8")}
    logged = read_histories(study.tracking_uri, [rid], ["probe.wgrad.rel_err", "probe.fprop.cos"])
    assert got["probe.wgrad.rel_err"] == pytest.approx(logged[rid]["probe.wgrad.rel_err"][-1][1])
    assert got["probe.fprop.cos"] == pytest.approx(logged[rid]["probe.fprop.cos"][-1][1])
    # two checkpoints of one cell, given explicitly, are probed in step order
    key = study.cells[1].key
    ck = out / "cells" / key
    res = CliRunner().invoke(
        main, ["probe", str(p), "-o", str(out), "--checkpoint", str(ck), "--checkpoint",
               str(ck / "checkpoint.pt"), "--csv", "q.csv"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.output.count("@ step 4") == 2 and "step_cos" in res.output  # history ran on
    # --csv where the study recorded (its store, a checkpoint), the study file or a folder:
    # refused before anything is probed, every file as it was
    db = out / "mlflow.db"
    kept = {f: f.read_bytes() for f in (db, p, ck / "checkpoint.pt")}
    for bad, says in [
        (db, "inside the study's output folder"),
        (ck / "checkpoint.pt", "inside the study's output folder"),
        (p, "is the study file"),
        (tmp_path, "is a folder"),
    ]:
        res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--csv", str(bad)])
        assert res.exit_code == 2 and says in res.output and "@ step" not in res.output, res
    assert all(f.read_bytes() == b for f, b in kept.items())
    # refusals: a cell that is not the study's, a checkpoint of another configuration
    res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--cell", "nope"])
    assert res.exit_code == 2 and "nope: no such cell" in res.output
    res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--device", "tpu"])
    assert res.exit_code == 2 and "--device" in res.output and "auto, cpu, cuda" in res.output
    other = tmp_path / "other.pt"
    import torch

    obj = torch.load(ck / "checkpoint.pt", weights_only=False)
    obj["config_hash"] = "0" * 16
    torch.save(obj, other)
    res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--checkpoint", str(other)])
    assert res.exit_code == 2 and "written by no cell of study probetest" in res.output
    # a checkpoint the file system cannot read (an I/O error: /proc/self/mem at offset 0) is no
    # refusal (exit 2) but a failure: exit 1 in one line naming the file, not a traceback
    (ck / "checkpoint.pt").rename(tmp_path / "kept.pt")
    (ck / "checkpoint.pt").symlink_to("/proc/self/mem")
    res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--cell", key])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert f"Input/output error: '{ck / 'checkpoint.pt'}'" in res.output, res.output


def test_probe_log_adds_probes_to_a_study_that_trained_without_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p, out = _run(tmp_path, STUDY)
    study = load_study(p, output=out)
    runs, names = _logged(study)
    assert not any(names.values())
    assert "Gradient fidelity" not in (tmp_path / "reports" / "probetest" / "report.md").read_text()
    p.write_text(STUDY + PROBE)  # the same cells (probes are not in their keys)
    res = CliRunner().invoke(main, ["plan", str(p), "-o", str(out), "--json"])
    assert {c["action"] for c in json.loads(res.stdout)["cells"]} == {"skip"}
    res = CliRunner().invoke(main, ["probe", str(p), "-o", str(out), "--log"])
    assert res.exit_code == 0, res.output
    runs, names = _logged(load_study(p, output=out))
    rid = runs["mxfp4[fprop,dgrad,wgrad]/fp8"]
    assert "probe.wgrad.sum_ratio" not in names[rid]  # one probe: no history
    hist = read_histories(study.tracking_uri, [rid], ["probe.wgrad.cos"])[rid]
    assert [s for s, _ in hist["probe.wgrad.cos"]] == [4]
    res = CliRunner().invoke(main, ["report", str(p), "--runs", str(out), "-o", "r"])
    assert res.exit_code == 0, res.output
    assert "## Gradient fidelity (probes)" in (tmp_path / "r" / "report.md").read_text()
