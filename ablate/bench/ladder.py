"""How often the ladder's 95% intervals hold: ``python -m ablate.bench.ladder``.

It draws synthetic ladders (``ablate.report.ladder.simulate``: 4 sizes spanning 10x in N, 3
budgets of 10, 20 and 40 tokens per parameter, seed noise of a run's whole curve plus each
evaluation's), fits each as ``ablate report`` does, and counts how often the prediction's interval
holds the true token ratio at 10x and 30x the largest size (20 tokens per parameter), for Quartet's
own law and for laws of another form, at several seed counts and noise levels; and how often the
back-test says its interval covered what the held-out size measured (a 95% interval: about 95% of
the time when the law holds). The table it prints is docs/ladders.md's; ``--json`` for a machine.

    python -m ablate.bench.ladder --ladders 200 --boot 400
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from ablate.report.ladder.predict import backtest, predict_many
from ablate.report.ladder.simulate import (
    CHINCHILLA,
    Truth,
    additive_truth,
    draw_ladder,
    quartet_truth,
    true_ratio,
)

SIZES = (2e6, 4.6e6, 1e7, 2e7)
TOKENS_PER_PARAM = (10.0, 20.0, 40.0)
SCALES = (10, 30)


def truths() -> dict[str, Truth]:
    """The laws the ladders are drawn from."""
    return {
        "quartet": quartet_truth(
            CHINCHILLA, {"effD 0.8": (1.0, 0.8), "effN 0.85": (0.85, 1.0), "same": (1.0, 1.0)}
        ),
        "additive": additive_truth(),
    }


def coverage(
    truth: Truth,
    *,
    ladders: int,
    seeds: int,
    noise: float,
    boot: int,
    rng_base: int = 0,
) -> dict[str, Any]:
    """Per configuration: the fraction of ``ladders`` whose interval (combined, Quartet's, the
    trend's) holds the truth at each scale, their median width (log hi/lo), and the back-test's
    "covered" rate."""
    hits: dict[str, dict[str, list[float]]] = {}
    for i in range(ladders):
        f = draw_ladder(
            truth, SIZES, TOKENS_PER_PARAM, seeds, sigma_run=noise, sigma_eval=noise / 3,
            rng=np.random.default_rng(rng_base + i),
        )  # fmt: skip
        targets = [(k * SIZES[-1], 20.0 * k * SIZES[-1]) for k in SCALES]
        for k, preds in zip(
            SCALES, predict_many(f, "baseline", targets, boot=boot, seed=i), strict=True
        ):
            n, d = k * SIZES[-1], 20.0 * k * SIZES[-1]
            for p in preds:
                true = true_ratio(truth, p.config, n, d)
                lo, hi = p.hull()
                h = hits.setdefault(p.config, {})
                h.setdefault(f"combined {k}x", []).append(lo <= true <= hi)
                h.setdefault(f"quartet {k}x", []).append(p.lo <= true <= p.hi)
                h.setdefault(f"trend {k}x", []).append(
                    p.trend is not None and p.trend[1] <= true <= p.trend[2]
                )
                h.setdefault(f"width {k}x", []).append(
                    math.log(hi / lo) if hi < math.inf else math.inf
                )
        for b in backtest(f, "baseline", tokens_per_param=20.0, boot=boot, seed=i):
            hits.setdefault(b.config, {}).setdefault("backtest", []).append(b.covered)
    return {
        cfg: {
            k: float(np.median(v)) if k.startswith("width") else float(np.mean(v))
            for k, v in h.items()
        }
        for cfg, h in hits.items()
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ladders", type=int, default=100, help="ladders per row (default 100)")
    ap.add_argument("--boot", type=int, default=400, help="bootstrap refits per ladder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.03])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for name, truth in truths().items():
        for seeds in args.seeds:
            for noise in args.noise:
                t0 = time.monotonic()
                cov = coverage(
                    truth, ladders=args.ladders, seeds=seeds, noise=noise, boot=args.boot
                )
                for cfg, c in cov.items():
                    rows.append({"truth": name, "seeds": seeds, "noise": noise, "config": cfg, **c,
                                 "seconds_per_ladder": (time.monotonic() - t0) / args.ladders})  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{args.ladders} ladders per row, {args.boot} bootstrap refits; coverage of the 95% interval"
    )
    print(
        "| law | seeds | noise | configuration | combined 10x | 30x | Quartet 10x | 30x | trend 10x | 30x | back-test covered | width 30x |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['truth']} | {r['seeds']} | {r['noise']} | {r['config']} | "
            + " | ".join(f"{r[k]:.2f}" for k in ("combined 10x", "combined 30x", "quartet 10x",
                                                   "quartet 30x", "trend 10x", "trend 30x", "backtest"))
            + f" | {r['width 30x']:.2f} |"
        )  # fmt: skip


if __name__ == "__main__":
    main()
