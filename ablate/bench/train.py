"""Training throughput of the presets per recipe, measured in one run.

For each preset it builds the model, optimizer and data as the trainer does for a study cell
(``loop._build``: ``train.compile`` applied, auto being on for CUDA; fused AdamW on CUDA; bfloat16
autocast on a GPU) and times its optimizer steps with each recipe: ``bf16`` (all high precision:
float32 on the CPU, bfloat16 autocast on a GPU), ``fp8`` (every GEMM FP8 per tensor, E4M3 forward and
E5M2 gradients; on the ``native`` backend where the device runs FP8, else emulated), ``mxfp4``
(MXFP4 on all three GEMMs, emulated), ``nvfp4`` (NVFP4 on all three, emulated) and ``mxfp4_h16``
(MXFP4 on all three after a deterministic 16-point Hadamard transform, ``dht16``, emulated). It
prints the median tokens/s and time per optimizer step and each recipe's step time relative to
``bf16``; with both ``fp8`` and ``mxfp4`` measured, also ``fp8_over_mxfp4``, the FP8 step time over
the MXFP4 one per preset (same run; in the JSON rows as the ``fp8`` row's ``fp8_over_mxfp4``).

Timing: after ``warmup`` steps (which compile), steps run in blocks of ``train.log_every`` (10 on
CUDA, 1 on the CPU: as often as the trainer waits for the device), the device synchronized at each
block's end; a row's step time is the median over blocks of the block's time per step. Evaluation
is not timed.

Run: ``python -m ablate.bench.train [--presets tiny small] [--recipes bf16 mxfp4] [--device cpu]
[--steps 12] [--compile auto] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ablate.data import DataConfig
from ablate.model import PRESETS, ModelConfig
from ablate.train.config import (
    Checkpointing,
    Compile,
    RunConfig,
    TrainConfig,
    resolved_compile,
    resolved_log_every,
)
from ablate.train.device import resolve_device
from ablate.train.logger import NullLogger
from ablate.train.loop import Run, build_run
from ablate.train.state import TrainState
from backends.gemm import UnsupportedFormatError, get_backend
from backends.recipes import GEMMS, Recipe

RECIPES = {
    "bf16": Recipe.bf16(),
    "fp8": Recipe.from_shorthand(base="fp8"),
    "mxfp4": Recipe.from_shorthand(GEMMS, "none"),
    "nvfp4": Recipe.from_shorthand(GEMMS, "none", fp4_format="nvfp4"),
    "mxfp4_h16": Recipe.from_shorthand(GEMMS, "dht16"),
}
BYTE_VOCAB = 257  # the built-in corpus's tokenizer (UTF-8 bytes + EOS)


def native_fp8_reason(device: torch.device) -> str | None:
    """Why the native backend cannot run the ``fp8`` recipe on ``device`` (None: it can)."""
    try:
        get_backend("native").check(RECIPES["fp8"], device)
    except UnsupportedFormatError as e:
        lines = [ln.strip() for ln in str(e).splitlines()]
        return "; ".join(ln for ln in lines[1:] if not ln.startswith("Use ")) or lines[0]
    return None


def backend_for(recipe: str, device: torch.device) -> str:
    """``native`` for FP8 where this device runs it, else ``emulated``."""
    if recipe == "fp8" and native_fp8_reason(device) is None:
        return "native"
    return "emulated"


def preset_vocab(preset: str) -> int | None:
    """The vocabulary a benchmark gives ``preset``: its own default where larger than the built-in
    corpus's byte vocabulary (``125m``: 32,000, so the LM head costs what it would with its
    tokenizer), else None (the tokenizer's)."""
    v = PRESETS[preset].vocab_size
    return v if v is not None and v > BYTE_VOCAB else None


def run_config(
    preset: str,
    recipe: Recipe,
    batch: int,
    seq_len: int,
    device: str = "cpu",
    backend: str = "emulated",
    compile: Compile = "auto",
    vocab_size: int | None = None,
    checkpointing: Checkpointing = "none",
) -> RunConfig:
    """The run a study cell of this preset and recipe would train (the built-in corpus)."""
    return RunConfig(
        model=ModelConfig(preset=preset, vocab_size=vocab_size),
        data=DataConfig(val_tokens=batch * seq_len + 1),
        train=TrainConfig(
            steps=10**6,
            batch_size=batch,
            seq_len=seq_len,
            warmup_steps=2,
            compile=compile,
            activation_checkpointing=checkpointing,
        ),
        recipe=recipe,
        backend=backend,
        device=device,
    )


def build(cfg: RunConfig) -> Run:
    """The trainer's model, optimizer and data for ``cfg``, in training mode. A fresh compile: the
    previous runs' compiled graphs are dropped (each model would otherwise count as a recompile of
    the same code, and past Dynamo's limit run eagerly)."""
    if resolved_compile(cfg.train.compile, resolve_device(cfg.device).type):
        torch._dynamo.reset()
    run = build_run(cfg, NullLogger(), None)
    run.model.train()
    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(run: Run, state: TrainState, warmup: int, steps: int) -> list[float]:
    """ms per step of each block of ``train.log_every`` steps (the last block may be shorter),
    after ``warmup`` steps; the device is synchronized at each block's end, as the trainer waits for
    it at each read."""
    for _ in range(warmup):
        run.optimizer_step(state)
    _sync(run.device)
    block = resolved_log_every(run.config.train.log_every, run.device.type)
    out: list[float] = []
    done = 0
    while done < steps:
        n = min(block, steps - done)
        t0 = time.perf_counter()
        for _ in range(n):
            run.optimizer_step(state)
        _sync(run.device)
        out.append((time.perf_counter() - t0) * 1e3 / n)
        done += n
    return out


def _timed(cfg: RunConfig, warmup: int, steps: int) -> tuple[Run, TrainState, list[float]]:
    run = build(cfg)
    state = TrainState()
    return run, state, time_steps(run, state, warmup, steps)


def measure(
    presets: list[str],
    recipes: list[str],
    device: str,
    steps: int,
    batch: int | dict[str, int],
    seq_len: int | dict[str, int],
    *,
    compile: Compile = "auto",
    warmup: int = 2,
    vocab: dict[str, int | None] | None = None,
    skip: dict[str, str] | None = None,
    after: Callable[[dict[str, Any], Run, TrainState], None] | None = None,
    keep_going: bool = False,
    checkpointing: Checkpointing = "none",
) -> list[dict[str, Any]]:
    """One row per (preset, recipe): backend, compiled or not, tokens/s, ms per step (median over
    blocks), step time / bf16's. ``batch``, ``seq_len`` and ``vocab`` may differ per preset;
    ``skip`` maps a recipe to why it is not measured (a row with ``skipped`` and no times);
    ``after(row, run, state)``, when given, is called with each run once timed (the profile of
    ``ablate.bench.gpu``); with ``keep_going`` a run that fails (out of memory, a compile error)
    becomes a skipped row saying why, instead of ending the measurement."""
    dev = resolve_device(device)
    skip = skip or {}
    rows: list[dict[str, Any]] = []
    for preset in presets:
        b = batch[preset] if isinstance(batch, dict) else batch
        t = seq_len[preset] if isinstance(seq_len, dict) else seq_len
        v = (vocab or {}).get(preset)
        base_ms = None
        for name in recipes:
            backend = backend_for(name, dev)
            row: dict[str, Any] = {"preset": preset, "recipe": name, "backend": backend}
            row["checkpointing"] = checkpointing
            row.update(batch=b, seq_len=t, recipe_label=RECIPES[name].short())
            if name in skip:
                row.update(tokens_per_s=None, step_ms=None, vs_bf16=None, skipped=skip[name])
                rows.append(row)
                continue
            try:  # in a call of its own: a failed run's memory goes with its frame
                cfg = run_config(
                    preset, RECIPES[name], b, t, device, backend, compile, v, checkpointing
                )
                run, state, times = _timed(cfg, warmup, steps)
            except Exception as e:  # noqa: BLE001 - with keep_going, any failure is the row's
                if not keep_going:
                    raise
                why = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                row.update(tokens_per_s=None, step_ms=None, vs_bf16=None, skipped=why)
                rows.append(row)
                continue
            ms = statistics.median(times)
            base_ms = ms if name == "bf16" else base_ms
            row.update(
                compiled=resolved_compile(compile, dev.type),
                vocab_size=run.data.vocab_size if v is None else v,
                n_params=run.n_params,
                tokens_per_s=b * t / (ms * 1e-3),
                step_ms=ms,
                block_ms=times,
                vs_bf16=ms / base_ms if base_ms else None,
            )
            rows.append(row)
            if after is not None:
                after(row, run, state)
            del run, state
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    for preset, ratio in fp8_over_mxfp4(rows).items():
        for r in rows:
            if r["preset"] == preset and r["recipe"] == "fp8":
                r["fp8_over_mxfp4"] = ratio
    return rows


def fp8_over_mxfp4(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per preset with both recipes measured: the ``fp8`` step time over the ``mxfp4`` one."""
    ms = {(r["preset"], r["recipe"]): r["step_ms"] for r in rows if r["step_ms"] is not None}
    return {
        p: ms[p, "fp8"] / ms[p, "mxfp4"]
        for p in dict.fromkeys(r["preset"] for r in rows)
        if (p, "fp8") in ms and (p, "mxfp4") in ms
    }


def add_compile_argument(ap: argparse.ArgumentParser) -> None:
    """``--compile auto|true|false`` (``parse_compile`` reads it)."""
    ap.add_argument(
        "--compile",
        choices=("auto", "true", "false"),
        default="auto",
        help="train.compile of the timed runs (auto: on for CUDA, as a study cell runs)",
    )


def parse_compile(value: str) -> Compile:
    """``--compile``'s auto|true|false as ``train.compile``."""
    return "auto" if value == "auto" else value == "true"


def report_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'preset':8s} {'recipe':9s} {'backend':9s} {'tok/s':>10s} {'ms/step':>9s} {'/bf16':>6s}"
    ]
    for r in rows:
        head = f"{r['preset']!s:8s} {r['recipe']!s:9s} {r['backend']!s:9s}"
        if r["step_ms"] is None:
            lines.append(f"{head} skipped: {r.get('skipped', '')}")
            continue
        rel = f"{r['vs_bf16']:6.2f}" if r["vs_bf16"] is not None else f"{'':6s}"
        lines.append(f"{head} {r['tokens_per_s']:10.0f} {r['step_ms']:9.2f} {rel}")
    for preset, ratio in fp8_over_mxfp4(rows).items():
        lines.append(f"fp8_over_mxfp4 {preset}: {ratio:.3f} (fp8 step time / mxfp4 step time)")
    return lines


def recompute_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per (preset, recipe) measured both ways: the checkpointed step time over the plain one."""
    ms = {
        (r["preset"], r["recipe"], r["checkpointing"]): r["step_ms"]
        for r in rows
        if r["step_ms"] is not None
    }
    out = []
    for (preset, recipe, mode), t in ms.items():
        if mode == "blocks" and (preset, recipe, "none") in ms:
            base = ms[preset, recipe, "none"]
            out.append(
                f"recompute {preset} {recipe}: {t:.1f} ms against {base:.1f} ms per step = "
                f"{t / base:.3f}x (activation_checkpointing blocks / none)"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--recipes", nargs="+", default=["bf16", "mxfp4"], choices=list(RECIPES))
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (they compile)")
    add_compile_argument(ap)
    ap.add_argument(
        "--activation-checkpointing",
        nargs="+",
        default=["none"],
        choices=["none", "blocks"],
        help="train.activation_checkpointing of the timed runs; both: the recompute's cost",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    compile = parse_compile(a.compile)
    try:
        resolve_device(a.device)
    except ValueError as e:
        ap.error(str(e))
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, device {a.device}; batch {a.batch} x {a.seq_len} tokens, "
        f"compile {a.compile}, median over steps"
    )
    rows = []
    for mode in a.activation_checkpointing:
        part = measure(
            a.presets,
            a.recipes,
            a.device,
            a.steps,
            a.batch,
            a.seq_len,
            compile=compile,
            warmup=a.warmup,
            checkpointing=mode,
        )
        if len(a.activation_checkpointing) > 1:
            print(f"activation_checkpointing: {mode}")
        print("\n".join(report_lines(part)))
        rows += part
    for line in recompute_lines(rows):
        print(line)
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
