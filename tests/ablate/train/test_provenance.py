"""What produced a result, and what a cell's key stands for: provenance tags on every run, keys that
count the device and precision (not checkpoint frequency or folders), stale results after a code
change, adopting a study recorded under the old keys, and the target-headroom warning. Real MLflow
(SQLite under tmp_path), the in-process executor."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from click.testing import CliRunner

from ablate.cli import main
from ablate.driver.planning import plan, target_headroom
from ablate.driver.runner import run_study
from ablate.study import load_study, parse_study
from ablate.targets import Curve, headroom_warning, reached_fraction
from ablate.tracking import StudyTracker
from ablate.tracking.adopt import adoptable, legacy_config_hash
from ablate.train.provenance import code_hash, environment

# a GPU machine's check collects this folder's GPU tests without MLflow installed
MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient
from test_runner import tiny_study  # noqa: E402 (it needs MLflow too)

STUDY_YAML = """
name: t
base:
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 3, batch_size: 4, seq_len: 32, eval_every: 3, eval_batches: 4, warmup_steps: 2}
grid: {fp4_gemms: [[], [fprop, dgrad, wgrad]]}
resources: {cpus: 1}
"""
ENV_FIELDS = {
    "ablate_version", "git_commit", "git_dirty", "code_hash", "torch", "python", "device",
    "device_name", "precision", "backend",
}  # fmt: skip


def _runs(study):
    client = MlflowClient(tracking_uri=study.tracking_uri)
    exp = client.get_experiment_by_name(study.name)
    runs = client.search_runs(
        [exp.experiment_id], "tags.`ablate.role` = 'cell'", order_by=["start_time ASC"]
    )
    return client, {r.data.tags["ablate.key"]: r for r in runs}  # the newest run of each key


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A two-cell study run to the end, in its own folder."""
    study = tiny_study(tmp_path_factory.mktemp("prov"))
    run_study(study, executor="local", progress=False)
    return study


def test_every_run_records_its_code_device_and_precision(finished):
    _, runs = _runs(finished)
    for c in finished.cells:
        tags = runs[c.key].data.tags
        env = {k.removeprefix("env."): v for k, v in tags.items() if k.startswith("env.")}
        assert set(env) >= ENV_FIELDS
        assert env["device"] == "cpu" and env["precision"] == "fp32"
        assert env["backend"] == "emulated" and env["torch"] == torch.__version__
        assert env["code_hash"] == code_hash() and len(env["git_commit"]) in (40, 7)
        assert env["git_dirty"] in ("true", "false")


def test_params_leave_out_the_checkpoint_folder_and_frequency(finished):
    _, runs = _runs(finished)
    params = next(iter(runs.values())).data.params
    assert "checkpoint_dir" not in params and "train.checkpoint_every" not in params
    assert "device" not in params


def test_a_moved_output_folder_and_a_new_checkpoint_frequency_keep_the_results(finished, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(finished.output_dir, moved)
    raw = {
        "name": finished.name,
        "base": {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 4096},
            "train": {
                "steps": 6,
                "batch_size": 4,
                "seq_len": 32,
                "eval_every": 3,
                "eval_batches": 4,
                "warmup_steps": 2,
                "checkpoint_every": 1,
            },
        },
        "grid": {"fp4_gemms": [[], ["fprop", "dgrad", "wgrad"]], "seed": [0]},
        "resources": {"cpus": 1},
    }
    again = parse_study(raw, output=moved)
    assert [c.key for c in again.cells] == [c.key for c in finished.cells]
    assert [p.action for p in plan(again)] == ["skip", "skip"]


def test_the_key_counts_device_kind_and_precision_from_the_study_not_the_machine(tmp_path):
    cpu = tiny_study(tmp_path / "a")
    bf16 = tiny_study(tmp_path / "b")
    raw = bf16.file.model_dump(mode="python")
    raw["base"]["train"]["precision"] = "bf16"
    bf16 = parse_study(raw, output=tmp_path / "b")
    assert {c.config.device for c in cpu.cells} == {"cpu"}  # auto, resources.gpus 0
    assert not {c.key for c in cpu.cells} & {c.key for c in bf16.cells}
    raw = cpu.file.model_dump(mode="python")
    raw["resources"]["gpus"] = 1
    gpu = parse_study(raw, output=tmp_path / "c")
    assert {c.config.device for c in gpu.cells} == {"cuda"}
    assert not {c.key for c in cpu.cells} & {c.key for c in gpu.cells}


def test_a_result_from_other_training_code_is_marked_stale_and_rerun_on_request(tmp_path, capsys):
    study = tiny_study(tmp_path, steps=3, fp4_gemms=[[]], seed=[0])
    run_study(study, executor="local", progress=False)
    client, runs = _runs(study)
    (old,) = runs.values()
    client.set_tag(old.info.run_id, "env.code_hash", "0000000000000000")
    (p,) = plan(study)
    assert p.action == "skip" and "stale" in p.why and "--rerun-stale" in p.why
    from ablate.cli.study import _print_cells  # what `ablate status` prints

    _print_cells(study, as_json=False)
    out = capsys.readouterr().out
    assert "finished" in out and "stale" in out and "1 result(s) are stale" in out
    (p,) = plan(study, rerun_stale=True)
    assert p.action == "rerun" and p.fresh
    run_study(study, executor="local", progress=False, rerun_stale=True)
    _, runs = _runs(study)
    (new,) = runs.values()  # the newest run of the key
    assert new.info.run_id != old.info.run_id and new.data.tags["env.code_hash"] == code_hash()
    assert client.get_run(old.info.run_id).data.tags["ablate.status"] == "finished"  # kept
    assert list(study.output_dir.glob("cells/*.stale-*"))  # the old checkpoint kept aside
    assert [p.action for p in plan(study)] == ["skip"]
    _print_cells(study, as_json=False)
    assert "stale" not in capsys.readouterr().out


def test_a_study_recorded_under_the_old_keys_is_adopted_not_rerun(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY_YAML)
    study = load_study(path, output=tmp_path / "out")
    run_study(study, executor="local", progress=False)
    client, runs = _runs(study)
    # make it look like a study recorded before keys named the device and precision
    for c in study.cells:
        old = legacy_config_hash(c.config)
        client.set_tag(runs[c.key].info.run_id, "ablate.key", old)
        study.checkpoint_dir(c).rename(study.output_dir / "cells" / old)
    assert [p.action for p in plan(study)] == ["run", "run"]
    tracker = StudyTracker(study.tracking_uri, study.name)
    found, rerun = adoptable(study, tracker)
    assert rerun == []  # finished: adopted, though trained under older numerics
    assert sorted(a.cell.key for a in found) == sorted(c.key for c in study.cells)
    assert all(a.checkpoint and a.status == "finished" for a in found)
    # an output folder with no store (a typo): nothing to adopt, and nothing made there
    typo = study.output_dir.parent / "typo"
    res = CliRunner().invoke(main, ["adopt", "--yes", "-o", str(typo), str(path)])
    assert res.exit_code == 0 and "no MLflow store" in res.output and not typo.exists(), res.output
    res = CliRunner().invoke(main, ["adopt", "--yes", "-o", str(study.output_dir), str(path)])
    assert res.exit_code == 0, res.output
    assert "adopted 2 runs" in res.output
    assert [p.action for p in plan(study)] == ["skip", "skip"]
    _, runs = _runs(study)
    for c in study.cells:
        tags = runs[c.key].data.tags
        assert tags["ablate.legacy_key"] == legacy_config_hash(c.config)
        assert tags["env.adopted"] == "true"
        assert (study.checkpoint_dir(c) / "checkpoint.json").read_text().count(c.key) == 1
    assert adoptable(study, tracker) == ([], [])


def test_environment_names_the_device_kind_and_precision():
    from ablate.train.config import RunConfig, TrainConfig

    env = environment(RunConfig(device="cpu", train=TrainConfig(precision="bf16")))
    assert env["device"] == "cpu" and env["precision"] == "bf16"
    assert env["device_name"] and env["python"].count(".") == 2
    # a CPU's name says which of torch's vector kernels ran: they decide the last bits
    assert env["device_name"].endswith(f" ({torch.backends.cpu.get_cpu_capability()})")


# --- the target's headroom ------------------------------------------------------------------------


def test_validate_warns_from_the_schedule_when_the_baseline_reaches_the_target_at_the_end(
    tmp_path,
):
    study = tiny_study(tmp_path, steps=3)
    raw = study.file.model_dump(mode="python")
    raw["baseline"] = {"fp4_gemms": []}
    raw["target"] = {"from_baseline": "final", "tolerance": 0.05}
    path = tmp_path / "s.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["validate", "-o", str(tmp_path / "o"), str(path)])
    assert res.exit_code == 0, res.output
    assert "warning: the baseline reaches the target only at ~100% of its budget" in res.output
    assert "+0% tokens will show as not reached" in res.output
    assert "tolerance of 5% adds headroom" in res.output
    raw["target"] = {"from_baseline": "slowest"}  # 75%: no warning
    path.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["validate", "-o", str(tmp_path / "o"), str(path)])
    assert res.exit_code == 0 and "warning" not in res.output


def test_with_results_the_warning_comes_from_the_baselines_curves(finished):
    raw = finished.file.model_dump(mode="python")
    raw["baseline"] = {"fp4_gemms": []}
    raw["target"] = {"from_baseline": "final"}
    study = parse_study(raw, output=finished.output_dir)
    warning = target_headroom(study)
    assert warning is not None and "from its recorded curves" in warning
    raw["target"] = {"val_ppl": 1e6}  # reached at the first evaluation: no warning
    assert target_headroom(parse_study(raw, output=finished.output_dir)) is None


def test_headroom_is_the_median_baseline_seeds_fraction_of_its_budget():
    curves = [Curve.of([0, 50, 100], [9, 4, 2]), Curve.of([0, 50, 100], [9, 6, 4])]
    assert reached_fraction(curves, 4.0) == pytest.approx((0.5 + 1.0) / 2)
    assert headroom_warning(0.75, measured=True) is None
    w = headroom_warning(0.8, measured=True)
    assert w is not None and "+25%" in w
    assert math.isclose(reached_fraction(curves, 100.0), 0.0)


def test_a_moved_study_folder_gets_its_artifact_locations_repaired_on_open(tmp_path, capsys):
    from ablate.tracking import StudyTracker, default_uri, read_study_text

    study = tiny_study(tmp_path / "before", steps=2, fp4_gemms=[[]], seed=[0])
    run_study(study, executor="local", progress=False)
    moved = tmp_path / "after"
    shutil.move(study.output_dir, moved)
    uri = default_uri(moved)
    StudyTracker(uri, study.name)  # what run, report and ui open
    assert "artifact locations" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study.name)
    assert exp.artifact_location == (moved / "artifacts").resolve().as_uri()
    for run in client.search_runs([exp.experiment_id]):
        assert run.info.artifact_uri.startswith(exp.artifact_location + "/")
    assert read_study_text(uri, study.name) == study.text  # the parent's study.yaml, moved with it
    capsys.readouterr()
    StudyTracker(uri, study.name)  # nothing left to repair: silent
    assert "artifact locations" not in capsys.readouterr().err


def test_code_hash_leaves_out_only_sources_that_compute_no_run_number():
    from ablate.train import provenance

    root = provenance._ROOT
    for rel in provenance.NOT_NUMERICS:
        assert (root / rel).is_file(), rel  # a renamed file must not silently fall back in
    assert "backends/quant/quantizer.py" not in provenance.NOT_NUMERICS
    assert "ablate/train/loop.py" not in provenance.NOT_NUMERICS
