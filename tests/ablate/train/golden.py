"""The golden trajectories: a few cells trained for a few steps on the CPU, their per-step training
losses and validation losses pinned in ``golden.json`` (``test_golden.py`` compares).

Pinned bit for bit (as float hex) on the machine kind that wrote them (``machine()``: torch's
version and CPU capability); on another kind they agree within ``RTOL`` (measured, see
docs/measured.md). The file also keeps, per numerics version, a digest of the values pinned under
it: numbers that change under an unchanged version are refused when re-pinning.

Re-pin (after bumping ``ablate.numerics.NUMERICS_VERSION``, on the pinning machine kind)::

    python tests/ablate/train/golden.py --write

Measure another machine kind's agreement, step by step (docs/measured.md)::

    python tests/ablate/train/golden.py --compare
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from ablate.data import DataConfig  # noqa: E402
from ablate.model import ModelConfig  # noqa: E402
from ablate.numerics import NUMERICS_VERSION  # noqa: E402
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train  # noqa: E402
from backends.recipes import GEMMS, Recipe  # noqa: E402

PATH = Path(__file__).with_name("golden.json")
RTOL = 2.5e-2
"""Relative agreement of two machine kinds' losses over these six steps: the largest difference
measured between two kinds was 1.2e-2 (RHT16's last step, AVX2 against the default kernels; see
docs/measured.md, "Golden trajectories"). FP4 rounding turns a last-bit difference into a
different rounding choice, so the agreement loosens step by step."""

TRAIN = TrainConfig(steps=6, batch_size=4, seq_len=64, eval_every=3, warmup_steps=2, lr=3e-3)


def _cell(recipe: Recipe, model: ModelConfig | None = None) -> RunConfig:
    return RunConfig(
        model=model or ModelConfig(preset="tiny"),
        data=DataConfig(val_tokens=4096),
        train=TRAIN,
        recipe=recipe,
        seed=0,
        device="cpu",
    )


CELLS: dict[str, Callable[[], RunConfig]] = {
    "bf16": lambda: _cell(Recipe.bf16()),
    "fp8": lambda: _cell(Recipe.from_shorthand([], base="fp8")),
    "mxfp4_sr": lambda: _cell(Recipe.from_shorthand(GEMMS, "sr", base="fp8")),
    "mxfp4_rht16": lambda: _cell(Recipe.from_shorthand(GEMMS, "rht16", base="fp8")),
    "mxfp4_dht16": lambda: _cell(Recipe.from_shorthand(GEMMS, "dht16", base="fp8")),
    "nvfp4": lambda: _cell(Recipe.from_shorthand(GEMMS, fp4_format="nvfp4", base="fp8")),
    "qwen3_mxfp4_wgrad_sr": lambda: _cell(
        Recipe.from_shorthand(["wgrad"], "sr", base="fp8"),
        ModelConfig(hf=str(ROOT / "studies" / "qwen3_tiny" / "config.json")),
    ),
}
"""The pinned cells: BF16, FP8, full MXFP4 with SR, RHT16 and DHT16, full NVFP4, and a Hugging
Face architecture (Qwen3) with MXFP4 SR on wgrad."""


def _vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, str]:
    """What decides the bits of a CPU run: torch's version and CPU capability (its vectorized
    kernels), the CPU's vendor (the BLAS picks its GEMM kernels by it) and the architecture."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_vendor": _vendor(),
        "arch": platform.machine(),
    }


def trajectory(cfg: RunConfig) -> dict[str, list[float]]:
    """Per-step training losses and the validation losses of one cell."""
    log = MemoryLogger()
    result = train(cfg, log)
    assert result.status == "finished", result.reason
    return {
        "train_loss": [v for _, v in log.series("train_loss")],
        "val_loss": [v for _, v in log.series("val_loss")],
    }


def trajectories() -> dict[str, dict[str, list[float]]]:
    return {name: trajectory(make()) for name, make in CELLS.items()}


def digest(cells: dict[str, dict[str, list[float]]]) -> str:
    blob = json.dumps(
        {k: {s: [v.hex() for v in vs] for s, vs in c.items()} for k, c in cells.items()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(PATH.read_text())
    d["cells"] = {
        k: {s: [float.fromhex(v) for v in vs] for s, vs in c.items()} for k, c in d["cells"].items()
    }
    return d


def write() -> None:
    cells = trajectories()
    old = json.loads(PATH.read_text()) if PATH.exists() else {}
    history: dict[str, str] = dict(old.get("history", {}))
    pinned = history.get(str(NUMERICS_VERSION))
    if pinned is not None and pinned != digest(cells):
        raise SystemExit(
            f"the numbers moved under numerics version {NUMERICS_VERSION} (pinned digest {pinned}, "
            f"now {digest(cells)}): bump NUMERICS_VERSION in ablate/numerics.py, then re-pin"
        )
    history[str(NUMERICS_VERSION)] = digest(cells)
    out = {
        "numerics": NUMERICS_VERSION,
        "machine": machine(),
        "history": history,
        "cells": {k: {s: [v.hex() for v in vs] for s, vs in c.items()} for k, c in cells.items()},
    }
    PATH.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"pinned {len(cells)} cells under numerics {NUMERICS_VERSION} on {machine()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--write", action="store_true", help="re-pin golden.json on this machine")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="train here and print each step's relative difference from the pinned values",
    )
    args = ap.parse_args()
    if args.write:
        write()
    elif args.compare:
        pinned = load()
        print(f"pinned on {pinned['machine']}, here {machine()}")
        for name, got in trajectories().items():
            for series, values in got.items():
                want = pinned["cells"][name][series]
                rel = [abs(a - b) / abs(b) for a, b in zip(values, want, strict=True)]
                print(f"{name:22s} {series:10s} " + " ".join(f"{r:.1e}" for r in rel))
    else:
        print(json.dumps(trajectories(), indent=1))
