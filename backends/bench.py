"""Throughput of the CPU fake-quantize path against a plain copy of the same tensor.

For one square bfloat16 tensor (default 4096x4096) it times ``x.clone()`` (the copy bandwidth a
memory-bound quantizer can hope for) and quantize-dequantize in one pass: MXFP4 RNE, MXFP4 with
stochastic rounding, MXFP4 after a 16-point Hadamard transform, NVFP4 RNE, MXFP4 RNE along axis 0
(the Wgrad layout), and torchao's ``to_mx`` + ``to_dtype`` when torchao is installed. Every row
counts bf16 in plus bf16 out (``2 * numel * 2`` bytes) and reports the median of ``--repeats`` runs
after one warm-up, in ms, GB/s and as a fraction of the copy bandwidth of the same run.

Run: ``python -m backends.bench [--size 4096] [--repeats 15] [--json]``; with ``--json`` the last
line of stdout is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .quant import QuantSpec, fake_quantize

Fn = Callable[[], object]


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


def _device() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _hadamard_fn(x: torch.Tensor, spec: QuantSpec) -> tuple[Fn | None, str]:
    """H16 then MXFP4 RNE, as the emulated GEMM runs it (fused into one pass on the CPU)."""

    def fn() -> torch.Tensor:
        return fake_quantize(x, spec, axis=-1, out_dtype=torch.bfloat16, hadamard=(16, None))

    return fn, "H16 + MXFP4 RNE (axis -1)"


def _torchao_fn(x: torch.Tensor) -> tuple[Fn | None, str]:
    try:
        from torchao.prototype.mx_formats import mx_tensor
    except Exception as e:  # optional dependency; any import failure means "not here"
        return None, f"torchao to_mx: unavailable ({type(e).__name__})"
    fp4 = torch.float4_e2m1fn_x2
    if hasattr(mx_tensor, "to_dtype"):

        def fn() -> torch.Tensor:
            scales, data = mx_tensor.to_mx(x, fp4, 32)
            return mx_tensor.to_dtype(data, scales, fp4, 32, torch.bfloat16)

        return fn, "torchao to_mx + to_dtype (MXFP4)"
    return (lambda: mx_tensor.to_mx(x, fp4, 32)), "torchao to_mx only, no dequantize (MXFP4)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", type=int, default=4096, help="tensor is SIZE x SIZE (default 4096)")
    ap.add_argument("--repeats", type=int, default=15, help="timed runs per row (default 15)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of results")
    args = ap.parse_args(argv)
    if args.size < 32 or args.size % 32 or args.repeats < 1:
        ap.error("--size must be a positive multiple of 32 and --repeats at least 1")

    torch.set_num_threads(os.cpu_count() or 1)
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.size, args.size, generator=g).to(torch.bfloat16)
    nbytes = 2 * x.numel() * x.element_size()

    mx_rne = QuantSpec(format="mxfp4")
    mx_sr = QuantSpec(format="mxfp4", rounding="sr")
    nv = QuantSpec(format="nvfp4")
    h16_fn, h16_label = _hadamard_fn(x, mx_rne)
    ao_fn, ao_label = _torchao_fn(x)
    rows: list[tuple[str, str, Fn | None]] = [
        ("copy", "x.clone() (copy)", x.clone),
        ("mxfp4_rne", "MXFP4 RNE (axis -1)", lambda: fake_quantize(x, mx_rne, axis=-1)),
        ("mxfp4_sr", "MXFP4 SR (axis -1)", lambda: fake_quantize(x, mx_sr, axis=-1, key=1234)),
        ("mxfp4_h16", h16_label, h16_fn),
        ("nvfp4_rne", "NVFP4 RNE (axis -1)", lambda: fake_quantize(x, nv, axis=-1)),
        ("mxfp4_rne_axis0", "MXFP4 RNE (axis 0, Wgrad)", lambda: fake_quantize(x, mx_rne, axis=0)),
        ("torchao_to_mx", ao_label, ao_fn),
    ]

    result: dict[str, object] = {
        "size": args.size,
        "threads": threads,
        "repeats": args.repeats,
        "device": _device(),
        "torch": torch.__version__,
    }
    print(f"device: {result['device']}, {threads} threads, torch {torch.__version__}")
    print(f"{args.size}x{args.size} bfloat16, {nbytes / 1e6:.1f} MB moved per run, ", end="")
    print(f"median of {args.repeats} runs after 1 warm-up")
    print(f"{'':42s} {'ms':>9s} {'GB/s':>8s} {'of copy':>8s}")
    copy_s = 0.0
    for key, label, fn in rows:
        if fn is None:
            print(f"{label}")
            result.update({f"{key}_ms": None, f"{key}_gbps": None, f"{key}_copy_fraction": None})
            continue
        t = median_ms(fn, args.repeats) / 1e3
        if key == "copy":
            copy_s = t
        gbps, frac = nbytes / t / 1e9, copy_s / t
        print(f"{label:42s} {t * 1e3:9.3f} {gbps:8.2f} {frac:8.3f}")
        result.update({f"{key}_ms": t * 1e3, f"{key}_gbps": gbps, f"{key}_copy_fraction": frac})
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
