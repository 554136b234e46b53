"""GPU throughput of the GEMM backends and of the quantizer, on Llama-3-8B-shaped matrices.

For 8192 tokens through Llama-3-8B's projections, (M, K, N) = (8192, 4096, 4096) (attention),
(8192, 4096, 14336) (MLP up/gate) and (8192, 14336, 4096) (MLP down), it times ``a @ b^T`` as

- ``bf16``: ``torch.mm`` of bfloat16 operands (the baseline);
- ``native_<fmt>``: the hardware's scaled GEMM alone (``native.scaled_mm`` on operands packed
  beforehand) for each of fp8_e4m3, mxfp8_e4m3, mxfp4, nvfp4 the device runs natively;
- ``native_fp8_e4m3_mm``: the native backend's whole GEMM, quantization of both operands included;
- ``emulated_mxfp4``: the emulated backend's whole GEMM: both operands quantize-dequantized to
  MXFP4, then an FP32 GEMM;

in TFLOP/s (2·M·N·K per run), and the quantizer (``fake_quantize``, bf16 in and out; on CUDA the
fused path of ``fused.py`` compiled by ``torch.compile``) on an 8192x4096 tensor as a fraction of
the copy bandwidth of ``x.clone()``: MXFP4 RNE, MXFP4 SR, H16 + MXFP4, NVFP4, MXFP4 along axis 0
(the Wgrad layout), each checked bit for bit against ``fake_quantize_reference`` on the device.
Times are medians of ``--repeats`` runs after one warm-up, from CUDA events.

``python -m ablate.gpu_bench`` runs these rows and the training step time of the ``small`` preset
together (``backends`` does not import the trainer). On a machine without a GPU the command says so
and exits 0.

Run: ``python -m backends.gpu_bench [--repeats 10] [--tokens 8192] [--json]``.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterable
from typing import Any

import torch

from .bench import Fn, median_ms
from .emulated import EmulatedBackend
from .hadamard import hadamard_transform
from .native import (
    NativeBackend,
    device_arch,
    device_name,
    layout_for,
    pack_operand,
    scaled_mm,
    supported_formats,
)
from .quant import QuantSpec, fake_quantize, fake_quantize_fused, fake_quantize_reference
from .recipe import GemmRecipe
from .registry import GemmKeys

LLAMA3_8B = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N) of each projection
NATIVE_FORMATS = ("fp8_e4m3", "mxfp8_e4m3", "mxfp4", "nvfp4")
KEYS = GemmKeys(a=1, b=2, signs=3)


def gemm_rows(
    device: torch.device,
    shapes: Iterable[tuple[int, int, int]],
    repeats: int,
    native: Iterable[str],
) -> list[dict[str, object]]:
    """One row per (GEMM, shape): ms and TFLOP/s."""
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


def quantizer_rows(
    device: torch.device, shape: tuple[int, int], repeats: int
) -> list[dict[str, object]]:
    """The quantizer's time and its fraction of the copy bandwidth (bf16 in, bf16 out), and whether
    its output is the reference's bit for bit on this device.

    On CUDA ``fake_quantize`` runs the fused path compiled by ``torch.compile`` (the first call of
    each row compiles it, in the warm-up); ``mxfp4_rne_eager`` is the same path uncompiled.
    """
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)
    nbytes = 2 * x.numel() * x.element_size()
    mx, sr, nv = (
        QuantSpec(format="mxfp4"),
        QuantSpec(format="mxfp4", rounding="sr"),
        QuantSpec(format="nvfp4"),
    )
    bf = torch.bfloat16
    h16 = (16, None)
    # name -> (spec, axis, hadamard)
    cases: dict[str, tuple[QuantSpec, int, tuple[int, None] | None]] = {
        "mxfp4_rne": (mx, -1, None),
        "mxfp4_sr": (sr, -1, None),
        "mxfp4_h16": (mx, -1, h16),
        "nvfp4_rne": (nv, -1, None),
        "mxfp4_rne_axis0": (mx, 0, None),
    }
    runs: list[tuple[str, Fn]] = [("copy", x.clone)]
    for name, (spec, axis, had) in cases.items():
        runs.append((name, functools.partial(fake_quantize, x, spec, axis, 1234, bf, had)))
    if device.type == "cuda":
        runs.append(
            ("mxfp4_rne_eager", lambda: fake_quantize_fused(x, mx, -1, 0, bf, compile=False))
        )
    rows: list[dict[str, object]] = []
    copy_ms = 0.0
    for name, fn in runs:
        ms = median_ms(fn, repeats, device)
        copy_ms = ms if name == "copy" else copy_ms
        row: dict[str, object] = {
            "quantizer": name,
            "ms": ms,
            "gbps": nbytes / (ms * 1e-3) / 1e9,
            "copy_fraction": copy_ms / ms,
        }
        if name in cases:
            spec, axis, had = cases[name]
            xr = x if had is None else hadamard_transform(x, axis, had[0], had[1])
            ref = fake_quantize_reference(xr, spec, axis, 1234, bf).view(torch.int16)
            got = fake_quantize(x, spec, axis, 1234, bf, had).view(torch.int16)
            row["bit_exact"] = bool(torch.equal(got, ref))
        rows.append(row)
    return rows


def measure(
    device: torch.device,
    tokens: int,
    repeats: int,
    kn: Iterable[tuple[int, int]] = LLAMA3_8B,
    quant_k: int = 4096,
) -> dict[str, Any]:
    """Every row of this benchmark on ``device``: GEMMs of (tokens, K, N) for each (K, N) in ``kn``
    and the quantizer on (tokens, quant_k)."""
    native = sorted(supported_formats(device))
    shapes = [(tokens, k, n) for k, n in kn]
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "native_formats": native,
        "repeats": repeats,
        "gemms": gemm_rows(device, shapes, repeats, native),
        "quantizer": quantizer_rows(device, (tokens, quant_k), repeats),
        "quantizer_shape": [tokens, quant_k],
    }


def report_lines(result: dict[str, Any]) -> list[str]:
    """``measure``'s result as the printed tables."""
    gemms, quant = result["gemms"], result["quantizer"]
    native = result["native_formats"] or "none"
    lines = [
        f"device: {result['device']}, torch {result['torch']}, native: {native}",
        f"GEMMs, median of {result['repeats']} after 1 warm-up",
        f"{'':22s} {'M':>6s} {'K':>6s} {'N':>6s} {'ms':>9s} {'TFLOP/s':>9s}",
    ]
    for r in gemms:
        lines.append(
            f"{r['gemm']!s:22s} {r['M']:>6} {r['K']:>6} {r['N']:>6} "
            f"{r['ms']:9.3f} {r['tflops']:9.1f}"
        )
    M, K = result["quantizer_shape"]
    lines += [
        f"quantizer on {M}x{K} bfloat16 (bf16 in and out)",
        f"{'':22s} {'ms':>9s} {'GB/s':>9s} {'of copy':>8s}",
    ]
    for r in quant:
        note = f"  bit-exact: {r['bit_exact']}" if "bit_exact" in r else ""
        lines.append(
            f"{r['quantizer']!s:22s} {r['ms']:9.3f} {r['gbps']:9.1f} "
            f"{r['copy_fraction']:8.3f}{note}"
        )
    return lines


NO_GPU = "no CUDA or ROCm device here, nothing to measure"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tokens", type=int, default=8192, help="M of every GEMM (default 8192)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per row (default 10)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of results")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1:
        ap.error("--tokens and --repeats must be positive")
    if not torch.cuda.is_available():
        print(f"backends.gpu_bench: {NO_GPU} (python -m backends.bench measures the CPU quantizer)")
        return 0
    result = measure(torch.device("cuda"), args.tokens, args.repeats)
    print("\n".join(report_lines(result)))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
