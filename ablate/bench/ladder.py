"""How often the ladder's 95% intervals hold, how wide they are and how far the point lands from
the truth: ``python -m ablate.bench.ladder``.

It draws synthetic ladders (``ablate.report.ladder.simulate``: seed noise of a run's whole curve
plus each evaluation's) in two designs, fits each as ``ablate report`` does and reads the
prediction against the true token ratio:

- ``10x``: 4 sizes of 2M-20M non-embedding parameters, budgets of 10, 20 and 40 tokens per
  parameter, predicted at 10x and 30x the largest size (20 tokens per parameter);
- ``8B``: studies/ladder_8b.yaml's design, 5 sizes of 18.9M-973M at 10, 20 and 40 tokens per
  parameter, predicted at Llama 3.1-8B (6.98e9 non-embedding parameters, 20 tokens each).

The laws (``truths``): Quartet's own (Chinchilla's constants; configurations at effD 0.8 and at
effN 0.85), a penalty that changes with size in Quartet's form (a token ratio of 1.39 at 30M
falling to 1.19 at 8B, and one rising from 1.19 to 1.39), and one not of Quartet's form (additive
penalties: one that shrinks with N, one of Chen et al.'s form whose cost grows with N). The table
it prints is docs/ladders.md's; ``--json`` for a machine.

    python -m ablate.bench.ladder --ladders 40 --boot 200 --seeds 2 3 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from ablate.report.ladder.predict import backtest, predict_many
from ablate.report.ladder.simulate import (
    CHINCHILLA,
    Truth,
    additive_truth,
    draw_ladder,
    quartet_truth,
    sloped_truth,
    true_ratio,
)

DESIGNS: dict[str, tuple[tuple[float, ...], tuple[float, ...], dict[str, tuple[float, float]]]] = {
    "10x": (
        (2e6, 4.6e6, 1e7, 2e7),
        (10.0, 20.0, 40.0),
        {"10x": (2e8, 4e9), "30x": (6e8, 1.2e10)},
    ),
    "8B": (
        (1.89e7, 4.83e7, 1.01e8, 2.41e8, 9.73e8),
        (10.0, 20.0, 40.0),
        {"8B": (6.98e9, 1.396e11)},
    ),
}
"""Per design: its sizes, tokens per parameter, and targets (N*, D*) by name."""


def truths() -> dict[str, Truth]:
    """The laws the ladders are drawn from."""
    return {
        "quartet": quartet_truth(CHINCHILLA, {"effD 0.8": (1.0, 0.8), "effN 0.85": (0.85, 1.0)}),
        "sloped": sloped_truth(
            CHINCHILLA, {"shrinking": (1.39, 1.19), "growing": (1.19, 1.39)}, (3e7, 8e9)
        ),
        "additive": additive_truth(),
    }


def _one(job: tuple[str, str, int, float, int, int]) -> list[dict[str, Any]]:
    """One ladder's readings: a row per (configuration, target)."""
    truth_name, design, seeds, noise, boot, i = job
    truth = truths()[truth_name]
    sizes, tpp, targets = DESIGNS[design]
    f = draw_ladder(
        truth, sizes, tpp, seeds, sigma_run=noise, sigma_eval=noise / 3,
        rng=np.random.default_rng(i),
    )  # fmt: skip
    named = list(targets.items())
    predicted = predict_many(f, "baseline", [t for _, t in named], boot=boot, seed=i)
    tests = backtest(f, "baseline", tokens_per_param=20.0, boot=boot, seed=i)
    covered = {b.config: b.covered for b in tests}
    out = []
    for (target, (n, d)), preds in zip(named, predicted, strict=True):
        for p in preds:
            true = true_ratio(truth, p.config, n, d)
            out.append(
                {
                    "truth": truth_name, "config": p.config, "target": target, "seeds": seeds,
                    "noise": noise, "true": true, "ratio": p.ratio, "lo": p.lo, "hi": p.hi,
                    "sloped": p.prefers == "sloped",
                    "q_ratio": p.quartet[0], "q_lo": p.quartet[1], "q_hi": p.quartet[2],
                    "trend": p.trend is not None and p.trend[1] <= true <= p.trend[2],
                    "backtest": covered.get(p.config, True),
                }
            )  # fmt: skip
    return out


def summarize(readings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (truth, configuration, target, seeds, noise): coverage of the prediction's interval, its
    median width (hi / lo), the point's mean error in the ratio, and the rest's rates."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in readings:
        groups.setdefault(
            (r["truth"], r["config"], r["target"], r["seeds"], r["noise"]), []
        ).append(r)
    rows = []
    for (truth, cfg, target, seeds, noise), rs in groups.items():
        finite = [r for r in rs if math.isfinite(r["true"]) and math.isfinite(r["ratio"])]
        rows.append(
            {
                "truth": truth, "config": cfg, "target": target, "seeds": seeds, "noise": noise,
                "ladders": len(rs), "true": float(np.median([r["true"] for r in rs])),
                "coverage": float(np.mean([r["lo"] <= r["true"] <= r["hi"] for r in rs])),
                "width": float(np.exp(np.median([math.log(r["hi"] / r["lo"]) for r in rs]))),
                "bias": float(np.mean([r["ratio"] - r["true"] for r in finite])) if finite else math.nan,
                "sloped": float(np.mean([r["sloped"] for r in rs])),
                "quartet": float(np.mean([r["q_lo"] <= r["true"] <= r["q_hi"] for r in rs])),
                "q_width": float(np.exp(np.median([math.log(r["q_hi"] / r["q_lo"]) for r in rs]))),
                "q_bias": float(np.mean([r["q_ratio"] - r["true"] for r in finite])) if finite else math.nan,
                "trend": float(np.mean([r["trend"] for r in rs])),
                "backtest": float(np.mean([r["backtest"] for r in rs])),
            }
        )  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """docs/ladders.md's table of ``summarize``'s rows."""
    out = [
        "| law | configuration | target | seeds | true ratio | coverage | median width | bias | Quartet alone: coverage | width | bias | trend alone: coverage | back-test covered | back-test prefers sloped |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for r in rows:
        out.append(
            f"| {r['truth']} | {r['config']} | {r['target']} | {r['seeds']} | {r['true']:.3g} | "
            f"{r['coverage']:.2f} | x{r['width']:.2f} | {r['bias']:+.3f} | {r['quartet']:.2f} | "
            f"x{r['q_width']:.2f} | {r['q_bias']:+.3f} | {r['trend']:.2f} | {r['backtest']:.2f} | "
            f"{r['sloped']:.2f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ladders", type=int, default=40, help="ladders per row (default 40)")
    ap.add_argument("--boot", type=int, default=200, help="bootstrap refits per ladder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.01])
    ap.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=list(DESIGNS))
    ap.add_argument("--truths", nargs="+", default=list(truths()), choices=list(truths()))
    ap.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    jobs = [
        (t, design, seeds, noise, args.boot, i)
        for t in args.truths
        for design in args.designs
        for seeds in args.seeds
        for noise in args.noise
        for i in range(args.ladders)
    ]
    t0 = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        readings = [r for rs in pool.map(_one, jobs, chunksize=4) for r in rs]
    rows = summarize(readings)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{args.ladders} ladders per row, {args.boot} bootstrap refits, "
        f"{len(jobs)} ladders in {time.monotonic() - t0:.0f} s; the 95% interval's coverage"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
