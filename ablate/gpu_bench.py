"""The GPU benchmark: GEMM, quantizer and training-step throughput, written to ``reports/gpu/``.

On one GPU and in one process it measures:

- GEMM throughput (TFLOP/s) on Llama-3-8B-shaped matrices: BF16 ``torch.mm``, each native format the
  device runs (FP8 on Hopper; also MXFP8/MXFP4/NVFP4 on Blackwell), the native FP8 backend's whole
  GEMM with quantization, and the emulated MXFP4 GEMM (quantize-dequantize both operands + FP32
  GEMM): the GEMM rows of ``backends.bench``;
- the quantizer's fraction of the GPU's copy bandwidth on a (tokens x 4096) bfloat16 tensor, per
  quantize path, each checked bit for bit against the reference quantizer on the device (target:
  at least 0.70 for MXFP4 RNE): the quantizer rows of ``backends.bench``;
- the training step time of the ``small`` preset in BF16 (autocast), FP8 (native where the device
  runs it) and emulated full MXFP4 (target: MXFP4 at most 1.25x the BF16 step):
  ``ablate.train.bench``.

It prints the tables and the two targets met or missed, and writes them with the device, torch
version and date to ``reports/gpu/<date>-<arch>.md`` and ``.json``. On a machine without a GPU it
says so and exits 0. ``python -m backends.bench --device cuda --gemms`` measures the GEMM and
quantizer rows alone.

Run: ``python -m ablate.gpu_bench [--repeats 10] [--tokens 8192] [--steps 12] [--out reports/gpu]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from backends import bench
from backends.native import device_arch

from .train import bench as train_bench

QUANT_TARGET = 0.70  # fraction of copy bandwidth, MXFP4 RNE
STEP_TARGET = 1.25  # emulated full MXFP4 step / BF16 step


def measure(
    device: torch.device,
    tokens: int,
    repeats: int,
    steps: int,
    preset: str = "small",
    batch: int = 16,
    seq_len: int = 512,
    kn: Iterable[tuple[int, int]] = bench.LLAMA3_8B,
    quant_k: int = 4096,
) -> dict[str, Any]:
    """GEMM, quantizer and training-step rows on ``device``, with the targets evaluated (smaller
    ``preset``, ``kn`` and ``quant_k`` than the defaults only to check the benchmark itself)."""
    result = bench.measure(device, tokens, repeats, kn, (tokens, quant_k))
    result["arch"] = device_arch(device) or device.type
    result["date"] = dt.date.today().isoformat()
    rows = train_bench.measure(
        [preset], ["bf16", "fp8", "mxfp4"], str(device), steps, batch, seq_len
    )
    result["steps"] = rows
    result["train"] = {"preset": preset, "batch": batch, "seq_len": seq_len, "steps": steps}
    quant = {r["quantizer"]: r for r in result["quantizer"]}
    mx_step = next(r["vs_bf16"] for r in rows if r["recipe"] == "mxfp4")
    result["targets"] = {
        "quantizer_copy_fraction": {
            "measured": quant["mxfp4_rne"]["copy_fraction"],
            "target": QUANT_TARGET,
            "met": quant["mxfp4_rne"]["copy_fraction"] >= QUANT_TARGET,
        },
        "mxfp4_step_vs_bf16": {
            "measured": mx_step,
            "target": STEP_TARGET,
            "met": mx_step is not None and mx_step <= STEP_TARGET,
        },
    }
    return result


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = bench.report_lines(result)
    t = result["train"]
    lines.append(
        f"training step, preset {t['preset']}, batch {t['batch']} x {t['seq_len']} tokens, "
        f"median of {t['steps']} steps after warm-up"
    )
    lines += train_bench.report_lines(result["steps"])
    for name, v in result["targets"].items():
        verdict = "met" if v["met"] else "MISSED"
        lines.append(f"target {name}: {v['measured']:.3f} (target {v['target']}): {verdict}")
    return lines


def write(result: dict[str, Any], lines: list[str], out: Path) -> Path:
    """``<out>/<date>-<arch>.md`` (the printed tables) and ``.json`` (every figure)."""
    stem = out / f"{result['date']}-{result['arch']}"
    out.mkdir(parents=True, exist_ok=True)
    md = [
        f"# GPU benchmark, {result['device']}, {result['date']}",
        "",
        f"torch {result['torch']}; reproduce: `python -m ablate.gpu_bench`",
        "",
        "```",
        *lines,
        "```",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(md))
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return stem.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tokens", type=int, default=8192, help="M of every GEMM (default 8192)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per GEMM/quantizer row")
    ap.add_argument("--steps", type=int, default=12, help="training steps per recipe (default 12)")
    ap.add_argument("--out", default="reports/gpu", help="folder for the .md and .json")
    args = ap.parse_args(argv)
    if min(args.tokens, args.repeats, args.steps) < 1:
        ap.error("--tokens, --repeats and --steps must be positive")
    if not torch.cuda.is_available():
        print(f"ablate.gpu_bench: {bench.NO_GPU}")
        return 0
    result = measure(torch.device("cuda"), args.tokens, args.repeats, args.steps)
    lines = report_lines(result)
    print("\n".join(lines))
    print(f"wrote {write(result, lines, Path(args.out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
