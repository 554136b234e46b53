"""What the real-SLURM tests run, once, on a cluster of their own (``slurm_cluster``): two jobs at
once, both holding node n1, each interrupted mid-study and requeued, plus the refusals; it returns
everything the tests assert on as plain data (``Scenario``).

- job B: ``ablate slurm submit`` of a two-cell CPU study over both nodes (1 CPU each). Once both
  cells have checkpointed, ``scontrol requeue`` (what preemption does: SIGTERM to every process of
  the job, SIGKILL ``KillWait`` later); the requeued job finishes the study and writes the report.
- job D: the same study's first cell alone, on n1, at the same time. Once its cell has checkpointed,
  SIGUSR1 to its batch script, as ``--signal=B:USR1@<lead>`` sends it ahead of the time limit
  (``scancel --batch --signal=USR1``: the same signal to the same process, now rather than at a
  moment SLURM's 30-s timer picks); the script requeues the job, which finishes.
- the reference: the same cells trained in this process, uninterrupted (the local executor).
- refusals through SLURM itself, while the requeued jobs run: a cell larger than the node it got
  (``srun``), a port of the job held on its node, and the same refusal from an ``salloc`` shell,
  which moves itself to the job's node with ``srun`` first.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import sqlite3
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurm_cluster import SlurmCluster

STUDY = """name: slurm-preempt
base:
  model: {preset: tiny, dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 1, ffn_dim: 64}
  data: {corpus: builtin, val_tokens: 2048}
  train: {steps: 300, batch_size: 4, seq_len: 32, eval_every: 50, eval_batches: 2,
          checkpoint_every: 10, warmup_steps: 5}
  device: cpu
grid: {fp4_gemms: [[]], seed: [0, 1]}
baseline: {fp4_gemms: []}
target: {val_ppl: 40}
"""
STEPS = 300
TIMING = ("tokens_per_s",)
"""Metrics that measure time, not the numbers a run computes."""


@dataclass
class Job:
    id: str
    submitted: float
    interrupted_at: float = 0.0
    how: str = ""
    steps_before: dict[str, int] = field(default_factory=dict)
    """Cell key -> the last train_loss step the first attempt logged."""
    state: dict[str, str] = field(default_factory=dict)
    output: str = ""
    runs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scenario:
    b: Job
    d: Job
    reference: dict[str, Any]
    refusals: dict[str, tuple[int, str]]
    report: bool
    ports: dict[str, int]
    wall_s: float


def read_runs(db: Path) -> dict[str, Any]:
    """The cell runs of an MLflow SQLite store, by cell key: status, tags, every metric point as
    (step, value, timestamp) in step order, and how many (metric, step) pairs were recorded twice."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        tags: dict[str, dict[str, str]] = {}
        for run, k, v in con.execute("SELECT run_uuid, key, value FROM tags"):
            tags.setdefault(run, {})[k] = v
        status = dict(con.execute("SELECT run_uuid, status FROM runs"))
        out: dict[str, Any] = {}
        for run, t in tags.items():
            if t.get("ablate.role") != "cell":
                continue
            metrics: dict[str, list[tuple[int, float, int]]] = {}
            rows = con.execute(
                "SELECT key, step, value, timestamp FROM metrics WHERE run_uuid = ? "
                "ORDER BY key, step, timestamp",
                (run,),
            )
            for k, step, value, ts in rows:
                metrics.setdefault(k, []).append((step, value, ts))
            twice = con.execute(
                "SELECT COUNT(*) FROM (SELECT key, step FROM metrics WHERE run_uuid = ? "
                "GROUP BY key, step HAVING COUNT(*) > 1)",
                (run,),
            ).fetchone()[0]
            key = t["ablate.key"]
            out.setdefault(key, []).append(
                {
                    "run_id": run,
                    "status": status[run],
                    "tags": t,
                    "metrics": metrics,
                    "twice": twice,
                }  # fmt: skip
            )
        return out
    finally:
        con.close()


def _checkpoint_steps(out: Path) -> dict[str, int]:
    """Cell key -> the step of its checkpoint, for the cells that have one and have not finished."""
    steps = {}
    for sidecar in out.glob("cells/*/checkpoint.json"):
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(sidecar.read_text())
            if info.get("status") is None:  # a finished cell's last checkpoint does not count
                steps[sidecar.parent.name] = int(info["step"])
    return steps


def _reference(root: Path, study_file: Path) -> dict[str, Any]:
    """The study's cells trained in this process, uninterrupted."""
    from ablate.driver.runner import run_study
    from ablate.study import load_study

    study = load_study(study_file, output=root / "reference")
    run_study(study, executor="local", progress=False, stream=io.StringIO())
    return read_runs(root / "reference" / "mlflow.db")


def _refusals(root: Path, env: dict[str, str]) -> dict[str, subprocess.Popen[str]]:
    """The refusals, started at once (each its own small SLURM job on n1), and a job with nothing
    left to run (after ``_reference``)."""
    big = root / "big.yaml"
    big.write_text(STUDY.replace("device: cpu", "device: cpu\nresources: {cpus: 5}"))
    small = root / "study.yaml"
    py = f"{sys.executable} -m ablate.cli"
    cases = {
        # one CPU on n1 (srun's default), a cell of five
        "cell larger than the node": ["srun", "-N1", "-w", "n1", *py.split(), "slurm", "run",
                                      str(big), "-o", str(root / "refused-a")],
        # a listener on the job's GCS port, as a Ray left there would hold it
        "port taken": ["srun", "-N1", "-w", "n1", "bash", "-c",
                       f"{sys.executable} -c 'import os,socket,time; from ablate.slurm.ports "
                       "import JobPorts; s=socket.socket(); s.bind((\"0.0.0.0\", "
                       "JobPorts(int(os.environ[\"SLURM_JOB_ID\"])).gcs)); s.listen(); "
                       f"time.sleep(60)' & sleep 2; {py} slurm run {small} -o "
                       f"{root / 'refused-b'}; rc=$?; kill %1; exit $rc"],
        # salloc's shell runs here, outside the nodes: the command moves to n1 (srun) and refuses
        "from salloc": ["salloc", "-N1", "-w", "n1", *py.split(), "slurm", "run", str(big), "-o",
                        str(root / "refused-c")],
        # not a refusal: the reference's store, every cell finished: no Ray is started
        "nothing to run": ["srun", "-N1", "-w", "n1", *py.split(), "slurm", "run", str(small),
                           "-o", str(root / "reference"), "--no-report"],
    }  # fmt: skip
    return {
        name: subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )  # fmt: skip
        for name, cmd in cases.items()
    }


def run_scenario(cluster: SlurmCluster, root: Path) -> Scenario:
    """Everything the module docstring says, on ``cluster`` (started), in ``root``."""
    from ablate.slurm.ports import JobPorts

    t_start = time.monotonic()
    env = {**cluster.env, "PYTHONUNBUFFERED": "1"}
    study = root / "study.yaml"
    study.write_text(STUDY)
    one = root / "one.yaml"
    one.write_text(STUDY.replace("seed: [0, 1]", "seed: [0]"))
    assert one.read_text() != STUDY
    jobs = {}
    submitting = {}
    for name, file, extra in (
        ("b", study, ["--nodes", "2"]),
        ("d", one, ["--nodes", "1", "--sbatch-arg=--nodelist=n1", "--no-report"]),
    ):  # both at once; their drivers prepare the data once between them (a lock)
        args = ["slurm", "submit", str(file), *extra, "--time", "15", "-o", str(root / name)]
        submitting[name] = subprocess.Popen(
            [sys.executable, "-m", "ablate.cli", *args], cwd=root, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    for name, proc in submitting.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        jobs[name] = Job(out.strip(), time.time())
    reference = _reference(root, study)  # while the jobs start
    how = {"b": ["scontrol", "requeue"], "d": ["scancel", "--batch", "--signal=USR1"]}
    deadline = time.monotonic() + 600
    waiting = dict(jobs)
    while waiting:  # interrupt each job once a cell of it has checkpointed mid-study
        for name, job in list(waiting.items()):
            steps = _checkpoint_steps(root / name)
            if steps and max(steps.values()) >= 10:
                cluster.run(*how[name], job.id)
                job.interrupted_at, job.how = time.time(), " ".join(how[name])
                del waiting[name]
            elif cluster.job_state(job.id).get("JobState") not in ("PENDING", "RUNNING"):
                raise AssertionError(f"job {name} ended early: {cluster.job_state(job.id)}")
        assert time.monotonic() < deadline, "the cells did not checkpoint in time"
        time.sleep(0.2)
    refusing = _refusals(root, env)  # while the jobs go on
    for name, job in jobs.items():  # the first attempt has ended: what it logged
        _wait_restarted(cluster, job.id)
        db = root / name / "mlflow.db"
        job.steps_before = {
            key: max((s for s, *_ in runs[0]["metrics"].get("train_loss", [])), default=0)
            for key, runs in read_runs(db).items()
        }
    for name, job in jobs.items():
        job.state = cluster.wait_state(job.id, ("COMPLETED", "FAILED", "CANCELLED"), 600)
        log = root / name / "slurm" / f"job-{job.id}.out"
        job.output = log.read_text(errors="replace") if log.exists() else ""
        job.runs = read_runs(root / name / "mlflow.db")
    refusals = {}
    for name, proc in refusing.items():
        out, _ = proc.communicate(timeout=300)
        refusals[name] = (proc.returncode, out)
    return Scenario(
        b=jobs["b"],
        d=jobs["d"],
        reference=reference,
        refusals=refusals,
        report=(root / "reports" / "slurm-preempt" / "report.md").is_file(),
        ports={n: JobPorts(int(j.id)).base for n, j in jobs.items()},
        wall_s=time.monotonic() - t_start,
    )


def _wait_restarted(cluster: SlurmCluster, job: str, timeout: float = 300) -> None:
    """Until the job's first attempt has ended (it was requeued)."""
    deadline = time.monotonic() + timeout
    while True:
        info = cluster.job_state(job)
        if info.get("Restarts", "0") != "0" and info.get("JobState") != "COMPLETING":
            return
        if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job} was not requeued: {info}")
        time.sleep(0.5)


RESULT, FAILED, LOCK, STARTED = "scenario.json", "scenario.failed", "scenario.lock", "background"


def scenario_folder(base: Path) -> Path:
    """The folder every process of this test session sees, from the session's base temporary
    folder ``base``: under pytest-xdist its workers' base folders share a parent; without it, the
    session's own. The scenario runs once per session, there."""
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "slurm-scenario"


def scenario_once(shared: Path) -> Scenario:
    """``run_scenario`` once per test session, whichever process asks first (a pytest-xdist
    worker, or the background run ``start_in_background`` began); the others wait for it and read
    its result (``shared``: a folder all of them see). A run that failed is not run again: its
    traceback is the error of every test that asks."""
    shared.mkdir(parents=True, exist_ok=True)
    with open(shared / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _run_unless_done(shared)
    raw = json.loads((shared / RESULT).read_text())
    return Scenario(
        b=Job(**raw["b"]), d=Job(**raw["d"]), reference=raw["reference"],
        refusals={k: tuple(v) for k, v in raw["refusals"].items()}, report=raw["report"],
        ports=raw["ports"], wall_s=raw["wall_s"],
    )  # fmt: skip


def _run_unless_done(shared: Path) -> None:
    """Under the lock: the scenario's result, or its failure, recorded in ``shared``."""
    result, failed = shared / RESULT, shared / FAILED
    if failed.exists():
        raise AssertionError(f"the SLURM scenario failed:\n{failed.read_text()[-6000:]}")
    if result.exists():
        return
    try:
        with free_cluster() as cluster:
            scenario = run_scenario(cluster, shared)
    except BaseException:
        failed.write_text(traceback.format_exc())
        raise
    result.write_text(json.dumps(asdict(scenario)))


def start_in_background(shared: Path, timeout: float = 60) -> bool:
    """Begin ``scenario_once(shared)`` in a process of its own, once per session (the first caller
    starts it; False for the others), and return once it holds the lock: the scenario's two
    minutes, mostly spent waiting for SLURM and for Ray to start on its nodes, then pass while the
    suite's other tests run, and its tests find the result ready. Its output goes to
    ``shared/background.log``; it removes its cluster when done, also if the session ends first."""
    shared.mkdir(parents=True, exist_ok=True)
    try:
        marker = os.open(shared / STARTED, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(marker)
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
    }
    with open(shared / "background.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(shared)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while not (shared / f"{STARTED}.locked").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return (
                True  # it ended early (its error is in the failed file) or is slow: the tests wait
            )
        time.sleep(0.1)
    return True


def _background_main(shared: Path) -> int:
    """The background run: take the lock, say so, run the scenario under it."""
    shared.mkdir(parents=True, exist_ok=True)
    with open(shared / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (shared / f"{STARTED}.locked").touch()
        try:
            _run_unless_done(shared)
        except BaseException:
            traceback.print_exc()
            return 1
    return 0


@contextlib.contextmanager
def free_cluster():  # type: ignore[no-untyped-def]
    """A started ``SlurmCluster`` whose index no other test session on this machine holds (a lock
    file per index), stopped and removed afterwards, also on failure."""
    for index in range(10):
        lock = open(f"/tmp/abl-slurm{index}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        cluster = SlurmCluster(index, cpus=4)
        try:
            yield cluster.start()
        finally:
            cluster.stop()
            lock.close()
        return
    raise RuntimeError("every SLURM cluster index (0-9) is held by another test session")


if __name__ == "__main__":
    sys.exit(_background_main(Path(sys.argv[1])))
