"""The GPU benchmark's report (``ablate.bench.gpu``): the printed lines, the Markdown, and the two
files it writes (``write``: ``<date>-<arch>.md`` and ``.json``, each replaced whole)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ablate.bench import numerics as bench
from ablate.bench import train as train_bench


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _device(result: dict[str, Any]) -> str:
    """The device with its arch, once: a GPU's description holds it already (``NVIDIA H200
    (sm_90)``), a CPU's model name does not."""
    device, arch = result["device"], result["arch"]
    return device if f"({arch})" in device else f"{device} ({arch})"


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
    partial = result.get("partial")
    out = [
        f"# GPU benchmark, {result['device']}, {result['date']}{dry}{' (partial)' if partial else ''}",
        "",
        *(
            [
                "**Partial**: written as the run went; it stopped before its end, so the rows, "
                "profiles and goals it had not reached are missing or not measured.",
                "",
            ]
            if partial
            else []
        ),
        f"- device: {_device(result)}; native formats: "
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


def write(result: dict[str, Any], out: Path, name: str | None = None) -> Path:
    """``<out>/<name>.md`` (``markdown``) and ``.json`` (every figure), ``name`` by default
    ``<date>-<arch>[-dry-run]``; each file replaced whole (written beside, then renamed), so a run
    killed while writing leaves the last complete one."""
    suffix = "-dry-run" if result.get("dry_run") else ""
    stem = out / (name or f"{result['date']}-{result['arch']}{suffix}")
    out.mkdir(parents=True, exist_ok=True)
    for path, text in (
        (stem.with_suffix(".md"), markdown(result)),
        (stem.with_suffix(".json"), json.dumps(result, indent=1) + "\n"),
    ):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return stem.with_suffix(".md")
