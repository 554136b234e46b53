"""The cost of a probe step relative to a training step, per intervention and probed GEMM set.

Trains a preset with full MXFP4 (FP8 elsewhere: nothing else) and each intervention, probing every
few steps, and prints the median of ``probe.cost`` (the probe step's wall time / the mean training
step so far) over the probe steps after the first.

Run: ``python -m ablate.bench.probe [--preset tiny] [--interventions none sr rht dht]
[--gemms wgrad] [--gemms fprop,dgrad,wgrad] [--steps 40] [--every 5] [--json]`` (one torch thread
unless ``--threads``, as a study's cell with ``resources.cpus: 1`` runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from typing import Any

import torch

from ablate.data import DataConfig
from ablate.model import ModelConfig
from ablate.train.config import ProbeConfig, RunConfig, TrainConfig
from ablate.train.logger import MemoryLogger
from ablate.train.loop import train
from backends.recipes import GEMMS, Recipe


def probe_cost(
    preset: str, intervention: str, gemms: list[str], *, steps: int, every: int, repeats: int
) -> dict[str, Any]:
    cfg = RunConfig(
        model=ModelConfig(preset=preset),
        data=DataConfig(val_tokens=8192),
        train=TrainConfig(
            steps=steps, batch_size=8, seq_len=128, warmup_steps=2, eval_every=steps, eval_batches=1
        ),
        recipe=Recipe.from_shorthand(GEMMS, intervention, base="fp8"),
        device="cpu",
        probe=ProbeConfig(every=every, gemms=gemms, repeats=repeats),  # type: ignore[arg-type]
    )
    log = MemoryLogger()
    res = train(cfg, log)
    cost = [v for _, v in log.series("probe.cost")][1:]
    return {
        "preset": preset,
        "intervention": intervention,
        "gemms": ",".join(gemms),
        "repeats": repeats,
        "probe_cost_median": statistics.median(cost),
        "probe_cost_min": min(cost),
        "probe_cost_max": max(cost),
        "step_ms": 1e3 * res.tokens / res.tokens_per_s / res.steps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--interventions", nargs="+", default=["none", "sr", "rht", "dht"])
    ap.add_argument(
        "--gemms",
        action="append",
        help="comma-separated GEMMs to probe; repeat for several sets (default: wgrad, then all)",
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=ProbeConfig().repeats)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sets = [s.split(",") for s in (a.gemms or ["wgrad", "fprop,dgrad,wgrad"])]
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; {a.preset}, batch 8 x 128, probe every {a.every} of "
        f"{a.steps} steps, repeats {a.repeats}"
    )
    print(
        f"{'intervention':12s} {'gemms':18s} {'ms/step':>8s} {'probe/step median (min-max)':>28s}"
    )
    rows = []
    for gemms in sets:
        for iv in a.interventions:
            r = probe_cost(a.preset, iv, gemms, steps=a.steps, every=a.every, repeats=a.repeats)
            rows.append(r)
            print(
                f"{iv:12s} {r['gemms']:18s} {r['step_ms']:8.1f} "
                f"{r['probe_cost_median']:14.2f}x ({r['probe_cost_min']:.2f}-"
                f"{r['probe_cost_max']:.2f})",
                flush=True,
            )
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
