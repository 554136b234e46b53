"""Training throughput of the presets per recipe, measured in one run.

For each preset it trains a few steps with each recipe: ``bf16`` (all high precision: float32 on the
CPU, bfloat16 autocast on a GPU), ``fp8`` (every GEMM FP8 per tensor, E4M3 forward and E5M2
gradients; on the ``native`` backend where the device runs FP8, else emulated) and ``mxfp4`` (MXFP4
on all three GEMMs, emulated), and prints the median tokens/s and step time per optimizer step
(evaluation excluded, the first steps dropped as warm-up) and each recipe's step time relative to
``bf16``; with both ``fp8`` and ``mxfp4`` measured, also ``fp8_over_mxfp4``, the FP8 step time over
the MXFP4 one per preset (same run; in the JSON rows as the ``fp8`` row's ``fp8_over_mxfp4``).

Run: ``python -m ablate.train.bench [--presets tiny small] [--recipes bf16 mxfp4] [--device cpu]
[--steps 12] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from typing import Any

import torch

from backends.gemm import UnsupportedFormatError
from backends.recipe import GEMMS, Recipe
from backends.registry import get_backend

from .config import RunConfig, TrainConfig
from .data import DataConfig
from .device import resolve_device
from .logger import MemoryLogger
from .loop import train
from .model import ModelConfig

RECIPES = {
    "bf16": Recipe.bf16(),
    "fp8": Recipe.from_shorthand(base="fp8"),
    "mxfp4": Recipe.from_shorthand(GEMMS, "none"),
}


def backend_for(recipe: str, device: torch.device) -> str:
    """``native`` for FP8 where this device runs it, else ``emulated``."""
    if recipe != "fp8":
        return "emulated"
    try:
        get_backend("native").check(RECIPES[recipe], device)
    except UnsupportedFormatError:
        return "emulated"
    return "native"


def step_tokens_per_s(
    preset: str,
    recipe: Recipe,
    steps: int,
    batch: int,
    seq_len: int,
    device: str = "cpu",
    backend: str = "emulated",
) -> float:
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
        backend=backend,
        device=device,
    )
    log = MemoryLogger()
    train(cfg, log)
    # the logged tokens_per_s is cumulative (tokens / training time): recover each step's time
    cum = [(m["tokens"], m["tokens"] / m["tokens_per_s"]) for _, m in log.metrics if "lr" in m]
    times = [b[1] - a[1] for a, b in zip(cum, cum[1:], strict=False)]
    times = times[2:] or times  # drop warm-up steps
    return batch * seq_len / statistics.median(times)


def measure(
    presets: list[str], recipes: list[str], device: str, steps: int, batch: int, seq_len: int
) -> list[dict[str, Any]]:
    """One row per (preset, recipe): backend, tokens/s, ms per step, step time / bf16's."""
    dev = resolve_device(device)
    rows: list[dict[str, Any]] = []
    for preset in presets:
        base_ms = None
        for name in recipes:
            backend = backend_for(name, dev)
            tps = step_tokens_per_s(preset, RECIPES[name], steps, batch, seq_len, device, backend)
            ms = batch * seq_len / tps * 1e3
            base_ms = ms if name == "bf16" else base_ms
            rows.append(
                {
                    "preset": preset,
                    "recipe": name,
                    "backend": backend,
                    "tokens_per_s": tps,
                    "step_ms": ms,
                    "vs_bf16": ms / base_ms if base_ms else None,
                }
            )
    for preset, ratio in fp8_over_mxfp4(rows).items():
        for r in rows:
            if r["preset"] == preset and r["recipe"] == "fp8":
                r["fp8_over_mxfp4"] = ratio
    return rows


def fp8_over_mxfp4(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per preset with both recipes measured: the ``fp8`` step time over the ``mxfp4`` one."""
    ms = {(r["preset"], r["recipe"]): r["step_ms"] for r in rows}
    return {
        p: ms[p, "fp8"] / ms[p, "mxfp4"]
        for p in dict.fromkeys(r["preset"] for r in rows)
        if (p, "fp8") in ms and (p, "mxfp4") in ms
    }


def report_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'preset':8s} {'recipe':8s} {'backend':9s} {'tok/s':>10s} {'ms/step':>9s} {'/bf16':>6s}"
    ]
    for r in rows:
        rel = f"{r['vs_bf16']:6.2f}" if r["vs_bf16"] is not None else f"{'':6s}"
        lines.append(
            f"{r['preset']!s:8s} {r['recipe']!s:8s} {r['backend']!s:9s} "
            f"{r['tokens_per_s']:10.0f} {r['step_ms']:9.2f} {rel}"
        )
    for preset, ratio in fp8_over_mxfp4(rows).items():
        lines.append(f"fp8_over_mxfp4 {preset}: {ratio:.3f} (fp8 step time / mxfp4 step time)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--recipes", nargs="+", default=["bf16", "mxfp4"], choices=list(RECIPES))
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        resolve_device(a.device)
    except ValueError as e:
        ap.error(str(e))
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, device {a.device}; batch {a.batch} x {a.seq_len} tokens, "
        "median over steps"
    )
    rows = measure(a.presets, a.recipes, a.device, a.steps, a.batch, a.seq_len)
    print("\n".join(report_lines(rows)))
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
