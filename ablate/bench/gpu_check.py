"""One command that checks a GPU machine end to end and keeps what it measured: ``make gpu-check``
(``python -m ablate.bench.gpu_check``).

For a machine that has torch with CUDA and little else (no Ray, MLflow or Optuna, no network): in
one go, within a time budget (``--budget``, 540 s by default: under 9 minutes on one H100), each
stage in a subprocess of its own with a time limit, so that a stage that fails or hangs leaves the
next ones their time and its own log:

1. ``environment``: device, driver (``nvidia-smi``), torch, CUDA, Python, the git commit, the
   command (``environment.json``);
2. ``native``: the native GEMMs' self-check against the emulation for every format the device
   runs (``backends.gemm.selfcheck``; ``native_check.json``);
3. ``tests``: the test suite's GPU tests (``pytest -m gpu`` over ``tests/backends`` and
   ``tests/ablate/train``: native GEMMs against emulated, the compiled quantizer, and the compiled
   training step against the eager one for three recipes, ``REHEARSALS``);
4. ``bench``: ``python -m ablate.bench.gpu`` on the ``125m`` preset (its goals: emulated MXFP4
   step <= 1.25x BF16, quantizer >= 0.70 of the copy bandwidth, native FP8 faster than BF16, and
   native against emulated FP8 GEMMs);
5. ``parallel``: two steps of the ``ddp`` and ``fsdp`` paths in a process group of one on NCCL,
   compiled as a cell on CUDA is (``parallel.json``);
6. ``study``: ``studies/gpu_check.yaml`` (BF16, native FP8, emulated full MXFP4 and MXFP4 + DHT16
   on ``small``, two seeds), each cell trained in this machine's one process as the local executor
   would, without MLflow, and its report (``study/report.md``, figures, ``summary.csv``), of the
   cells it trained where its time ran out (``ablate.bench.gpu_study``).

A stage past its limit gets SIGTERM, and SIGKILL for its whole process session ``GRACE`` later.

Everything goes into ``reports/gpu/<date>-<device>/`` (``--out``): one log per stage, written as it
runs (a stage cut off at its limit keeps what it printed), and ``summary.md``/``summary.json`` with
each stage's status, time and figures. The study and its report need ``pydantic`` (and pandas and
matplotlib); where it is missing the stage is skipped with the reason: ``make gpu-check
WHEELS=dir`` installs wheel files from ``dir`` first, for a machine without a package index.

``--device cpu`` runs the same stages at toy sizes on the CPU (the ``tiny`` preset, gloo, the
emulated backend for the FP8 cell, ``gpu_bench --dry-run``): the test suite runs it, so the
command is not broken on first contact with a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import faulthandler
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.bench.gpu_study import CPU_VAL_TOKENS, ROOT, stage_study

STAGES = ("environment", "native", "tests", "bench", "parallel", "study")
"""In the order of what a short loan of a GPU must show first: the numerics, then the figures."""
LIMITS = {
    "environment": 30,
    "native": 60,
    "tests": 420,
    "parallel": 300,
    "bench": 480,
    "study": 300,
}
"""Each stage's own time limit in seconds (within what the budget leaves it). Cold caches: on an
H200 (2026-11-26) ``parallel`` took 94 s; on H100s (2026-11-27) ``native`` 32-40 s, ``tests`` over
238 s (its second rehearsal compiling), ``bench`` 421 s, the study over 280 s (four of eight
cells; a native FP8 cell 159 s); on an H200 (2026-11-29) ``parallel``'s ddp run 70 s with a warm
Inductor cache and its fsdp run unfinished 125 s later (both 23-63 s on 2026-11-26, before the
quantizer was traced into the compiled graphs), ``tests`` with 8 workers 352 s for all 26 GPU
tests."""
REHEARSALS = ("fp8_native-none-cuda", "mxfp4_rht16-ddp-cuda", "nvidia_nvfp4-fsdp-cuda")
"""The compile rehearsal's CUDA cases the ``tests`` stage runs in one process (native FP8, MXFP4 +
RHT16 under DDP, NVIDIA's NVFP4 recipe under FSDP2): each compiles a model cold, 30-100 s on an
H200, and all ten took the stage past its limit. With pytest-xdist (``gpu_test_workers``) it runs
all ten, as ``pytest -m gpu`` does."""
GRACE = 20.0
"""A stage past its limit gets SIGTERM (the study then reports what it trained), and this much
later (at most a quarter of its limit) SIGKILL for its whole process session."""
MINIMUM = {"environment": 5, "native": 10, "tests": 30, "parallel": 20, "bench": 40, "study": 40}
"""Below this much time a stage is skipped ("out of time") rather than started."""


@dataclass(slots=True)
class Stage:
    name: str
    status: str = "not run"
    """passed, failed, timed out, skipped, or not run."""
    seconds: float = 0.0
    detail: str = ""
    log: str = ""


# ----------------------------------------------------------------------------------------------
# the driver: stages in subprocesses, within the budget


def device_slug(device: str) -> str:
    """The folder name's device part: ``h100-sm_90`` for an NVIDIA H100, ``cpu`` on the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    from backends.gemm.native import device_arch

    name = torch.cuda.get_device_name(dev).lower()
    m = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    return f"{m.group(1) if m else 'gpu'}-{device_arch(dev)}"


def run_stages(args: argparse.Namespace, out: Path) -> list[Stage]:
    """Each stage as a subprocess (``--stage NAME``) with its time limit; logs into ``out``."""
    deadline = time.monotonic() + args.budget
    stages = [Stage(s) for s in STAGES if s not in args.skip]
    for i, st in enumerate(stages):
        later = sum(MINIMUM[s.name] for s in stages[i + 1 :])
        left = deadline - time.monotonic()
        grace = min(GRACE, LIMITS[st.name] * args.scale / 4)  # after SIGTERM, before SIGKILL
        limit = min(LIMITS[st.name] * args.scale, left - later - grace)
        if limit < MINIMUM[st.name]:
            st.status, st.detail = "skipped", f"out of time ({left:.0f} s of the budget left)"
            _say(f"== {st.name}: skipped, {st.detail}")
            continue
        st.log = f"{st.name}.log"
        cmd = [
            sys.executable,
            "-m",
            "ablate.bench.gpu_check",
            "--stage",
            st.name,
            "--out",
            str(out),
        ]
        cmd += ["--device", args.device]
        _say(f"== {st.name} (limit {limit:.0f} s): {shlex.join(cmd)}")
        t0 = time.monotonic()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(out / st.log, "w") as log:
            # a session of its own: at its limit the stage stops with every process it started
            # (pytest under the tests stage, compile workers), none left to run on beside the next
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=limit)
                st.status = {0: "passed", 3: "skipped"}.get(rc, "failed")
            except subprocess.TimeoutExpired:
                st.status = "timed out"
                proc.send_signal(signal.SIGTERM)  # the study reports the cells it trained
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
            finally:
                _stop_session(proc)
        st.seconds = time.monotonic() - t0
        st.detail = st.detail or _last_line(out / st.log)
        _say(f"   {st.name}: {st.status} in {st.seconds:.0f} s: {st.detail}")
    return stages


def _stop_session(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of a stage's process session (its leader and every descendant)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the session had ended
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _say(line: str) -> None:
    print(line, flush=True)


def _last_line(path: Path) -> str:
    """The log's last line that says something (``RESULT:`` lines first)."""
    lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    results = [x for x in lines if x.startswith("RESULT:")]
    return (results[-1][len("RESULT:") :].strip() if results else lines[-1] if lines else "")[:300]


def summarize(stages: list[Stage], out: Path, args: argparse.Namespace, wall: float) -> Path:
    """``summary.json`` (the stages and every stage's JSON) and ``summary.md``."""
    figures = {}
    for name in ("environment", "native_check", "parallel", "study"):
        f = out / f"{name}.json"
        if f.exists():
            figures[name] = json.loads(f.read_text())
    if (out / "bench.json").exists():
        b = json.loads((out / "bench.json").read_text())
        figures["bench"] = {"file": "bench.json", "partial": "partial" in b, "goals": b["goals"]}
    summary = {
        "command": _command(args),
        "device": args.device,
        "budget_s": args.budget,
        "wall_s": round(wall, 1),
        "stages": [
            {
                "name": s.name,
                "status": s.status,
                "seconds": round(s.seconds, 1),
                "detail": s.detail,
                "log": s.log,
            }
            for s in stages
        ],
        **figures,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    # a check run without its environment stage still says what it ran on (this process's view)
    env = figures.get("environment") or environment_info(args)
    md = [
        f"# GPU check, {env.get('device_name', args.device)}, {env.get('date', '')}",
        "",
        f"- command: `{summary['command']}` ({wall:.0f} s of a {args.budget:.0f} s budget)",
        f"- torch {env.get('torch', '?')}, CUDA {env.get('cuda') or '-'}, driver "
        f"{env.get('driver') or '-'}, Python {env.get('python', '?')}, commit "
        f"{env.get('git_commit', '?')}",
        "",
        "| stage | status | seconds | detail | log |",
        "|---|---|---:|---|---|",
    ]
    for s in stages:
        md.append(f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.detail} | {s.log or '-'} |")
    if "bench" in figures:
        cut = ", partial: the bench stopped before its end" if figures["bench"]["partial"] else ""
        md += ["", f"## Goals (`{figures['bench']['file']}`{cut})", ""]
        for name, g in figures["bench"]["goals"].items():
            md.append(f"- {name}: {g['measured']} (target {g['target']}): {g['met']}")
    if "study" in figures:
        untrained = figures["study"].get("not_trained")
        said = [f"Partial: not trained in time: {', '.join(untrained)}.", ""] if untrained else []
        md += ["", "## Study", "", *said, *figures["study"].get("verdict", [])]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    return out / "summary.md"


def _command(args: argparse.Namespace) -> str:
    return shlex.join(["python", "-m", "ablate.bench.gpu_check", *args.argv])


# ----------------------------------------------------------------------------------------------
# the stages, each run in its own process (``--stage NAME``); exit status 3: skipped


def stage_environment(args: argparse.Namespace, out: Path) -> None:
    env = environment_info(args)
    (out / "environment.json").write_text(json.dumps(env, indent=1) + "\n")
    print(json.dumps(env, indent=1))
    print(f"RESULT: {env['device_name']}, torch {env['torch']}, driver {env['driver'] or '-'}")


def environment_info(args: argparse.Namespace) -> dict[str, Any]:
    """The machine, the software and the code: torch, CUDA, the driver, the device, the commit."""
    import platform

    import torch

    from ablate.train.provenance import git_state

    commit, dirty = git_state()
    cuda = args.device != "cpu" and torch.cuda.is_available()
    env: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "datetime": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": _command(args),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "git_commit": commit,
        "git_dirty": dirty,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "driver": None,
        "packages": _packages(),
    }
    if cuda:
        from backends.gemm import supported_formats
        from backends.gemm.native import device_arch

        env["arch"] = device_arch("cuda")
        env["native_formats"] = sorted(supported_formats("cuda"))
        env["memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "--query-gpu=name,driver_version,memory.total,clocks.max.sm"
        r = subprocess.run([smi, q, "--format=csv,noheader"], capture_output=True, text=True)
        env["nvidia_smi"] = r.stdout.strip()
        env["driver"] = r.stdout.split(",")[1].strip() if r.returncode == 0 and r.stdout else None
    return env


def _packages() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("pydantic", "pandas", "matplotlib", "pytest", "mlflow", "ray", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def stage_native(args: argparse.Namespace, out: Path) -> None:
    """The native GEMMs' self-check (``ablate native-check``) for every format the device runs,
    uncached: ``native_check.json``."""
    import torch

    from backends.gemm.selfcheck import check_device, versions

    results = check_device(torch.device(args.device), use_cache=False, log=print)
    (out / "native_check.json").write_text(
        json.dumps({"device": versions(torch.device(args.device)), "results": results}, indent=1)
        + "\n"
    )
    for name, result in results.items():
        print(f"{name}: {result}")
    failed = [n for n, r in results.items() if r.startswith("FAILED")]
    print(
        f"RESULT: {len(results) - len(failed)} of {len(results)} format families equal to the "
        f"emulation{'; failed: ' + ', '.join(failed) if failed else ''}"
    )
    sys.exit(1 if failed else 0)


def stage_tests(args: argparse.Namespace, out: Path) -> None:
    """The tests marked ``gpu``; on the CPU only collected (they would skip, or compile for the
    CPU for minutes: the suite runs them there)."""
    cpu = args.device == "cpu"
    cmd = tests_command(out, cpu=cpu, workers=0 if cpu else gpu_test_workers())
    print(shlex.join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if rc == 5:  # nothing selected
        print("RESULT: no GPU tests selected")
        sys.exit(3)
    what = "collected only, on the CPU" if cpu else _junit_counts(out / "tests.xml")
    print(f"RESULT: pytest exit status {rc} ({what})")
    sys.exit(0 if rc == 0 else 1)


def tests_command(out: Path, *, cpu: bool, workers: int) -> list[str]:
    """The tests stage's pytest: every GPU test in ``workers`` processes (pytest-xdist), or, in
    one process, all but the compile rehearsals outside ``REHEARSALS``."""
    # on a GPU one line per test as it ends (-v): a stage cut off at its limit still says which
    # passed; on the CPU the collected names (-q)
    cmd = [sys.executable, "-m", "pytest", "-q" if cpu else "-v", "-m", "gpu", "-p"]
    cmd += ["no:cacheprovider", "-rs"]
    # a test module that needs a package this machine lacks must not hide the GPU tests
    cmd.append("--continue-on-collection-errors")
    cmd += ["--junitxml", str(out / "tests.xml"), *gpu_test_files()]
    if workers:
        cmd += ["-n", str(workers)]
    else:
        cmd += ["-k", " or ".join(["not compiles_once_and_trains", *REHEARSALS])]
    cmd.append("--collect-only" if cpu else "--durations=10")
    return cmd


def gpu_test_workers() -> int:
    """Processes for the GPU tests: half the CPUs, at most 8, where pytest-xdist is installed
    (the rehearsals compile on the CPU: on an H200's 16 cores, 2026-11-29, 8 workers ran all 26
    GPU tests in 352 s, beside the parallel stage); 0 (one process) without it."""
    if importlib.util.find_spec("xdist") is None:
        return 0
    n = min(8, (os.cpu_count() or 1) // 2)
    return n if n >= 2 else 0


def gpu_test_files() -> list[str]:
    """The test modules that mark a test ``gpu``: the only ones the stage collects."""
    tests = (p for p in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())
    return sorted(str(p.relative_to(ROOT)) for p in tests)


def _junit_counts(path: Path) -> str:
    if not path.exists():
        return "no report"
    text = path.read_text()
    m = re.search(r'tests="(\d+)".*?failures="(\d+)".*?skipped="(\d+)"', text, re.S)
    m2 = re.search(r'errors="(\d+)"', text)
    if not m:
        return "no counts"
    tests, failures, skipped = map(int, m.groups())
    errors = int(m2.group(1)) if m2 else 0
    return f"{tests - failures - skipped - errors} passed, {failures} failed, {errors} errors, {skipped} skipped"


def stage_parallel(args: argparse.Namespace, out: Path) -> None:
    """Two steps of ddp and of fsdp in a process group of one (NCCL on CUDA, gloo on the CPU),
    full MXFP4 with SR, compiled where the cell would be."""
    import torch

    from ablate.data import DataConfig
    from ablate.model import ModelConfig
    from ablate.train import RunConfig, TrainConfig, train
    from ablate.train.device import resolve_device
    from ablate.train.parallel import backend_for, process_group
    from backends import Recipe
    from backends.recipes import GEMMS

    cpu = args.device == "cpu"
    results = {}
    for mode in ("ddp", "fsdp"):
        cfg = RunConfig(
            model=ModelConfig(preset="tiny" if cpu else "small"),
            data=DataConfig(val_tokens=CPU_VAL_TOKENS if cpu else 8192),
            train=TrainConfig(
                steps=2,
                batch_size=4,
                seq_len=32 if cpu else 256,
                eval_every=2,
                warmup_steps=1,
                parallel=mode,
            ),  # fmt: skip
            recipe=Recipe.from_shorthand(GEMMS, "sr"),
            device=args.device,
        )
        device = resolve_device(cfg.device)
        t0 = time.perf_counter()
        # said before it starts: a run cut off at the stage's limit (compiling, or waiting on a
        # collective) is named, and its threads' stacks follow
        print(f"{mode}: training {cfg.train.steps} steps of {cfg.model.preset}", flush=True)
        with process_group(cfg, device):
            res = train(cfg)
        results[mode] = {
            "collectives": backend_for(device),
            "status": res.status,
            "val_loss": [e.val_loss for e in res.evals],
            "seconds": time.perf_counter() - t0,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
            if device.type == "cuda"
            else None,
        }
        print(f"{mode}: {results[mode]}", flush=True)
        if res.status != "finished":
            raise RuntimeError(f"{mode}: the run ended {res.status}: {res.reason}")
    (out / "parallel.json").write_text(json.dumps(results, indent=1) + "\n")
    print(
        "RESULT: "
        + ", ".join(
            f"{m} {r['status']} on {r['collectives']} in {r['seconds']:.0f} s"
            for m, r in results.items()
        )
    )


def stage_bench(args: argparse.Namespace, out: Path) -> None:
    from ablate.bench import gpu as gpu_bench

    # bench.md and bench.json are written as it goes: a stage stopped at its limit keeps them
    argv = ["--device", args.device, "--out", str(out), "--name", "bench"]
    if args.device == "cpu":
        argv.append("--dry-run")
    else:
        argv += ["--presets", "125m", "--steps", "10", "--warmup", "2", "--repeats", "5"]
        argv += ["--profile", "fp8", "mxfp4"]  # the two ratios the goals miss most
    gpu_bench.main(argv)
    result = json.loads((out / "bench.json").read_text())
    met = {k: g["met"] for k, g in result["goals"].items()}
    print(f"RESULT: goals {met}")


_STAGE_FUNCS: dict[str, Callable[[argparse.Namespace, Path], None]] = {
    f.__name__.removeprefix("stage_"): f
    for f in (
        stage_environment,
        stage_native,
        stage_tests,
        stage_parallel,
        stage_bench,
        stage_study,
    )
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (toy sizes)")
    ap.add_argument("--out", help="folder (default: reports/gpu/<date>-<device>)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all stages (540)")
    ap.add_argument("--skip", nargs="*", default=[], choices=STAGES, help="stages to leave out")
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # one stage, in this process
    ap.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.device not in ("cuda", "cpu"):
        ap.error(f"--device must be cuda or cpu, not {args.device!r}")
    if args.budget <= 0:
        ap.error("--budget must be positive")
    if args.stage:
        out = Path(args.out)
        # a stage stopped at its limit prints where each thread was into its log (then ends as
        # SIGTERM would end it, or runs the handler a stage sets itself: the study's report)
        faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
        _STAGE_FUNCS[args.stage](args, out)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "ablate.bench.gpu_check: no CUDA device here (--device cpu checks the command at toy sizes)"
        )
        return 2
    slug = f"{dt.date.today().isoformat()}-{device_slug(args.device)}"
    out = Path(args.out) if args.out else ROOT / "reports" / "gpu" / slug
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    stages = run_stages(args, out)
    md = summarize(stages, out, args, time.monotonic() - t0)
    print(md.read_text())
    failed = [s.name for s in stages if s.status in ("failed", "timed out")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
