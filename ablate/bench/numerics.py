"""Throughput of the numerics on any device: the quantizer against a copy, and the GEMM backends.

Quantizer rows (always). One bfloat16 tensor, ``--size`` x ``--size`` (default 4096x4096; the GPU
benchmark ``python -m ablate.bench.gpu`` uses 8192x4096), is quantize-dequantized by
``fake_quantize`` in one pass, bf16 in and bf16 out (on CUDA the fused path of ``torch_path.py`` compiled
by ``torch.compile``; on the CPU the C kernel), and timed against a plain copy:

- ``copy``: ``x.clone()``, the bandwidth a memory-bound quantizer can hope for;
- ``mxfp4_rne``: MXFP4, round to nearest even, blocks along the last axis;
- ``mxfp4_sr``: MXFP4 with stochastic rounding;
- ``mxfp4_h16``: a 16-point Hadamard transform then MXFP4 RNE, fused into one pass as the emulated
  GEMM runs it;
- ``nvfp4_rne``: NVFP4 RNE;
- ``mxfp4_rne_axis0``: MXFP4 RNE with blocks along axis 0 (the Wgrad layout);
- ``fp8_e4m3``: FP8 E4M3 scaled per tensor (the FP8 baseline's X and W), RNE, along the last axis;
- ``fp8_e5m2``: FP8 E5M2 per tensor (the FP8 baseline's gradients);
- ``mxfp4_rne_eager`` (CUDA only): the fused path uncompiled;
- ``torchao_to_mx`` (command line only): torchao's ``to_mx`` + ``to_dtype`` (MXFP4) when torchao is
  installed, else reported unavailable with the reason.

Every row counts bf16 in plus bf16 out (``2 * numel * 2`` bytes) and reports ms, GB/s and the
fraction of the copy bandwidth of the same run, and ``fp8_over_mxfp4``, the ``fp8_e4m3`` row's median
time over the ``mxfp4_rne`` row's (a per-tensor cast should cost no more than a block-scaled one). With ``--check`` (the default on a GPU; on the CPU
the reference takes about 15 s per row at 4096x4096) each row of ours is also compared bit for bit
with ``fake_quantize_reference`` on the same device (``bit_exact``).

GEMM rows (``--gemms``). ``a @ b^T`` on Llama-3-8B's projections, (M, K, N) = (T, 4096, 4096)
(attention), (T, 4096, 14336) (MLP up/gate) and (T, 14336, 4096) (MLP down), T = ``--tokens``
(default 8192 on a GPU, 128 on the CPU), in TFLOP/s (``2 * M * N * K`` per run):

- ``bf16``: ``a @ b.t()`` of bfloat16 operands, the baseline;
- ``native_<fmt>``: the hardware's scaled GEMM alone (``native.scaled_mm`` on operands packed
  beforehand), for each of fp8_e4m3, mxfp8_e4m3, mxfp4, nvfp4 that the device runs natively;
- ``native_fp8_e4m3_mm``: the native backend's whole FP8 GEMM, quantization of both operands
  included (where the device runs FP8);
- ``emulated_mxfp4``: the emulated backend's whole GEMM: both operands quantize-dequantized to MXFP4,
  then an FP32 GEMM.

Times are medians of ``--repeats`` runs after one warm-up (which also builds the C kernel or
compiles the GPU quantizer): CUDA events on a GPU, ``perf_counter`` on the CPU.

Run: ``python -m ablate.bench.numerics [--device cpu] [--size 4096] [--repeats 15] [--gemms] [--tokens T]
[--check | --no-check] [--json]``. ``--device cuda`` on a machine without a GPU says so and exits 0.
With ``--json`` the last line of stdout is one JSON object: the tables (``quantizer``, and ``gemms``
with ``--gemms``) and, per quantizer row, the flat keys ``<row>_ms``, ``<row>_gbps`` and
``<row>_copy_fraction`` (``mxfp4_rne_copy_fraction``, ...) and ``fp8_over_mxfp4``. ``python -m ablate.bench.gpu`` runs the
GEMM and quantizer rows on a GPU together with the training step time and writes ``reports/gpu/``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from backends.gemm import GemmKeys, supported_formats
from backends.gemm.capabilities import device_description
from backends.gemm.emulated import EmulatedBackend
from backends.gemm.native import (
    NativeBackend,
    device_arch,
    layout_for,
    pack_operand,
    scaled_mm,
)
from backends.quant import (
    QuantSpec,
    Rotation,
    ckernel,
    fake_quantize,
    fake_quantize_fused,
    fake_quantize_reference,
    hadamard_transform,
)
from backends.recipes import GemmRecipe

Fn = Callable[[], object]

LLAMA3_8B = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N) of each projection
NATIVE_FORMATS = ("fp8_e4m3", "mxfp8_e4m3", "mxfp4", "nvfp4")
KEYS = GemmKeys(a=1, b=2, signs=3)
SR_KEY = 1234  # the quantizer rows' random-stream key (stochastic rounding)
NO_GPU = "no CUDA or ROCm device here, nothing to measure"


def median_ms(fn: Fn, repeats: int, device: torch.device | None = None) -> float:
    """Median wall time of ``fn`` in ms after one warm-up (which also builds the C kernel or
    compiles the GPU quantizer on first use): CUDA events on a GPU, ``perf_counter`` elsewhere."""
    fn()
    times = []
    for _ in range(repeats):
        if device is not None and device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# ----------------------------------------------------------------------------------------------
# GEMM rows


def gemm_rows(
    device: torch.device,
    shapes: Iterable[tuple[int, int, int]],
    repeats: int,
    native: Iterable[str],
) -> list[dict[str, object]]:
    """One row per (GEMM, shape): ms and TFLOP/s; ``native`` names the formats timed natively."""
    rows: list[dict[str, object]] = []
    layout = layout_for(device_arch(device))
    emulated, native_backend = EmulatedBackend(), NativeBackend()
    mx = QuantSpec(format="mxfp4")
    fp8 = QuantSpec(format="fp8_e4m3")
    fp8_gemm, mx_gemm = GemmRecipe(a=fp8, b=fp8), GemmRecipe(a=mx, b=mx)
    native = [f for f in NATIVE_FORMATS if f in set(native)]
    for M, K, N in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(M, K, generator=g, device=device).to(torch.bfloat16)
        b = torch.randn(N, K, generator=g, device=device).to(torch.bfloat16)

        def bf16(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return a @ b.t()

        def native_mm(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return native_backend.mm(a, b, fp8_gemm, KEYS, None)  # quantize both, then GEMM

        def emulated_mm(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return emulated.mm(a, b, mx_gemm, KEYS, None)  # quantize-dequantize both, FP32 GEMM

        runs: list[tuple[str, Fn]] = [("bf16", bf16)]
        for fmt in native:
            spec = QuantSpec(format=fmt)
            pa = pack_operand(a, spec, layout=layout)  # packed once: the GEMM alone is timed
            pb = pack_operand(b, spec, layout=layout)
            runs.append((f"native_{fmt}", functools.partial(scaled_mm, pa, pb)))
        if "fp8_e4m3" in native:
            runs.append(("native_fp8_e4m3_mm", native_mm))
        runs.append(("emulated_mxfp4", emulated_mm))
        for name, fn in runs:
            ms = median_ms(fn, repeats, device)
            tflops = 2 * M * N * K / (ms * 1e-3) / 1e12
            rows.append({"gemm": name, "M": M, "K": K, "N": N, "ms": ms, "tflops": tflops})
        del a, b, runs
    return rows


# ----------------------------------------------------------------------------------------------
# quantizer rows


def _torchao_fn(x: torch.Tensor) -> tuple[Fn | None, str]:
    """torchao's MXFP4 quantize-dequantize of ``x``, or None and why it is unavailable."""
    try:
        from torchao.prototype.mx_formats import mx_tensor
    except Exception as e:  # optional dependency; any import failure means "not here"
        return None, f"unavailable ({type(e).__name__})"
    fp4 = torch.float4_e2m1fn_x2
    if hasattr(mx_tensor, "to_dtype"):

        def fn() -> torch.Tensor:
            scales, data = mx_tensor.to_mx(x, fp4, 32)
            return mx_tensor.to_dtype(data, scales, fp4, 32, torch.bfloat16)

        return fn, "torchao to_mx + to_dtype (MXFP4)"
    return (lambda: mx_tensor.to_mx(x, fp4, 32)), "torchao to_mx only, no dequantize (MXFP4)"


def _bit_exact(
    x: torch.Tensor, out: object, spec: QuantSpec, axis: int, had: Rotation | None
) -> bool:
    """Whether ``out`` is ``fake_quantize_reference``'s result for ``x``, bit for bit."""
    assert isinstance(out, torch.Tensor)
    xr = x if had is None else hadamard_transform(x, axis, had.size, had.signs)
    ref = fake_quantize_reference(xr, spec, axis, SR_KEY, torch.bfloat16)
    return bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))


CPU_REFERENCE_ROWS = ("mxfp4_rne", "mxfp4_sr", "mxfp4_h16")
"""The rows ``quantizer_rows(check_cpu=True)`` also compare with the pure-torch reference on the
CPU (about 20 s per row at 8192x4096 on two cores); the others with the CPU's fast path only."""


def cpu_path() -> str:
    """What ``fake_quantize`` runs on a CPU tensor here: the C kernel, or the fused torch path
    where the kernel cannot be built."""
    return "c_kernel" if ckernel.usable(torch.zeros(1)) else "torch_fused"


def _bit_exact_cpu(
    x: torch.Tensor, out: object, spec: QuantSpec, axis: int, had: Rotation | None, reference: bool
) -> bool:
    """Whether ``out`` (any device) equals, bit for bit, the same quantization of ``x`` copied to
    the CPU: by the CPU's ``fake_quantize`` path, or with ``reference`` by
    ``fake_quantize_reference`` (after the Hadamard transform on the CPU)."""
    assert isinstance(out, torch.Tensor)
    xc = x.cpu()
    if reference:
        xr = xc if had is None else hadamard_transform(xc, axis, had.size, had.signs)
        ref = fake_quantize_reference(xr, spec, axis, SR_KEY, torch.bfloat16)
    else:
        ref = fake_quantize(xc, spec, axis, SR_KEY, torch.bfloat16, had)
    return bool(torch.equal(out.cpu().view(torch.int16), ref.view(torch.int16)))


def quantizer_rows(
    device: torch.device,
    shape: tuple[int, int],
    repeats: int,
    check: bool = True,
    torchao: bool = False,
    check_cpu: bool = False,
) -> list[dict[str, object]]:
    """The quantizer's time and its fraction of the copy bandwidth (bf16 in, bf16 out) on a
    ``shape`` tensor; with ``check`` whether each row's output is the reference's bit for bit on
    this device; with ``check_cpu`` whether it is, bit for bit, the same quantization of the input
    copied to the CPU (``bit_exact_cpu``: the CPU's ``fake_quantize`` path, ``cpu_path()``;
    ``bit_exact_cpu_reference``: ``fake_quantize_reference``, for ``CPU_REFERENCE_ROWS``); with
    ``torchao`` a last row timing torchao's MXFP4 (``None`` where unavailable)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)
    nbytes = 2 * x.numel() * x.element_size()
    mx, sr = QuantSpec(format="mxfp4"), QuantSpec(format="mxfp4", rounding="sr")
    nv, bf = QuantSpec(format="nvfp4"), torch.bfloat16
    # name -> (spec, axis, hadamard)
    cases: dict[str, tuple[QuantSpec, int, Rotation | None]] = {
        "mxfp4_rne": (mx, -1, None),
        "mxfp4_sr": (sr, -1, None),
        "mxfp4_h16": (mx, -1, Rotation(16, None)),  # DHT16: no signs
        "nvfp4_rne": (nv, -1, None),
        "mxfp4_rne_axis0": (mx, 0, None),
        "fp8_e4m3": (QuantSpec(format="fp8_e4m3"), -1, None),
        "fp8_e5m2": (QuantSpec(format="fp8_e5m2"), -1, None),
    }
    # name -> (fn or None, the case it reproduces or None, note)
    runs: dict[str, tuple[Fn | None, tuple[QuantSpec, int, Rotation | None] | None, str]] = {
        "copy": (x.clone, None, "")
    }
    for name, (spec, axis, had) in cases.items():
        quantize = functools.partial(fake_quantize, x, spec, axis, SR_KEY, bf, had)
        runs[name] = (quantize, (spec, axis, had), "")
    if device.type == "cuda":
        eager = functools.partial(fake_quantize_fused, x, mx, -1, SR_KEY, bf, compile=False)
        runs["mxfp4_rne_eager"] = (eager, cases["mxfp4_rne"], "fused path uncompiled")
    if torchao:
        ao_fn, note = _torchao_fn(x)
        runs["torchao_to_mx"] = (ao_fn, None, note)
    rows: list[dict[str, object]] = []
    copy_ms = 0.0
    for name, (fn, case, note) in runs.items():
        row: dict[str, object] = {
            "quantizer": name,
            "ms": None,
            "gbps": None,
            "copy_fraction": None,
        }
        if fn is not None:
            ms = median_ms(fn, repeats, device)
            copy_ms = ms if name == "copy" else copy_ms
            row.update(ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9, copy_fraction=copy_ms / ms)
        if (check or check_cpu) and fn is not None and case is not None:
            out = fn()
            if check:
                row["bit_exact"] = _bit_exact(x, out, *case)
            if check_cpu:
                row["bit_exact_cpu"] = _bit_exact_cpu(x, out, *case, reference=False)
                if name in CPU_REFERENCE_ROWS:
                    row["bit_exact_cpu_reference"] = _bit_exact_cpu(x, out, *case, reference=True)
        if note:
            row["note"] = note
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# both, and the command line


def measure(
    device: torch.device,
    tokens: int,
    repeats: int,
    kn: Iterable[tuple[int, int]] | None = LLAMA3_8B,
    quant_shape: tuple[int, int] = (8192, 4096),
    check: bool = True,
    torchao: bool = False,
    check_cpu: bool = False,
) -> dict[str, Any]:
    """The rows of this benchmark on ``device``: GEMMs of (tokens, K, N) for each (K, N) in ``kn``
    (none when ``kn`` is None) and the quantizer on a ``quant_shape`` tensor."""
    native = sorted(supported_formats(device))
    result: dict[str, Any] = {
        "device": device_description(device),
        "torch": torch.__version__,
        "native_formats": native,
        "repeats": repeats,
    }
    if kn is not None:
        shapes = [(tokens, k, n) for k, n in kn]
        result["gemms"] = gemm_rows(device, shapes, repeats, native)
    result["quantizer"] = quantizer_rows(device, quant_shape, repeats, check, torchao, check_cpu)
    if check_cpu:
        result["cpu_path"] = cpu_path()
    result["quantizer_shape"] = list(quant_shape)
    result["fp8_over_mxfp4"] = fp8_over_mxfp4(result["quantizer"])
    return result


def fp8_over_mxfp4(rows: list[dict[str, Any]]) -> float | None:
    """The per-tensor ``fp8_e4m3`` row's median time over the ``mxfp4_rne`` row's (same run)."""
    ms = {r["quantizer"]: r["ms"] for r in rows}
    fp8, mx = ms.get("fp8_e4m3"), ms.get("mxfp4_rne")
    return fp8 / mx if fp8 and mx else None


def report_lines(result: dict[str, Any]) -> list[str]:
    """``measure``'s result as the printed tables."""
    native = result["native_formats"] or "none"
    threads = f", {result['threads']} threads" if "threads" in result else ""
    lines = [f"device: {result['device']}{threads}, torch {result['torch']}, native: {native}"]
    if "gemms" in result:
        lines += [
            f"GEMMs, median of {result['repeats']} after 1 warm-up",
            f"{'':22s} {'M':>6s} {'K':>6s} {'N':>6s} {'ms':>9s} {'TFLOP/s':>9s}",
        ]
        for r in result["gemms"]:
            lines.append(
                f"{r['gemm']!s:22s} {r['M']:>6} {r['K']:>6} {r['N']:>6} "
                f"{r['ms']:9.3f} {r['tflops']:9.3f}"
            )
    M, K = result["quantizer_shape"]
    lines += [
        f"quantizer on {M}x{K} bfloat16 (bf16 in and out, {4 * M * K / 1e6:.1f} MB moved per run), "
        f"median of {result['repeats']} after 1 warm-up",
        f"{'':22s} {'ms':>9s} {'GB/s':>9s} {'of copy':>8s}",
    ]
    for r in result["quantizer"]:
        notes = [str(r["note"])] if "note" in r else []
        if "bit_exact" in r:
            notes.append(f"bit-exact: {r['bit_exact']}")
        if "bit_exact_cpu" in r:
            notes.append(f"= CPU: {r['bit_exact_cpu']}")
        if "bit_exact_cpu_reference" in r:
            notes.append(f"= CPU reference: {r['bit_exact_cpu_reference']}")
        note = "  " + "; ".join(notes) if notes else ""
        if r["ms"] is None:
            lines.append(f"{r['quantizer']!s:22s}{note}")
            continue
        lines.append(
            f"{r['quantizer']!s:22s} {r['ms']:9.3f} {r['gbps']:9.2f} "
            f"{r['copy_fraction']:8.3f}{note}"
        )
    if result.get("fp8_over_mxfp4") is not None:
        lines.append(f"fp8_over_mxfp4 (fp8_e4m3 ms / mxfp4_rne ms): {result['fp8_over_mxfp4']:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--size", type=int, default=4096, help="quantized tensor is SIZE x SIZE")
    ap.add_argument("--repeats", type=int, help="timed runs per row (default 15 CPU, 10 GPU)")
    ap.add_argument("--gemms", action="store_true", help="also time the GEMMs (TFLOP/s)")
    ap.add_argument("--tokens", type=int, help="M of every GEMM (default 8192 GPU, 128 CPU)")
    ap.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        help="check each quantizer row bit for bit against the reference (default: on a GPU only)",
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON line of results")
    args = ap.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = torch.device("meta")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device must be cpu, cuda or cuda:N, not {args.device!r}")
    gpu = device.type == "cuda"
    repeats = args.repeats if args.repeats is not None else (10 if gpu else 15)
    tokens = args.tokens if args.tokens is not None else (8192 if gpu else 128)
    if args.size < 32 or args.size % 32 or repeats < 1 or tokens < 1:
        ap.error("--size must be a positive multiple of 32, --repeats and --tokens positive")
    if gpu and not torch.cuda.is_available():
        print(f"ablate.bench.numerics: {NO_GPU} (--device cpu measures the CPU)")
        return 0

    threads = None
    if not gpu:
        torch.set_num_threads(os.cpu_count() or 1)
        threads = torch.get_num_threads()
    check = gpu if args.check is None else args.check
    kn = LLAMA3_8B if args.gemms else None
    shape = (args.size, args.size)
    result = measure(device, tokens, repeats, kn, shape, check=check, torchao=True)
    if threads is not None:
        result["threads"] = threads
    print("\n".join(report_lines(result)))
    if args.json:
        flat: dict[str, Any] = {"size": args.size, "fp8_over_mxfp4": result["fp8_over_mxfp4"]}
        for r in result["quantizer"]:
            for k in ("ms", "gbps", "copy_fraction", "bit_exact"):
                if k in r:
                    flat[f"{r['quantizer']}_{k}"] = r[k]
        print(json.dumps({**flat, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
