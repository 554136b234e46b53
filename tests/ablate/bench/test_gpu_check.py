"""The GPU check (``make gpu-check``, ``ablate.bench.gpu_check``) end to end on the CPU at toy sizes
(``--device cpu``): every stage in its own process, the study trained and reported without MLflow,
the summary; and the budget's rules (a stage with too little time left is skipped, one that runs
past its limit is stopped and the next ones still run)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ablate.bench import gpu_check

GPU_MACHINE_LACKS = ("ray", "mlflow", "optuna")
"""Packages a GPU machine's image does not have (docs/gpus.md): the check must run without them."""


@pytest.fixture
def without_ray_mlflow_optuna(tmp_path, monkeypatch):
    """Every stage's process as on a GPU machine: importing Ray, MLflow or Optuna fails."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Lacking:\n"
        f"    names = {GPU_MACHINE_LACKS!r}\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in self.names:\n"
        "            raise ModuleNotFoundError(f'{name} is not installed on a GPU machine')\n"
        "sys.meta_path.insert(0, _Lacking())\n"
    )
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )


@pytest.mark.slow
def test_the_gpu_check_runs_every_stage_on_the_cpu_and_writes_its_summary(
    tmp_path, capsys, without_ray_mlflow_optuna
):
    out = tmp_path / "check"
    assert gpu_check.main(["--device", "cpu", "--out", str(out), "--budget", "900"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    stages = {s["name"]: s for s in summary["stages"]}
    assert list(stages) == list(gpu_check.STAGES)
    assert all(s["status"] == "passed" for s in stages.values()), stages
    for s in stages.values():  # each stage's own log, written as it ran
        assert (out / s["log"]).read_text().strip()
    env = summary["environment"]
    assert env["device_name"] == "cpu" and env["torch"] and env["git_commit"]
    assert summary["native_check"]["results"] == {
        "fp8": "passed: fprop fp8_e4m3, dgrad fp8_e5m2|fp8_e4m3"
    }  # the CPU's own FP8 GEMM, checked uncached
    assert "collected only" in stages["tests"]["detail"]
    tests_log = (out / "tests.log").read_text()
    assert "ERROR collecting" not in tests_log, (
        tests_log
    )  # every module collects without Ray/MLflow
    assert "test_native_block_formats_match_emulated_on_the_gpu" in tests_log
    assert {m: r["status"] for m, r in summary["parallel"].items()} == {
        "ddp": "finished",
        "fsdp": "finished",
    }
    assert all(r["collectives"] == "gloo" for r in summary["parallel"].values())
    assert set(summary["bench"]["goals"]) >= {"emulated_mxfp4_step_over_bf16"}
    assert summary["bench"]["partial"] is False and (out / "bench.md").exists()
    assert not list(out.glob("20*"))  # the bench's files are named for the check
    study = summary["study"]
    assert len(study["cells"]) == 8 and all(c["status"] == "finished" for c in study["cells"])
    report = out / "study" / "report.md"
    assert report.exists() and (out / "study" / "summary.csv").exists()
    assert "mxfp4[fprop,dgrad,wgrad]+dht16" in report.read_text()
    md = (out / "summary.md").read_text()
    assert "| study | passed |" in md and "## Goals" in md
    assert "study: passed" in capsys.readouterr().out


def _ns(budget: float) -> argparse.Namespace:
    return argparse.Namespace(device="cpu", budget=budget, skip=[], scale=1.0, argv=[])


@pytest.fixture
def two_stages(monkeypatch):
    """``environment`` hangs (its process sleeps), ``tests`` prints and ends."""
    monkeypatch.setattr(gpu_check, "STAGES", ("environment", "tests"))
    monkeypatch.setattr(gpu_check, "LIMITS", {"environment": 2, "tests": 60})
    monkeypatch.setattr(gpu_check, "MINIMUM", {"environment": 1, "tests": 10})
    real = gpu_check.subprocess.Popen
    # the hanging stage also starts a child of its own that would write into the log later (as
    # pytest under the tests stage does): stopping the stage must stop it too
    late = "import time; time.sleep(3); print('the stage child wrote on', flush=True)"
    scripts = {
        "environment": "import subprocess, sys, time; print('started', flush=True); "
        f"subprocess.Popen([sys.executable, '-c', {late!r}]); time.sleep(30)",
        "tests": "print('RESULT: fine')",
    }

    def popen(cmd, **kw):
        stage = cmd[cmd.index("--stage") + 1]
        return real([sys.executable, "-c", scripts[stage]], **kw)

    monkeypatch.setattr(gpu_check.subprocess, "Popen", popen)


def test_a_stage_past_its_limit_is_stopped_and_the_next_one_still_runs(tmp_path, two_stages):
    stages = gpu_check.run_stages(_ns(100), tmp_path)
    assert [(s.name, s.status) for s in stages] == [
        ("environment", "timed out"),
        ("tests", "passed"),
    ]
    assert 2 <= stages[0].seconds < 10
    assert "started" in (tmp_path / "environment.log").read_text()  # its log survives
    assert stages[1].detail == "fine"
    time.sleep(2)  # the stage's child would have written by now, had it outlived the stage
    assert "child wrote on" not in (tmp_path / "environment.log").read_text()


def test_a_stage_without_its_minimum_time_left_is_skipped(tmp_path, two_stages):
    stages = gpu_check.run_stages(_ns(5), tmp_path)  # 5 s: the tests stage needs 10
    assert [(s.name, s.status) for s in stages] == [
        ("environment", "skipped"),
        ("tests", "skipped"),
    ]
    assert "out of time" in stages[1].detail and not (tmp_path / "tests.log").exists()


def test_a_summary_without_the_environment_stage_still_names_torch_and_the_commit(tmp_path):
    """The second command of a short loan skips the environment stage (an H100's summary of
    2026-11-27 then read "torch ?, ... commit ?"): the summary asks this process instead."""
    import torch

    args = _ns(100)
    args.skip = ["environment"]
    study = gpu_check.Stage("study")
    study.status, study.seconds, study.detail = "passed", 1.0, "fine"
    md = gpu_check.summarize([study], tmp_path, args, 1.0).read_text()
    head = md.splitlines()[:4]
    assert head[0].startswith("# GPU check, cpu, 20"), head
    assert f"torch {torch.__version__}," in head[3] and "?" not in head[3], head


def test_the_study_projects_with_the_profile_of_the_gpu_it_trained_on():
    """An H100's check reported a projected speedup from the MI355X's model (the study's default):
    each known arch now names a profile of ``speedup.device``, with the same native formats."""
    from ablate.bench.gpu_study import ARCH_PROFILES
    from ablate.study.speedup import DEVICES, format_name
    from backends.gemm.capabilities import CAPABILITIES

    for arch, profile in ARCH_PROFILES.items():
        assert profile in DEVICES, (arch, profile)
        native = {format_name(f) for f in CAPABILITIES[arch]} if arch in CAPABILITIES else set()
        assert native <= set(DEVICES[profile].throughput), (arch, native)


def test_bad_arguments_are_refused_naming_them(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "tpu"])
    assert "--device must be cuda or cpu" in capsys.readouterr().err


@pytest.mark.slow
def test_a_study_stopped_at_its_limit_reports_the_cells_it_trained(tmp_path):
    """The check stops a stage past its limit with SIGTERM first: the study stage then reports the
    cells it had trained and says which it had not (on an H100 on 2026-11-27 the study stage was
    killed after two of its eight cells, with no report)."""
    root = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "ablate.bench.gpu_check", "--stage", "study", "--device", "cpu"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=root, env=env
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # stopped as the fifth cell trains
        seen.append(line)
        if sum(": finished, final val loss" in x for x in seen) == 4:
            proc.send_signal(signal.SIGTERM)
            break
    seen += proc.stdout.read().splitlines(keepends=True)
    assert proc.wait() == 1, "".join(seen)
    said = "".join(seen)
    assert "RESULT: stopped at its time limit after" in said
    summary = json.loads((tmp_path / "study.json").read_text())
    assert summary["partial"] is True
    trained = [c["label"] for c in summary["cells"]]
    assert 4 <= len(trained) < 8 and len(trained) + len(summary["not_trained"]) == 8
    assert trained[:2] == ["bf16/backend=emulated/seed0", "bf16/backend=emulated/seed1"]
    assert all(c["status"] == "finished" for c in summary["cells"])
    report = (tmp_path / "study" / "report.md").read_text()
    assert report.startswith("**Partial**: the check's time ran out after")
    assert all(label in report for label in summary["not_trained"])
    assert "fp8" in report and (tmp_path / "study" / "summary.csv").exists()


def test_a_stage_past_its_limit_gets_sigterm_and_time_to_report(tmp_path, monkeypatch):
    """SIGTERM at the limit, SIGKILL a grace later: the study stage reports in between."""
    monkeypatch.setattr(gpu_check, "STAGES", ("environment", "tests"))
    monkeypatch.setattr(gpu_check, "LIMITS", {"environment": 2, "tests": 60})
    monkeypatch.setattr(gpu_check, "MINIMUM", {"environment": 1, "tests": 10})
    real = subprocess.Popen
    script = (
        "import signal, sys, time\n"
        "def on_term(*_):\n"
        "    time.sleep(0.2); print('RESULT: reported what it had', flush=True); sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, on_term); print('started', flush=True); time.sleep(30)\n"
    )

    def popen(cmd, **kw):
        stage = cmd[cmd.index("--stage") + 1]
        return real([sys.executable, "-c", script if stage == "environment" else "pass"], **kw)

    monkeypatch.setattr(gpu_check.subprocess, "Popen", popen)
    stages = gpu_check.run_stages(_ns(100), tmp_path)
    assert (stages[0].status, stages[0].detail) == ("timed out", "reported what it had")
    assert 2 <= stages[0].seconds < 2 + 0.5 + 1  # the limit, within its grace of a quarter


def test_the_tests_stage_runs_every_gpu_test_where_it_has_workers(tmp_path):
    """One process runs the three rehearsals of ``REHEARSALS``; pytest-xdist's workers run all
    ten (an H200's 8 workers ran the 26 GPU tests in 352 s, 2026-11-29)."""
    one = gpu_check.tests_command(tmp_path, cpu=False, workers=0)
    assert "-n" not in one and any(g in one[one.index("-k") + 1] for g in gpu_check.REHEARSALS)
    many = gpu_check.tests_command(tmp_path, cpu=False, workers=8)
    assert many[many.index("-n") + 1] == "8" and "-k" not in many
    assert "tests/ablate/train/test_compile_rehearsal.py" in many and "-v" in many


def test_a_stage_stopped_at_its_limit_says_where_it_was(tmp_path):
    """The H200's parallel stage of 2026-11-29 ended at its limit with no word of where fsdp was
    (compiling or waiting): a stage's SIGTERM dumps its threads' stacks into its log first."""
    root = Path(__file__).resolve().parents[3]
    code = (
        "import sys, time\n"
        "from ablate.bench import gpu_check\n"
        "def hang(args, out):\n"
        "    print('hanging', flush=True); time.sleep(60)\n"
        "gpu_check._STAGE_FUNCS['environment'] = hang\n"
        "gpu_check.main(['--stage', 'environment', '--device', 'cpu', '--out', "
        f"{str(tmp_path)!r}])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=root, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "hanging\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # then ends as SIGTERM ends it
    assert "in hang" in err and "Current thread" in err, err
