"""The GPU benchmark: training step time per recipe, the quantizer against the copy bandwidth, a
profile of the emulated step; written to ``reports/gpu/`` (Markdown and JSON).

On one GPU and in one process it measures:

- the training step time of the presets ``small`` (batch 32 x 512 tokens) and ``125m`` (8 x 2048,
  its 32,000-token vocabulary) built as a study cell's run is (``ablate.bench.train``: the trainer's
  ``train.compile``, auto being on for CUDA, fused AdamW, bfloat16 autocast), per recipe: ``bf16``;
  ``fp8`` on the native backend (per-tensor FP8 on all GEMMs; skipped, with the reason, on a device
  without FP8 GEMMs); and, emulated, full ``mxfp4``, full ``nvfp4`` and ``mxfp4_h16`` (MXFP4 on all
  three GEMMs after the deterministic 16-point Hadamard transform, ``dht16``); with the ratios
  ``native_fp8_step_over_bf16``, ``emulated_mxfp4_step_over_bf16``,
  ``emulated_nvfp4_step_over_bf16`` and ``emulated_mxfp4_h16_step_over_bf16`` per preset;
- the quantizer's fraction of the device's copy bandwidth on an 8192 x 4096 bfloat16 tensor, per
  path (plain RNE, +SR, +H16, and the other rows of ``ablate.bench.numerics``), each output checked bit for
  bit against the reference quantizer on the device and against the same input copied to the CPU
  (the CPU's fast path for every row; the pure reference for RNE, SR and H16);
- a ``torch.profiler`` profile of a few emulated-MXFP4 steps of ``125m`` (``--profile`` names other
  recipes too): the kernels that take the most device time (name, calls, total ms, % of the step)
  and the share per kind of kernel;
- the GEMM rows of ``ablate.bench.numerics`` (BF16, native and emulated GEMM TFLOP/s on Llama-3-8B shapes;
  ``--no-gemms`` skips them).

It evaluates the goals (``GOALS``), prints everything and writes ``reports/gpu/<date>-<arch>.md``
and ``.json`` with the device, torch, CUDA, date and command. On a machine without a GPU it says so
and exits 0. ``--device cpu --dry-run`` runs the whole pipeline at toy sizes on the CPU (the tests;
the file name ends in ``-dry-run``).

Run on a GPU machine: ``python -m ablate.bench.gpu`` (``--compile auto|true|false``, ``--steps``,
``--warmup``, ``--presets``, ``--recipes``, ``--profile``, ``--profile-steps``, ``--out``;
``--help`` lists them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from ablate.bench import numerics as bench
from ablate.bench import train as train_bench
from ablate.bench.gpu_render import report_lines, write
from ablate.train.config import Compile, resolved_compile
from ablate.train.loop import Run
from ablate.train.state import TrainState
from backends.gemm.native import device_arch

PRESETS = ("small", "125m")
BATCH = {"small": (32, 512), "125m": (8, 2048), "tiny": (2, 32)}
"""(batch, seq_len) per preset: 16,384 tokens per step for both (``small`` is limited to 512)."""
RECIPES = ("bf16", "fp8", "mxfp4", "nvfp4", "mxfp4_h16")
RATIOS = {
    "fp8": "native_fp8_step_over_bf16",
    "mxfp4": "emulated_mxfp4_step_over_bf16",
    "nvfp4": "emulated_nvfp4_step_over_bf16",
    "mxfp4_h16": "emulated_mxfp4_h16_step_over_bf16",
}
QUANT_TARGET = 0.70  # fraction of copy bandwidth
STEP_TARGET = 1.25  # emulated full MXFP4 step / BF16 step, on 125m
QUANT_GOAL_ROWS = ("mxfp4_rne", "mxfp4_sr", "mxfp4_h16")
DRY_RUN = {
    "presets": ["tiny"],
    "batch": {"tiny": (2, 32)},
    "steps": 2,
    "warmup": 1,
    "tokens": 32,
    "kn": [(64, 96)],
    "quant_shape": (64, 256),
    "repeats": 1,
    "profile_steps": 1,
}
"""Toy sizes of ``--dry-run``: every code path in seconds on the CPU."""


def kernel_kind(name: str) -> str:
    """A kernel's kind from its name: gemm, attention, triton (Inductor-fused: the quantizer, norms,
    elementwise), optimizer, memory, or other."""
    n = name.lower()
    if n.startswith("triton"):  # named after the ops it feeds: "..._scaled_mm_v2_..." is no GEMM
        return "triton"
    if n in ("aten::mm", "aten::addmm", "aten::bmm") or any(
        k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "scaled_mm")
    ):
        return "gemm"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in n for k in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    if any(k in n for k in ("memcpy", "memset", "copy_")):
        return "memory"
    return "other"


def profile(
    run: Run, state: TrainState, steps: int, step_ms: float, top: int = 25
) -> dict[str, Any]:
    """``torch.profiler`` over ``steps`` optimizer steps of a warm ``run``: the ``top`` kernels by
    device time (CUDA; on the CPU, aten ops by self CPU time) with calls, total ms and % of the
    ``steps`` x ``step_ms`` the steps take untraced; the device time per kind of kernel; and the
    device's busy fraction (all kernels' time over the steps' time: well below 1 on a GPU, the
    step waits on the host)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = run.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(steps):
            run.optimizer_step(state)
        if cuda:
            torch.cuda.synchronize(run.device)
    rows = []
    for e in prof.key_averages():
        on_device = not str(getattr(e, "device_type", "CPU")).endswith("CPU")
        if cuda != on_device:
            continue
        if cuda:  # self_cuda_time_total: the name before torch 2.4
            t = getattr(e, "self_device_time_total", None)
            us = float(t if t is not None else getattr(e, "self_cuda_time_total", 0.0))
        else:
            us = float(e.self_cpu_time_total)
        if us > 0:
            rows.append({"name": e.key, "calls": int(e.count), "total_ms": us / 1e3})
    rows.sort(key=lambda r: -r["total_ms"])
    window = steps * step_ms
    total = sum(r["total_ms"] for r in rows)
    kinds: dict[str, float] = {}
    for r in rows:
        r["kind"] = kernel_kind(r["name"])
        r["pct_of_step"] = 100 * r["total_ms"] / window
        kinds[r["kind"]] = kinds.get(r["kind"], 0.0) + r["total_ms"]
    return {
        "preset": run.config.model.preset,
        "recipe": run.config.recipe.short(),
        "steps": steps,
        "step_ms": step_ms,
        "timed": "device kernels, self device time" if cuda else "aten ops, self CPU time",
        "total_ms": total,
        "busy_fraction": total / window,
        "by_kind": {
            k: {"total_ms": v, "pct_of_step": 100 * v / window}
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
        },
        "top": rows[:top],
    }


def measure(
    device: torch.device,
    tokens: int = 8192,
    repeats: int = 10,
    steps: int = 20,
    presets: Iterable[str] = PRESETS,
    batch: dict[str, tuple[int, int]] | None = None,
    *,
    warmup: int = 3,
    compile: Compile = "auto",
    kn: Iterable[tuple[int, int]] | None = bench.LLAMA3_8B,
    quant_shape: tuple[int, int] = (8192, 4096),
    profile_steps: int = 3,
    check_cpu: bool = True,
    recipes: Iterable[str] = RECIPES,
    profiled: Iterable[str] = ("mxfp4",),
    on_part: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every row of the benchmark on ``device``, with the ratios and goals evaluated (sizes smaller
    than the defaults only to check the benchmark itself: ``DRY_RUN``): the training steps of
    ``recipes`` (``RECIPES`` by default), and a profile of each recipe in ``profiled`` on the
    largest preset. ``on_part``, when given, gets the result so far (``partial: True``, the goals
    evaluated on what was measured) after the GEMM and quantizer rows and after each timed run and
    profile: a run stopped at its time limit keeps what it had measured (``main`` writes it)."""
    presets = list(presets)
    recipes = list(recipes)
    profiled = set(profiled)
    batch = {p: (batch or BATCH)[p] for p in presets}
    now = dt.datetime.now(dt.UTC)
    result = bench.measure(
        device, tokens, repeats, kn, quant_shape, check=True, check_cpu=check_cpu
    )
    result.update(
        arch=device_arch(device) or device.type,
        date=now.date().isoformat(),
        datetime=now.isoformat(timespec="seconds"),
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        python=sys.version.split()[0],
    )
    reason = train_bench.native_fp8_reason(device)
    skip = {"fp8": f"no native FP8 here: {reason}"} if reason else {}
    prof_preset = "125m" if "125m" in presets else presets[-1]
    profiles: list[dict[str, Any]] = []

    result["train"] = {
        "presets": presets,
        "batch": {p: {"batch": b, "seq_len": t, "tokens": b * t} for p, (b, t) in batch.items()},
        "steps": steps,
        "warmup": warmup,
        "compile": compile,
        "compiled": resolved_compile(compile, device.type),
        "recipes": {r: train_bench.RECIPES[r].short() for r in recipes},
        "hadamard": "deterministic (dht16: no random signs)",
    }
    done: list[dict[str, Any]] = []

    def part() -> None:
        if on_part is not None:
            on_part({**_assemble(dict(result), done, profiles, prof_preset), "partial": True})

    part()
    for q in result.get("quantizer", []):
        _progress(
            f"quantizer {q['quantizer']}: {q['ms']:.3f} ms, {q['copy_fraction']:.2f} of the copy "
            "bandwidth"
        )

    def after(row: dict[str, Any], run: Run, state: TrainState) -> None:
        # each line is printed once its figures are written: a run killed as it reads a line
        # (a time limit, the test of one) is never killed in the middle of writing them
        done.append(row)
        part()
        _progress(
            f"{row['preset']} {row['recipe']} ({row['backend']}): {row['step_ms']:.1f} ms a step, "
            f"{row['tokens_per_s']:,.0f} tokens/s"
        )
        if profile_steps and row["preset"] == prof_preset and row["recipe"] in profiled:
            try:
                pr = profile(run, state, profile_steps, row["step_ms"])
                profiles.append({"name": row["recipe"], **pr})
            except Exception as e:  # noqa: BLE001 - the figures so far are kept, with why
                profiles.append({"name": row["recipe"], "error": f"{type(e).__name__}: {e}"})
            part()

    rows = train_bench.measure(
        presets,
        recipes,
        str(device),
        steps,
        {p: b for p, (b, _) in batch.items()},
        {p: t for p, (_, t) in batch.items()},
        compile=compile,
        warmup=warmup,
        vocab={p: train_bench.preset_vocab(p) for p in presets},
        skip=skip,
        after=after,
        keep_going=True,
    )
    return _assemble(result, rows, profiles, prof_preset)


def _assemble(
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    preset: str,
) -> dict[str, Any]:
    """``result`` with the timed runs ``rows``, their ratios, the profiles and the goals."""
    for r in rows:
        if r.get("skipped") and r["recipe"] == "fp8":
            r["backend"] = "native"
    result["steps"] = list(rows)
    result["ratios"] = ratios(rows)
    result["profiles"] = list(profiles)
    result["profile"] = next((p for p in profiles if p["name"] == "mxfp4"), None)
    result["goals"] = goals(result, preset)
    return result


def _progress(line: str) -> None:
    """One line as each part ends, after it is written: a run killed there keeps what it says."""
    print(f"bench: {line}", flush=True)


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per preset: each recipe's step time over ``bf16``'s (``RATIOS`` names; None: not measured)."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        if r["recipe"] in RATIOS:
            out.setdefault(r["preset"], {})[RATIOS[r["recipe"]]] = r["vs_bf16"]
    return out


def _goal(measured: float | None, target: float, op: str, **extra: Any) -> dict[str, Any]:
    met = None if measured is None else (measured <= target if op == "<=" else measured < target)
    return {"measured": measured, "target": f"{op} {target}", "met": met, **extra}


def goals(result: dict[str, Any], preset: str) -> dict[str, dict[str, Any]]:
    """The issue's goals, each ``measured``, ``target``, ``met`` (None: not measured, ``why``)."""
    r = result["ratios"].get(preset, {})
    quant = {q["quantizer"]: q for q in result["quantizer"]}
    out = {
        "emulated_mxfp4_step_over_bf16": _goal(
            r.get("emulated_mxfp4_step_over_bf16"), STEP_TARGET, "<=", preset=preset
        ),
    }
    for name in QUANT_GOAL_ROWS:
        out[f"quantizer_{name}_copy_fraction"] = _goal(
            quant[name]["copy_fraction"], QUANT_TARGET, ">="
        )
        out[f"quantizer_{name}_copy_fraction"]["met"] = quant[name]["copy_fraction"] >= QUANT_TARGET
    fp8 = _goal(r.get("native_fp8_step_over_bf16"), 1.0, "<", preset=preset)
    skipped = [s for s in result["steps"] if s["preset"] == preset and s.get("skipped")]
    if fp8["measured"] is None and skipped:
        fp8["why"] = skipped[0]["skipped"]
    out["native_fp8_step_over_bf16"] = fp8
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="every code path at toy sizes (preset tiny, 2 steps): checks the benchmark, "
        "measures nothing",
    )
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(BATCH))
    ap.add_argument("--steps", type=int, default=20, help="timed steps per recipe (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (they compile)")
    train_bench.add_compile_argument(ap)
    ap.add_argument(
        "--recipes", nargs="+", default=list(RECIPES), choices=RECIPES, help="recipes timed"
    )
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps (0: none)")
    ap.add_argument(
        "--profile",
        nargs="*",
        default=["mxfp4"],
        choices=RECIPES,
        help="recipes profiled on the largest preset (default mxfp4)",
    )
    ap.add_argument("--tokens", type=int, default=8192, help="M of every GEMM row (default 8192)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per GEMM/quantizer row")
    ap.add_argument("--no-gemms", action="store_true", help="skip the GEMM rows")
    ap.add_argument("--out", default="reports/gpu", help="folder for the .md and .json")
    ap.add_argument(
        "--name", help="file name of the .md and .json, without suffix (default <date>-<arch>)"
    )
    args = ap.parse_args(argv)
    if min(args.tokens, args.repeats, args.steps) < 1 or min(args.warmup, args.profile_steps) < 0:
        ap.error(
            "--tokens, --repeats and --steps must be positive, --warmup and --profile-steps >= 0"
        )
    try:
        device = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device must be cuda, cuda:N or cpu, not {args.device!r}")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device must be cuda, cuda:N or cpu, not {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"ablate.bench.gpu: {bench.NO_GPU} (--device cpu --dry-run checks the benchmark)")
        return 0
    compile = train_bench.parse_compile(args.compile)
    kw: dict[str, Any] = {
        "tokens": args.tokens,
        "repeats": args.repeats,
        "steps": args.steps,
        "presets": args.presets,
        "warmup": args.warmup,
        "profile_steps": args.profile_steps,
        "recipes": args.recipes,
        "profiled": args.profile,
        "kn": None if args.no_gemms else bench.LLAMA3_8B,
    }
    if args.dry_run:
        kw.update(DRY_RUN)
        kw["kn"] = None if args.no_gemms else DRY_RUN["kn"]
    cmd = sys.argv[1:] if argv is None else argv
    about = {
        "dry_run": args.dry_run,
        "command": shlex.join(["python", "-m", "ablate.bench.gpu", *cmd]),
    }
    out = Path(args.out)

    def part(result: dict[str, Any]) -> None:  # a run stopped at its limit keeps these
        write({**result, **about}, out, args.name)

    result = {**measure(device, compile=compile, on_part=part, **kw), **about}
    print("\n".join(report_lines(result)))
    print(f"wrote {write(result, out, args.name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
