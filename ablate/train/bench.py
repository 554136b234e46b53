"""Training throughput of the presets in high precision and full MXFP4, measured in one run.

For each preset it trains a few steps with the all-high-precision recipe and with MXFP4 on all three
GEMMs (emulated), and prints the median tokens/s per optimizer step (evaluation excluded, the first
steps dropped as warm-up) and the MXFP4 / high-precision ratio.

Run: ``python -m ablate.train.bench [--presets tiny small] [--steps 12] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

from backends.recipe import GEMMS, Recipe

from .config import RunConfig, TrainConfig
from .data import DataConfig
from .logger import MemoryLogger
from .loop import train
from .model import ModelConfig

RECIPES = {"bf16": Recipe.bf16(), "mxfp4": Recipe.from_shorthand(GEMMS, "none")}


def step_tokens_per_s(preset: str, recipe: Recipe, steps: int, batch: int, seq_len: int) -> float:
    cfg = RunConfig(
        model=ModelConfig(preset=preset),
        data=DataConfig(val_tokens=4096),
        train=TrainConfig(
            steps=steps,
            batch_size=batch,
            seq_len=seq_len,
            warmup_steps=2,
            eval_every=steps,
            eval_batches=1,
        ),
        recipe=recipe,
        device="cpu",
    )
    log = MemoryLogger()
    train(cfg, log)
    # the logged tokens_per_s is cumulative (tokens / training time): recover each step's time
    cum = [(m["tokens"], m["tokens"] / m["tokens_per_s"]) for _, m in log.metrics if "lr" in m]
    times = [b[1] - a[1] for a, b in zip(cum, cum[1:], strict=False)]
    times = times[2:] or times  # drop warm-up steps
    return batch * seq_len / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; batch {a.batch} x {a.seq_len} tokens, median over steps"
    )
    out: dict[str, float] = {}
    print(f"{'preset':8s} {'bf16 tok/s':>12s} {'mxfp4 tok/s':>12s} {'mxfp4/bf16':>11s}")
    for preset in a.presets:
        r = {
            k: step_tokens_per_s(preset, v, a.steps, a.batch, a.seq_len) for k, v in RECIPES.items()
        }
        ratio = r["mxfp4"] / r["bf16"]
        out.update(
            {f"{preset}_bf16": r["bf16"], f"{preset}_mxfp4": r["mxfp4"], f"{preset}_ratio": ratio}
        )
        print(f"{preset:8s} {r['bf16']:12.0f} {r['mxfp4']:12.0f} {ratio:11.2f}")
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
