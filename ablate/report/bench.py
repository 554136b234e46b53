"""Benchmark: ``python -m ablate.report.bench`` reports a synthetic study of 200 runs x 2,000
evaluations (10 configurations x 20 seeds) end to end with ``build_report`` and prints the median
wall time of three repetitions (the requirement is under 15 s on a 2-core machine).

The time covers everything ``ablate report`` does after reading the tracking store: de-duplication,
tokens to target, per-configuration statistics, three figures as PNG and SVG, Markdown, HTML and CSV.
Options: ``--configs``, ``--seeds``, ``--evals``, ``--repeat``, ``-o`` (keep the output there).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .render import build_report
from .speedup import SpeedupSpec
from .synthetic import synthetic_study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ablate.report.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--configs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--evals", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "-o", "--out", type=Path, default=None, help="keep the report in this folder"
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
            build_report(cells, evals, target, SpeedupSpec(), out, study="bench")
            times.append(time.perf_counter() - start)
            print(f"  run {i + 1}: {times[-1]:.2f} s", file=sys.stderr)
    print(f"median {statistics.median(times):.2f} s over {args.repeat} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
