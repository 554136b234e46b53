"""``ablate slurm submit``: the sbatch script that runs ``ablate slurm run`` on an allocation of its
own, and its submission.

The job is requeueable (``--requeue``) and asks for SIGUSR1 ``lead`` seconds before its time limit
(``--signal=B:USR1@<lead>``, to the batch script only). The script runs the driver in the
background and forwards that signal (and SIGTERM) to it, waits until the driver has stopped the
cells at a checkpoint, and then requeues the job itself: SLURM requeues a preempted job, not one
that reaches its time limit. The requeued job (same id, ``SLURM_RESTART_COUNT`` one higher, the
output file appended to) resumes every interrupted cell from its checkpoint.

One node runs the driver, Ray's head and the job's MLflow server; each node one task holding that
node's CPUs (``--ntasks-per-node=1 --cpus-per-task``), as Ray's own guide for SLURM has it.
"""

from __future__ import annotations

import contextlib
import math
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.slurm.allocation import Allocation, SlurmError, check_fits

if TYPE_CHECKING:
    from ablate.study import Study

INTERRUPTED = 130
"""``ablate slurm run``'s exit status when its cells stopped at a checkpoint to resume later."""
EARLY_S = 60
"""How early SLURM may send ``--signal`` (its timer looks every 30 s; its manual says 60)."""
WORK_S = 300
"""The least time a job must have between its start and the earliest signal: its start-up (Ray,
the server, the cells' own start: one to two minutes on a loaded 2-core machine) and some
training. A shorter one requeues forever, a step at a time (seen with --time 3, lead 100)."""

_TIME = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)


def parse_time(text: str) -> int | None:
    """SLURM's ``--time`` in seconds (None: ``UNLIMITED``): minutes, minutes:seconds,
    hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds.
    ``SlurmError`` naming ``--time`` for anything else."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(t)
    if not m or t in ("0", ""):
        raise SlurmError(
            f"--time {text!r}: not a SLURM time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
            "D-HH:MM:SS), or zero"
        )
    g = {k: int(v) if v else 0 for k, v in m.groupdict().items()}
    if m.group("d") is not None:
        return ((g["d"] * 24 + g["dh"]) * 60 + g["dm"]) * 60 + g["ds"]
    if m.group("c") is not None:  # hours:minutes:seconds
        return (g["a"] * 60 + g["b"]) * 60 + g["c"]
    return g["a"] * 60 + g["b"]  # minutes[:seconds]


@dataclass
class Submission:
    """What ``ablate slurm submit`` asks SLURM for, and the ``ablate slurm run`` the job runs."""

    study_file: Path
    output: Path
    nodes: int
    time: str
    gpus_per_node: int = 0
    cpus_per_node: int | None = None
    """None: ``default_cpus`` of the study."""
    partition: str | None = None
    signal_lead: int = 300
    sbatch_args: list[str] = field(default_factory=list)
    run_args: list[str] = field(default_factory=list)
    """More options of ``ablate slurm run`` (``--tracking-uri``, ``--no-report``, ...)."""


def default_cpus(study: Study, gpus_per_node: int) -> int:
    """CPUs per node when ``--cpus-per-node`` is not given: a cell's ``resources.cpus`` (rounded up)
    times the cells a node's GPUs hold (one cell per node for a CPU study)."""
    res = study.file.resources
    cells = int(gpus_per_node // res.gpus) if res.gpus > 0 else 1
    return math.ceil(res.cpus) * max(1, cells)


MANAGED = {
    "nodes": "--nodes", "N": "--nodes", "ntasks-per-node": "", "cpus-per-task": "--cpus-per-node",
    "c": "--cpus-per-node", "gpus-per-node": "--gpus-per-node", "time": "--time", "t": "--time",
    "partition": "--partition", "p": "--partition", "requeue": "", "no-requeue": "",
    "signal": "--signal-lead", "open-mode": "", "output": "-o/--output", "o": "-o/--output",
    "chdir": "", "D": "",
}  # fmt: skip
"""sbatch options the script sets itself (long and short names), each with the option of ``ablate
slurm submit`` that sets it ("": none, the job needs it as it is): one given again with
``--sbatch-arg`` would override it behind the check (``--time=5`` under a signal lead computed for
``--time 30``), or break the requeue, the signal or the job's output file."""


def check_sbatch_args(sub: Submission) -> None:
    """Refuse what cannot go into the script as one ``#SBATCH`` line: a control character (a
    newline would end the line and make the rest a command of the script) in any value the script
    writes, an ``--sbatch-arg`` that is not an option, or one the script sets itself."""
    values = {
        "--sbatch-arg": sub.sbatch_args,
        "--partition": [sub.partition or ""],
        "--time": [sub.time],
        "the study file's path": [str(sub.study_file)],
        "-o/--output": [str(sub.output)],
    }
    for name, vs in values.items():
        for v in vs:
            one_line(name, v)
    for arg in sub.sbatch_args:
        if not arg.startswith("-") or arg in ("-", "--"):
            raise SlurmError(
                f"--sbatch-arg {arg!r}: not an sbatch option (e.g. --account=NAME, --qos=NAME)"
            )
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else arg[1:2]
        if key in MANAGED:
            instead = f": use {MANAGED[key]}" if MANAGED[key] else ""
            raise SlurmError(
                f"--sbatch-arg {arg!r}: the script sets this option itself (the requeue, the "
                f"signal and the checks depend on it){instead}"
            )


def one_line(name: str, value: str) -> None:
    """``SlurmError`` naming ``name`` when ``value`` holds a control character: the batch script
    writes it on one line (a newline would end an ``#SBATCH`` line and make the rest a command)."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise SlurmError(
            f"{name} {value!r}: holds a control character (a newline, a tab, ...), which the batch "
            "script cannot hold on one line"
        )


def check_submission(study: Study, sub: Submission) -> int:
    """Refuse a submission whose shape cannot run the study, or whose options cannot go into the
    script (``check_sbatch_args``), with a ``SlurmError`` naming the option; returns the CPUs per
    node it asks for."""
    check_sbatch_args(sub)
    limit = parse_time(sub.time)
    if limit is not None and limit - sub.signal_lead - EARLY_S < WORK_S:
        raise SlurmError(
            f"--time {sub.time} ({limit} s) with --signal-lead {sub.signal_lead}: SLURM may send "
            f"the signal {EARLY_S} s early, {max(0, limit - sub.signal_lead - EARLY_S)} s after "
            f"the job starts, and every attempt would stop before its cells have trained (a job "
            f"takes a minute or two to start Ray and its cells) and be requeued again; give it at "
            f"least {WORK_S} s: --time {math.ceil((sub.signal_lead + EARLY_S + WORK_S) / 60)} "
            "(minutes) or more, or a shorter --signal-lead"
        )
    cpus = sub.cpus_per_node or default_cpus(study, sub.gpus_per_node)
    nodes = tuple(f"node{i}" for i in range(sub.nodes))
    shape = Allocation(0, nodes, (cpus,) * sub.nodes, sub.gpus_per_node, nodes[0])
    asked = f"--cpus-per-node {cpus}, --gpus-per-node {sub.gpus_per_node}"
    check_fits(study, shape, asked=asked)
    return cpus


def sbatch_script(study: Study, sub: Submission, *, cwd: Path, pythonpath: str | None) -> str:
    """The batch script (see the module docstring)."""
    from ablate import __version__

    cpus = check_submission(study, sub)
    one_line("the current folder", str(cwd))
    one_line("$PYTHONPATH", pythonpath or "")
    log_dir = sub.output / "slurm"
    opts = [
        f"--job-name=ablate-{study.name}",
        f"--nodes={sub.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        *([f"--gpus-per-node={sub.gpus_per_node}"] if sub.gpus_per_node else []),
        f"--time={sub.time}",
        *([f"--partition={sub.partition}"] if sub.partition else []),
        "--requeue",
        f"--signal=B:USR1@{sub.signal_lead}",
        "--open-mode=append",
        f"--output={log_dir}/job-%j.out",
        f"--chdir={cwd}",
        *sub.sbatch_args,
    ]
    run = shlex.join(
        [sys.executable, "-m", "ablate.cli", "slurm", "run", str(sub.study_file),
         "-o", str(sub.output), *sub.run_args]
    )  # fmt: skip
    lines = [
        "#!/bin/bash",
        f"# `ablate slurm submit` (ablate {__version__}), {datetime.now().isoformat(timespec='seconds')}:",
        f"# the study {sub.study_file} on {sub.nodes} node(s), requeueable. SIGUSR1 "
        f"{sub.signal_lead} s before the time",
        "# limit, or SIGTERM (requeue, preemption): the cells checkpoint and stop, the job ends,",
        "# and the requeued job resumes them.",
        *(f"#SBATCH {shlex.quote(o)}" for o in opts),
        "",
        *([f"export PYTHONPATH={shlex.quote(pythonpath)}"] if pythonpath else []),
        'echo "ablate: job $SLURM_JOB_ID, attempt $((${SLURM_RESTART_COUNT:-0} + 1)), on '
        '$SLURM_JOB_NODELIST, $(date -Is)"',
        f"{run} &",
        "pid=$!",
        'usr1=""',
        "trap 'usr1=1; kill -USR1 \"$pid\" 2>/dev/null' USR1",
        "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM",
        "while :; do  # wait returns early on each trapped signal",
        '    wait "$pid"; rc=$?',
        '    kill -0 "$pid" 2>/dev/null || break',
        "done",
        'if [ "$rc" -gt 128 ]; then wait "$pid"; r=$?; [ "$r" -ne 127 ] && rc=$r; fi',
        f'if [ "$rc" -eq {INTERRUPTED} ] && [ -n "$usr1" ]; then',
        '    echo "ablate: stopped ahead of the time limit; requeueing job $SLURM_JOB_ID"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def submit(script: str, output: Path) -> int:
    """``sbatch`` the script; returns the job id. ``SlurmError`` with sbatch's message when SLURM
    refuses it (nothing started)."""
    log_dir = output / "slurm"
    made = [d for d in (log_dir, *log_dir.parents) if not d.exists()]  # deepest first
    log_dir.mkdir(parents=True, exist_ok=True)  # the job's output file goes there
    try:
        try:
            res = subprocess.run(
                ["sbatch", "--parsable"], input=script, capture_output=True, text=True, timeout=120
            )
        except FileNotFoundError:
            raise SlurmError(
                "no `sbatch` on PATH: submit from a machine of the SLURM cluster (a login node), "
                "or print the script with --dry-run"
            ) from None
        if res.returncode != 0:
            raise SlurmError(f"sbatch refused the job: {res.stderr.strip()}")
    except SlurmError:  # nothing submitted: the folders made for its output go again
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return int(res.stdout.strip().split(";")[0])
