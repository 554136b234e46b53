"""The GPU check's study stage (``ablate.bench.gpu_check``): ``studies/gpu_check.yaml`` trained cell
by cell in one process, as the local executor would but without Ray or MLflow, and its report. On
SIGTERM (the stage's time is up: the check sends it before it kills the stage) the cell in training
stops, and the cells trained so far are reported, the report saying which were not."""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: ablate/bench/ is two below it
STUDY = ROOT / "studies" / "gpu_check.yaml"
CPU_VAL_TOKENS = 1024  # the study's 65,536 would take 512 evaluation forwards of CPU_SIZES
CPU_SIZES: dict[str, Any] = {
    "steps": 4,
    "batch_size": 4,
    "seq_len": 32,
    "eval_every": 2,
    "eval_batches": 2,  # of 8: evaluating took 64% of the CPU study's time
    "warmup_steps": 1,
}
"""The study's training sizes on the CPU (``--device cpu``), the ``tiny`` preset."""
ARCH_PROFILES = {
    "sm_89": "h100",  # Ada: FP8 at twice BF16, no block-scaled formats, as Hopper
    "sm_90": "h100",  # H100 and H200
    "sm_100": "b200",
    "sm_103": "b200",
    "gfx942": "mi300x",
    "gfx950": "mi355x",
}
"""The ``speedup:`` device profile the check's report projects with, by the GPU it trained on (a
study that names its own ``speedup.device`` keeps it); without one, the study's default."""


def stage_study(args: argparse.Namespace, out: Path) -> None:
    missing = [m for m in ("pydantic", "pandas", "matplotlib") if not importlib.util.find_spec(m)]
    if missing:
        print(
            f"RESULT: skipped: {', '.join(missing)} not installed (the study's spec and report "
            "need pydantic, pandas and matplotlib); `make gpu-check WHEELS=dir` installs wheel "
            "files from dir first"
        )
        sys.exit(3)
    signal.signal(signal.SIGTERM, _raise_stopped)  # the stage's time is up
    summary = run_study(STUDY, out / "study", cpu=args.device == "cpu", log=print)
    (out / "study.json").write_text(json.dumps(summary, indent=1) + "\n")
    if summary["partial"]:
        n, of = len(summary["cells"]), len(summary["cells"]) + len(summary["not_trained"])
        print(f"RESULT: stopped at its time limit after {n} of {of} cells (their report)")
        sys.exit(1)
    print("RESULT: " + "; ".join(summary["verdict"][:1] or ["no verdict"]))


class _Stopped(BaseException):
    """SIGTERM in the study stage: not an ``Exception``, which a failing cell's handlers catch."""


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped


def run_study(
    path: Path, out: Path, *, cpu: bool = False, log: Callable[[str], Any] = print
) -> dict[str, Any]:
    """Train every cell of the study at ``path`` in this process (as the local executor would, but
    with an in-memory logger instead of MLflow) and write its report into ``out``. ``cpu``: the
    toy sizes of ``CPU_SIZES`` and ``CPU_VAL_TOKENS`` on the ``tiny`` preset, the emulated backend everywhere."""
    from ablate.report.frames import results_frames
    from ablate.report.render import build_report
    from ablate.report.verdict import verdict_lines
    from ablate.study import load_study

    study = load_study(path)
    results: list[Any] = []
    try:
        _train_cells(study, results, cpu, log)
    except _Stopped:  # SIGTERM: the stage's time is up; the cells trained so far are reported
        pass
    finally:  # a SIGTERM from here on ends the process as it would have
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    labels = [c.label for c, _, _ in results]
    left = [c.label for c in study.cells if c.label not in labels]
    if left:
        log(f"stopped: {len(results)} of {len(study.cells)} cells trained; not: {', '.join(left)}")
    out_info: dict[str, Any] = {"study": study.name, "partial": bool(left), "not_trained": left}
    if not results:
        return {**out_info, "cells": [], "report": None, "target_ppl": None, "verdict": []}
    cells, evals = results_frames(results)
    speedup = study.file.speedup
    profile = None if cpu else ARCH_PROFILES.get(_arch(results) or "")
    if profile and "device" not in speedup.model_fields_set:
        speedup = speedup.model_copy(update={"device": profile})
        log(f"report: the step-time model of {profile} (the GPU trained on)")
    result = build_report(cells, evals, study.target, speedup, out, study=study.name)
    if left:  # said first in the report itself
        md = result.report_md.read_text()
        result.report_md.write_text(
            f"**Partial**: the check's time ran out after {len(results)} of {len(study.cells)} "
            f"cells; not trained: {', '.join(left)}.\n\n{md}"
        )
    lead, items = verdict_lines(result.config_table)
    return {
        **out_info,
        "cells": cells[["label", "status", "tokens_per_s", "backend"]].to_dict("records"),
        "report": str(result.report_md),
        "target_ppl": result.target_ppl,
        "verdict": [f"- {item}" for item in items],
    }


def _arch(results: list[Any]) -> str | None:
    """The GPU arch (``sm_90``, ``gfx942``) the study's first cell trained on, if on a GPU."""
    from ablate.train.device import resolve_device
    from backends.gemm.native import device_arch

    return device_arch(resolve_device(results[0][0].config.device))


def _train_cells(study: Any, results: list[Any], cpu: bool, log: Callable[[str], Any]) -> None:
    """Train each cell of ``study`` in turn, appending (cell, result, environment) to ``results``."""
    import dataclasses

    from ablate.model import ModelConfig
    from ablate.train import MemoryLogger, train
    from ablate.train.provenance import environment

    for cell in study.cells:
        # no checkpoints: nothing here resumes a cell (a study's cells checkpoint into the folder
        # the runner gives them)
        cfg = dataclasses.replace(
            cell.config,
            checkpoint_dir=None,
            train=dataclasses.replace(cell.config.train, checkpoint_every=0),
        )
        if cpu:
            cfg = dataclasses.replace(
                cfg,
                device="cpu",
                backend="emulated",
                model=ModelConfig(preset="tiny"),
                data=dataclasses.replace(cfg.data, val_tokens=CPU_VAL_TOKENS),
                train=dataclasses.replace(cfg.train, **CPU_SIZES),
            )
        t0 = time.perf_counter()
        res = train(cfg, MemoryLogger())
        # kept before it is said: a SIGTERM after the line must not lose the cell
        results.append((dataclasses.replace(cell, config=cfg), res, environment(cfg)))
        log(
            f"{cell.label}: {res.status}, final val loss {res.final_val_loss:.4f}, "
            f"{res.tokens_per_s:,.0f} tokens/s, {time.perf_counter() - t0:.1f} s"
        )
