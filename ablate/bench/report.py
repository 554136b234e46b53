"""Benchmark: ``python -m ablate.bench.report`` reports a synthetic study of 200 runs x 2,000
evaluations (10 configurations x 20 seeds) end to end with ``build_report`` and prints the median
wall time of three repetitions (the requirement is under 15 s on a 2-core machine).

The time covers everything ``ablate report`` does after reading the tracking store: de-duplication,
tokens to target, per-configuration statistics, three figures as PNG and SVG, Markdown, HTML and CSV.
Options: ``--configs``, ``--seeds``, ``--evals``, ``--repeat``, ``-o`` (keep the output there),
``--mlflow``: also log the study into a temporary SQLite MLflow store (one run per cell, through
``MlflowLogger``) and time reading the curves back (``tracking.read_histories``), which is what
``ablate report`` adds before ``build_report``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ablate.report.render import build_report
from ablate.report.synthetic import synthetic_study
from ablate.study.speedup import SpeedupSection


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ablate.bench.report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--configs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--evals", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "-o", "--out", type=Path, default=None, help="keep the report in this folder"
    )
    parser.add_argument(
        "--mlflow", action="store_true", help="also time reading the curves from an MLflow store"
    )
    args = parser.parse_args(argv)

    cells, evals, target_ppl = synthetic_study(
        args.configs, args.seeds, args.evals, eval_every=1, diverge={(3, 0): 0.6}
    )
    target = {"val_ppl": target_ppl, "val_loss": None, "from_baseline": None, "tolerance": 0.0}
    print(
        f"{len(cells)} runs x {args.evals} evaluations ({len(evals):,} rows), "
        f"{args.configs} configurations x {args.seeds} seeds",
        file=sys.stderr,
    )
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            out = args.out if args.out is not None else Path(tmp) / f"run{i}"
            start = time.perf_counter()
            build_report(cells, evals, target, SpeedupSection(), out, study="bench")
            times.append(time.perf_counter() - start)
            print(f"  run {i + 1}: {times[-1]:.2f} s", file=sys.stderr)
    print(f"median {statistics.median(times):.2f} s over {args.repeat} runs")
    if args.mlflow:
        _bench_read(cells, evals, args.repeat)
    return 0


def _bench_read(cells: Any, evals: Any, repeat: int) -> None:
    from ablate.tracking import MlflowLogger, StudyTracker, prepare_store, read_histories

    with tempfile.TemporaryDirectory() as tmp:
        uri = "sqlite:///" + str(Path(tmp) / "mlflow.db")
        prepare_store(uri, tmp)
        tracker = StudyTracker(uri, "bench", artifact_root=Path(tmp) / "artifacts")
        parent = tracker.parent_run("name: bench\n")
        start = time.perf_counter()
        run_ids = []
        for key, sub in evals.groupby("key", sort=False):
            rid = tracker.create_run(parent, str(key), str(key), {}, {})
            log = MlflowLogger(uri, rid, flush_points=5000, flush_interval_s=1e9)
            for step, tok, loss in zip(sub["step"], sub["tokens"], sub["val_loss"], strict=True):
                log.log_metrics({"val_loss": float(loss), "tokens": float(tok)}, int(step))
            log.close()
            run_ids.append(rid)
        print(f"logged {len(run_ids)} runs in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        times = []
        for i in range(repeat):
            start = time.perf_counter()
            h = read_histories(uri, run_ids, keys=("val_loss", "tokens"))
            times.append(time.perf_counter() - start)
            n = sum(len(v["val_loss"]) for v in h.values())
            print(f"  read {i + 1}: {times[-1]:.2f} s ({n:,} evaluations)", file=sys.stderr)
        print(f"read median {statistics.median(times):.2f} s over {repeat} runs")


if __name__ == "__main__":
    sys.exit(main())
