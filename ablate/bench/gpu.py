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
import json
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ablate.bench import numerics as bench
from ablate.bench import train as train_bench
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
    if n in ("aten::mm", "aten::addmm", "aten::bmm") or any(
        k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "scaled_mm")
    ):
        return "gemm"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if n.startswith("triton"):
        return "triton"
    if any(k in n for k in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    if any(k in n for k in ("memcpy", "memset", "copy_")):
        return "memory"
    return "other"


def profile(run: Run, state: TrainState, steps: int, step_ms: float, top: int = 25) -> dict:
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
) -> dict[str, Any]:
    """Every row of the benchmark on ``device``, with the ratios and goals evaluated (sizes smaller
    than the defaults only to check the benchmark itself: ``DRY_RUN``): the training steps of
    ``recipes`` (``RECIPES`` by default), and a profile of each recipe in ``profiled`` on the
    largest preset."""
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

    for q in result.get("quantizer", []):
        _progress(
            f"quantizer {q['quantizer']}: {q['ms']:.3f} ms, {q['copy_fraction']:.2f} of the copy "
            "bandwidth"
        )

    def after(row: dict[str, Any], run: Run, state: TrainState) -> None:
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
    for r in rows:
        if r.get("skipped") and r["recipe"] == "fp8":
            r["backend"] = "native"
    result["steps"] = rows
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
    result["ratios"] = ratios(rows)
    result["profiles"] = profiles
    result["profile"] = next((p for p in profiles if p["name"] == "mxfp4"), None)
    result["goals"] = goals(result, prof_preset)
    return result


def _progress(line: str) -> None:
    """One line as each part ends: a run stopped at its time limit still says what it measured."""
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


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def report_lines(result: dict[str, Any]) -> list[str]:
    """The printed report: the ``ablate.bench.numerics`` tables, the step times, ratios, goals, profile."""
    lines = bench.report_lines(result)
    t = result["train"]
    lines.append(
        f"training steps, compile {t['compile']} (compiled: {t['compiled']}), median over blocks "
        f"of {t['steps']} steps after {t['warmup']} warm-up"
    )
    for p, b in t["batch"].items():
        lines.append(f"  {p}: batch {b['batch']} x {b['seq_len']} = {b['tokens']} tokens per step")
    lines += train_bench.report_lines(result["steps"])
    for preset, rs in result["ratios"].items():
        for name, v in rs.items():
            lines.append(f"{preset} {name}: {_fmt(v)}")
    for name, g in result["goals"].items():
        why = f" ({g['why']})" if g.get("why") else ""
        lines.append(
            f"goal {name}: {_fmt(g['measured'])} (target {g['target']}): {_verdict(g['met'])}{why}"
        )
    for pr in _profiles(result):
        lines += _profile_lines(pr)
    return lines


def _profiles(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The profiles of a result (``profile`` alone in results written before ``profiles``)."""
    if "profiles" in result:
        return list(result["profiles"])
    return [result["profile"]] if result.get("profile") else []


def _profile_lines(pr: dict[str, Any]) -> list[str]:
    if "error" in pr:
        return [f"profile {pr.get('name', '')}: failed: {pr['error']}"]
    lines = [
        f"profile: {pr['preset']} {pr['recipe']}, {pr['steps']} steps, {pr['timed']}; busy "
        f"{pr['busy_fraction']:.2f} of the step ({pr['total_ms']:.1f} ms over "
        f"{pr['steps']} x {pr['step_ms']:.2f} ms)"
    ]
    for kind, v in pr["by_kind"].items():
        lines.append(f"  {kind:10s} {v['total_ms']:10.2f} ms {v['pct_of_step']:6.1f}%")
    for k in pr["top"]:
        lines.append(
            f"  {k['total_ms']:10.2f} ms {k['pct_of_step']:6.1f}% {k['calls']:6d}x "
            f"{k['kind']:9s} {k['name'][:100]}"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The Markdown report: header, a step table per preset, the quantizer table, the goals, the
    profile, and the GEMM rows."""
    t = result["train"]
    dry = " (dry run: toy sizes, not a measurement)" if result.get("dry_run") else ""
    out = [
        f"# GPU benchmark, {result['device']}, {result['date']}{dry}",
        "",
        f"- device: {result['device']} ({result['arch']}); native formats: "
        f"{', '.join(result['native_formats']) or 'none'}",
        f"- torch {result['torch']}, CUDA {result['cuda'] or '-'}"
        + (f", HIP {result['hip']}" if result.get("hip") else "")
        + f", Python {result['python']}",
        f"- date: {result['datetime']}",
        f"- command: `{result['command']}`",
        f"- training steps: compile {t['compile']} (compiled: {t['compiled']}), fused AdamW on "
        f"CUDA, bf16 autocast on a GPU; median over blocks of the device-synchronized time of "
        f"{t['steps']} steps after {t['warmup']} warm-up steps",
        f"- recipes: {'; '.join(f'{k} = `{v}`' for k, v in t['recipes'].items())}; "
        f"Hadamard {t['hadamard']}; fp8 on the native backend, the FP4 recipes emulated",
        "",
        "## Goals",
        "",
        "| goal | measured | target | |",
        "|---|---:|---|---|",
    ]
    for name, g in result["goals"].items():
        why = f" ({g['why']})" if g.get("why") else ""
        where = f" ({g['preset']})" if "preset" in g else ""
        out.append(
            f"| {name}{where} | {_fmt(g['measured'])} | {g['target']} | {_verdict(g['met'])}{why} |"
        )
    for preset in t["presets"]:
        b = t["batch"][preset]
        out += [
            "",
            f"## Step time, `{preset}`, batch {b['batch']} x {b['seq_len']} = {b['tokens']} tokens",
            "",
            "| recipe | backend | ms/step | tokens/s | / bf16 |",
            "|---|---|---:|---:|---:|",
        ]
        for r in result["steps"]:
            if r["preset"] != preset:
                continue
            if r["step_ms"] is None:
                out.append(f"| {r['recipe']} | {r['backend']} | skipped: {r['skipped']} | | |")
                continue
            out.append(
                f"| {r['recipe']} | {r['backend']} | {r['step_ms']:.2f} | "
                f"{r['tokens_per_s']:,.0f} | {_fmt(r['vs_bf16'], '.3f')} |"
            )
        rs = result["ratios"].get(preset, {})
        out += ["", ", ".join(f"`{k}` {_fmt(v)}" for k, v in rs.items())]
    M, K = result["quantizer_shape"]
    out += [
        "",
        f"## Quantizer, {M} x {K} bfloat16, bf16 in and out",
        "",
        f"Median of {result['repeats']} after a warm-up; GB/s counts bf16 in plus bf16 out. "
        "Bit-exact: against the reference quantizer on the device; against the same input on the "
        f"CPU (`{result.get('cpu_path', '-')}`), and against the pure reference on the CPU.",
        "",
        "| path | ms | GB/s | of copy | = device ref | = CPU | = CPU reference |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for q in result["quantizer"]:
        cells = [_fmt(q["ms"]), _fmt(q["gbps"], ".1f"), _fmt(q["copy_fraction"])]
        checks = [
            str(q.get(k, "")) for k in ("bit_exact", "bit_exact_cpu", "bit_exact_cpu_reference")
        ]
        out.append(f"| {q['quantizer']} | {' | '.join(cells)} | {' | '.join(checks)} |")
    for pr in _profiles(result):
        out += _profile_markdown(pr)
    if result.get("gemms"):
        out += [
            "",
            "## GEMMs",
            "",
            "| GEMM | M | K | N | ms | TFLOP/s |",
            "|---|---:|---:|---:|---:|---:|",
            *(
                f"| {g['gemm']} | {g['M']} | {g['K']} | {g['N']} | {g['ms']:.3f} | "
                f"{g['tflops']:.1f} |"
                for g in result["gemms"]
            ),
        ]
    return "\n".join(out) + "\n"


def _profile_markdown(pr: dict[str, Any]) -> list[str]:
    if "error" in pr:
        return ["", f"## Profile, `{pr.get('name', '')}`", "", f"failed: {pr['error']}"]
    return [
        "",
        f"## Profile, `{pr['preset']}` `{pr['recipe']}`, {pr['steps']} steps",
        "",
        f"{pr['timed']}; the kernels' time is {pr['busy_fraction']:.2f} of the steps' "
        f"untraced time ({pr['total_ms']:.1f} ms over {pr['steps']} x {pr['step_ms']:.2f} ms; "
        "on a GPU, well below 1 means the device waits on the host).",
        "",
        "| kind | ms | % of step |",
        "|---|---:|---:|",
        *(
            f"| {k} | {v['total_ms']:.2f} | {v['pct_of_step']:.1f} |"
            for k, v in pr["by_kind"].items()
        ),
        "",
        "| kernel | kind | calls | ms | % of step |",
        "|---|---|---:|---:|---:|",
        *(
            f"| `{k['name'][:120]}` | {k['kind']} | {k['calls']} | {k['total_ms']:.2f} | "
            f"{k['pct_of_step']:.1f} |"
            for k in pr["top"]
        ),
    ]


def write(result: dict[str, Any], out: Path) -> Path:
    """``<out>/<date>-<arch>[-dry-run].md`` (``markdown``) and ``.json`` (every figure)."""
    suffix = "-dry-run" if result.get("dry_run") else ""
    stem = out / f"{result['date']}-{result['arch']}{suffix}"
    out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(markdown(result))
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return stem.with_suffix(".md")


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
    result = measure(device, compile=compile, **kw)
    result["dry_run"] = args.dry_run
    cmd = sys.argv[1:] if argv is None else argv
    result["command"] = shlex.join(["python", "-m", "ablate.bench.gpu", *cmd])
    print("\n".join(report_lines(result)))
    print(f"wrote {write(result, Path(args.out))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
