"""``ablate slurm``: its help, the batch script ``submit`` writes (``--dry-run``), and every refusal
that needs no cluster: outside an allocation, a node list that does not parse, a cell larger than
a node, a bad ``ABLATE_*`` switch, a port of the job's that another process holds, a bad ``--time``,
a cell interrupted on data that prepare to other tokens now (as ``ablate run`` refuses it); each
exits 2 in seconds, naming what is wrong, before anything starts (nothing written, no Ray)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner
from test_stale_data import _recorded, _setup

from ablate.cli import main
from ablate.slurm.ports import JobPorts

STUDY = """name: slurm-cli
base:
  model: {preset: tiny}
  data: {corpus: builtin}
  train: {steps: 2, batch_size: 2, seq_len: 16, eval_every: 2}
  device: cpu
grid: {seed: [0, 1]}
"""

ENV = {
    "SLURM_JOB_ID": "31337",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "n1",
}


@pytest.fixture
def study(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(STUDY)
    return p


def _clean_env(monkeypatch):
    import os

    for k in list(os.environ):
        if k.startswith(("SLURM_", "SLURMD_")):
            monkeypatch.delenv(k)


def test_help_names_both_commands_with_examples():
    res = CliRunner().invoke(main, ["slurm", "--help"])
    assert res.exit_code == 0 and "run " in res.output and "submit " in res.output
    for cmd in ("run", "submit"):
        res = CliRunner().invoke(main, ["slurm", cmd, "--help"])
        assert res.exit_code == 0 and "Example:" in res.output, res.output


def test_dry_run_prints_a_requeueable_script_that_forwards_the_signals(study, tmp_path):
    out = tmp_path / "out"
    args = ["slurm", "submit", str(study), "--nodes", "2", "--time", "1:00:00", "--partition",
            "debug", "-o", str(out), "--sbatch-arg=--account=fp4", "--no-report", "--dry-run"]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    script = res.output
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=1",
                 "#SBATCH --time=1:00:00", "#SBATCH --partition=debug", "#SBATCH --requeue",
                 "#SBATCH --signal=B:USR1@300", "#SBATCH --open-mode=append",
                 f"#SBATCH --output={out}/slurm/job-%j.out", "#SBATCH --account=fp4",
                 'scontrol requeue "$SLURM_JOB_ID"'):  # fmt: skip
        assert line in script.splitlines() or f"    {line}" in script.splitlines(), line
    assert f"{sys.executable} -m ablate.cli slurm run {study} -o {out} --no-report &" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not out.exists()  # a dry run writes nothing


def test_the_cpus_per_node_follow_the_cells_and_gpus(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text(STUDY.replace("device: cpu", "device: cuda") + "resources: {cpus: 4, gpus: 1}\n")
    args = ["slurm", "submit", str(p), "--nodes", "1", "--gpus-per-node", "8", "--time", "30",
            "--dry-run"]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "#SBATCH --cpus-per-task=32" in res.output  # 8 cells of 4 CPUs
    assert "#SBATCH --gpus-per-node=8" in res.output


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--time", "forever"], "--time 'forever': not a SLURM time limit"),
        (["--time", "5", "--signal-lead", "300"], "--time 5 (300 s) with --signal-lead 300"),
        (["--time", "3", "--signal-lead", "100"], "every attempt would stop before its cells"),
        (["--time", "30", "--cpus-per-node", "1", "--sbatch-arg=--qos=high"], None),
        # what would not stay one #SBATCH line: the rest would run as a command of the script
        (["--time", "30", "--sbatch-arg", "--account=x\necho INJECTED"], "control character"),
        (["--time", "30", "--partition", "gpu\nid"], "--partition 'gpu\\nid': holds a control"),
        (["--time", "30", "-o", "out\nx"], "-o/--output"),
        # not an option, or one the script sets itself (and checks)
        (["--time", "30", "--sbatch-arg", "notanoption"], "not an sbatch option"),
        (["--time", "30", "--sbatch-arg", "--time=5"], "depend on it): use --time"),
        (["--time", "30", "--sbatch-arg=-c4"], "use --cpus-per-node"),
        (["--time", "30", "--sbatch-arg=--no-requeue"], "sets this option itself"),
    ],
)
def test_submit_refuses_bad_options_naming_them(study, extra, says):
    res = CliRunner().invoke(
        main, ["slurm", "submit", str(study), "--nodes", "1", *extra, "--dry-run"]
    )
    if says is None:
        assert res.exit_code == 0, res.output
        return
    assert res.exit_code == 2 and says in res.output, res.output


def test_submit_refuses_a_cell_larger_than_a_node_as_asked(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(STUDY + "resources: {cpus: 8}\n")
    args = ["slurm", "submit", str(p), "--nodes", "2", "--time", "30", "--cpus-per-node", "4"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert "resources: a cell asks for 8 CPU(s)" in res.output
    assert "--cpus-per-node 4, --gpus-per-node 0" in res.output


def test_run_outside_an_allocation_is_refused(study, monkeypatch):
    _clean_env(monkeypatch)
    res = CliRunner().invoke(main, ["slurm", "run", str(study)])
    assert res.exit_code == 2
    assert "not inside a SLURM allocation (SLURM_JOB_ID is not set)" in res.output


def test_run_refuses_a_node_list_it_cannot_parse(study, monkeypatch):
    _clean_env(monkeypatch)
    for k, v in {**ENV, "SLURM_JOB_NODELIST": "n[1-2"}.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(main, ["slurm", "run", str(study)])
    assert res.exit_code == 2
    assert "SLURM_JOB_NODELIST='n[1-2' does not parse as a SLURM host list" in res.output


def test_run_refuses_a_cell_larger_than_the_nodes(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    p = tmp_path / "big.yaml"
    p.write_text(STUDY + "resources: {cpus: 3}\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["slurm", "run", str(p), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "resources: a cell asks for 3 CPU(s) and 0 GPU(s) per worker" in res.output
    assert "job 31337's nodes hold n1: 2 CPUs, n2: 2 CPUs" in res.output
    assert not out.exists()


def test_run_refuses_a_bad_switch_before_anything_starts(study, tmp_path, monkeypatch):
    """The ABLATE_* switches were checked only by the study's run, once the job's Ray was up."""
    _clean_env(monkeypatch)
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ABLATE_COMPILE", "maybe")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["slurm", "run", str(study), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "environment variable ABLATE_COMPILE: unknown 'maybe'" in res.output, res.output
    assert not out.exists()


def test_submit_refuses_a_bad_switch_before_the_job_is_submitted(study, tmp_path, monkeypatch):
    """The job inherits the submitter's environment: a bad ABLATE_* switch failed it only once it
    left the queue (its `slurm run` refuses it); `submit` refuses it first, script unwritten."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("ABLATE_COMPILE", "maybe")
    out = tmp_path / "out"
    args = ["slurm", "submit", str(study), "--nodes", "1", "--time", "5", "-o", str(out)]
    res = CliRunner().invoke(main, [*args, "--dry-run"])
    assert res.exit_code == 2, res.output
    assert "environment variable ABLATE_COMPILE: unknown 'maybe'" in res.output, res.output
    assert "#SBATCH" not in res.output and not out.exists()


def test_the_switches_submit_looks_for_are_those_the_readers_check(monkeypatch):
    """``slurm submit`` checks the switches (importing torch) only where one of ``SWITCHES`` is
    set: a switch a reader checks but the list lacks would go unchecked there."""
    import re
    from pathlib import Path

    from ablate.cli.common import SWITCHES
    from ablate.driver.preflight import check_environment
    from ablate.errors import CannotRunError

    root = Path(__file__).resolve().parents[3] / "backends"
    read = {
        m
        for f in root.rglob("*.py")
        for m in re.findall(r"""(?:flag|choice|text)\(\s*["'](ABLATE_[A-Z_]+)["']""", f.read_text())
    }
    assert read == set(SWITCHES)
    for name in SWITCHES:
        for other in SWITCHES:
            monkeypatch.delenv(other, raising=False)
        monkeypatch.setenv(name, "maybe")
        with pytest.raises(CannotRunError, match=name):
            check_environment()


def test_run_refuses_when_a_port_of_the_job_is_taken_on_its_node(study, tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "out"
    with socket.socket() as s:  # as a Ray left by an earlier run in this job would
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", JobPorts(31337).gcs))
        s.listen()
        res = CliRunner().invoke(main, ["slurm", "run", str(study), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert f"node n1: port {JobPorts(31337).gcs} (for Ray's GCS) is taken by pid" in res.output
    assert "another job's Ray or MLflow on this node" in res.output
    assert not out.exists()


def test_a_submission_sbatch_refuses_leaves_no_folder_behind(study, tmp_path, monkeypatch):
    """The job's output folder is made for sbatch (the job writes there as it starts), and goes
    again with every folder made for it when nothing was submitted (here: no sbatch on PATH)."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    out = tmp_path / "new" / "out"
    res = CliRunner().invoke(
        main, ["slurm", "submit", str(study), "--nodes", "1", "--time", "30", "-o", str(out)]
    )
    assert res.exit_code == 2 and "no `sbatch` on PATH" in res.output, res.output
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("prepared", [False, True])
def test_run_refuses_a_cell_interrupted_on_changed_data_as_run_does(
    prepared, tmp_path, monkeypatch
):
    """Planned without preparing the data, a requeued job took such a cell for one to resume and
    started Ray (the study's run refused it only then); once the data were prepared it took the
    cell for one that had ended and exited 0 without a word of it."""
    s = _setup(tmp_path, monkeypatch)  # one cell, interrupted at step 4
    _clean_env(monkeypatch)
    for k, v in {**ENV, "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "2"}.items():
        monkeypatch.setenv(k, v)
    with open(tmp_path / "corp" / "v.txt", "a") as f:
        f.write("more text appended\n")
    if prepared:
        assert CliRunner().invoke(main, ["data", "prepare", "c1.yaml", "-o", "out"]).exit_code == 0
    before = _recorded(s)
    res = CliRunner().invoke(main, ["slurm", "run", "c1.yaml", "-o", "out", "--quiet"])
    assert res.exit_code == 2, res.output
    assert "than data.val.path corp/v.txt prepares to now" in res.output, res.output
    assert "--rerun-stale" in res.output and "Traceback" not in res.output
    assert "Ray" not in res.output and "nothing to run" not in res.output
    assert _recorded(s) == before
    args = ["slurm", "submit", "c1.yaml", "--nodes", "1", "--time", "30", "--rerun-stale"]
    res = CliRunner().invoke(main, [*args, "--dry-run"])
    assert res.exit_code == 0 and " --rerun-stale &" in res.output, res.output
