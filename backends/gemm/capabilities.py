"""Which device runs which format natively: the capability table, the device's arch and name, what
the installed torch build can run, and ``check_recipe``, the refusal before any training step that
names the device, the formats and GEMMs it cannot run, what it does run, and ``backend: emulated``
as the way to run the recipe anyway. ``backends.gemm.native`` multiplies on what this module allows.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from backends.gemm.base import UnsupportedFormatError
from backends.quant import FORMATS
from backends.recipes import GEMMS, Recipe

_FP8 = frozenset({"fp8_e4m3", "fp8_e5m2"})
_MXFP8 = frozenset({"mxfp8_e4m3", "mxfp8_e5m2"})

CAPABILITIES: dict[str, frozenset[str]] = {
    # NVIDIA, by compute capability. FP8 per tensor from Ada on; block-scaled from Blackwell on.
    "sm_89": _FP8,  # Ada: L4, L40S, RTX 4090
    "sm_90": _FP8,  # Hopper: H100, H200, GH200
    "sm_100": _FP8 | _MXFP8 | {"mxfp4", "nvfp4"},  # Blackwell: B200, GB200
    "sm_103": _FP8 | _MXFP8 | {"mxfp4", "nvfp4"},  # Blackwell Ultra: B300, GB300
    "sm_120": _FP8 | _MXFP8 | {"nvfp4"},  # RTX 50xx, RTX PRO 6000: torch runs MXFP4 on sm_10x only
    # AMD, by gfx arch.
    "gfx942": _FP8,  # MI300X, MI325X: FNUZ FP8, codes mapped exactly (``to_fnuz``)
    "gfx950": _FP8 | _MXFP8 | {"mxfp4"},  # MI350X, MI355X: no NVFP4 on ROCm
    # the CPU: torch._scaled_mm's CPU kernel multiplies per-tensor FP8 (what the native backend's
    # self-check and its tests run without a GPU)
    "cpu": _FP8,
}
"""Formats each device runs natively through ``torch._scaled_mm`` (arch, or ``cpu``, -> format
names)."""

_BLOCK = {"e8m0": 32, "nv": 16}  # the only block sizes the hardware GEMMs take
_NO_DEVICE_HINT = (
    "torch._scaled_mm needs an NVIDIA GPU of compute capability 8.9 or newer or an AMD MI300/MI350"
)


# ----------------------------------------------------------------------------------------------
# devices and what they support


def device_arch(device: torch.device | str) -> str | None:
    """``sm_90``, ``gfx942``, ...; None for devices without a GPU arch (the CPU, whose scaled GEMM
    ``capability_key`` names ``cpu``; mps, ...)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return str(props.gcnArchName).split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"
    return f"sm_{props.major}{props.minor}"


def capability_key(device: torch.device | str) -> str | None:
    """The key of ``CAPABILITIES`` for ``device``: its arch, ``cpu``, or None (no scaled GEMM)."""
    device = torch.device(device)
    return "cpu" if device.type == "cpu" else device_arch(device)


def device_name(device: torch.device | str) -> str:
    """``cpu``, or the GPU's name with its arch: ``NVIDIA H100 80GB HBM3 (sm_90)``."""
    device = torch.device(device)
    arch = device_arch(device)
    if arch is None:
        return device.type
    return f"{torch.cuda.get_device_properties(device).name} ({arch})"


def device_description(device: torch.device | str) -> str:
    """The GPU's name with its arch (``device_name``), or the CPU's model name (what a run's
    provenance and a benchmark's header record)."""
    device = torch.device(device)
    if device.type != "cpu":
        return device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_limits(arch: str | None) -> dict[str, str]:
    """Formats of ``arch`` that this torch build cannot run natively, with the reason."""
    out: dict[str, str] = {}
    if arch is None:
        return out
    cuda_mxfp4 = arch.startswith("sm_") and "mxfp4" in CAPABILITIES.get(arch, ())
    config = torch.__config__.show()
    if cuda_mxfp4 and sys.platform == "win32":
        out["mxfp4"] = "torch has no MXFP4 GEMM on Windows"
    elif cuda_mxfp4 and "USE_MSLK" not in config and "USE_FBGEMM_GENAI" not in config:
        out["mxfp4"] = "this torch build has no MSLK kernels, which torch uses for MXFP4 on CUDA"
    hip = hip_version()
    if hip is not None and not has_swizzle_32_8():
        # a torch built against ROCm >= 7.13 (7.14 for MXFP8) takes hipBLASLt's pre-swizzled MX
        # scales (``layouts.preswizzle_scales``) and has its row-major path compiled out; only a
        # call that names that layout (v2's SwizzleType.SWIZZLE_32_8) reaches it: v1 would read
        # row-major scales as pre-swizzled without an error (equal element counts)
        for fmt in sorted(preswizzled_formats(arch, hip)):
            out[fmt] = (
                f"torch {torch.__version__} was built against ROCm {hip[0]}.{hip[1]}, whose MX GEMM "
                "reads hipBLASLt's pre-swizzled scales, and its scaled_mm has no "
                "SwizzleType.SWIZZLE_32_8 to name them"
            )
    return out


def preswizzled_formats(arch: str | None, hip: tuple[int, int] | None) -> frozenset[str]:
    """Formats whose MX scales the GEMM of ``arch`` reads in hipBLASLt's pre-swizzled 32x8 tiles
    on a torch built against ROCm ``hip``: MXFP4 from 7.13, MXFP8 from 7.14 (PyTorch's
    ``ScaledBlas.cpp``: ``ROCM_VERSION >= 71300`` / ``>= 71400``); none before, on CUDA or without
    MX GEMMs."""
    if hip is None or arch is None or not arch.startswith("gfx"):
        return frozenset()
    caps = CAPABILITIES.get(arch, frozenset())
    since = {"mxfp4": (7, 13), "mxfp8_e4m3": (7, 14), "mxfp8_e5m2": (7, 14)}
    return frozenset(f for f, v in since.items() if hip >= v and f in caps)


def has_swizzle_32_8() -> bool:
    """Whether this torch's ``scaled_mm`` (v2) can name hipBLASLt's pre-swizzled MX scales
    (``SwizzleType.SWIZZLE_32_8``; torch 2.11-2.13 cannot)."""
    swizzle = getattr(torch.nn.functional, "SwizzleType", None)
    return swizzle is not None and hasattr(swizzle, "SWIZZLE_32_8")


def hip_version() -> tuple[int, int] | None:
    """(major, minor) of the ROCm this torch was built against; None for a CUDA or CPU build."""
    hip = torch.version.hip
    if not hip:
        return None
    major, minor = hip.split(".")[:2]
    return int(major), int(minor)


def formats_for(arch: str | None, limits: Mapping[str, str] | None = None) -> set[str]:
    """Formats ``arch`` runs natively, less those in ``limits`` (default: none)."""
    caps = CAPABILITIES.get(arch, frozenset()) if arch else frozenset()
    return set(caps) - set(limits or {})


def supported_formats(device: torch.device | str) -> set[str]:
    """Formats this device runs natively with this torch build."""
    arch = device_arch(device)
    return formats_for(capability_key(device), build_limits(arch))


def check_recipe(
    recipe: Recipe,
    arch: str | None,
    name: str | None = None,
    limits: Mapping[str, str] | None = None,
) -> None:
    """Raise ``UnsupportedFormatError`` unless device ``arch`` (called ``name`` in messages) runs
    every quantized GEMM of ``recipe`` natively; ``limits`` are formats the build cannot run."""
    name = name or arch or "cpu"
    limits = dict(limits or {})
    supported = formats_for(arch, limits)
    missing: dict[str, list[str]] = {}  # format -> GEMMs that need it
    problems: list[str] = []
    for g in GEMMS:
        gemm = recipe.gemm(g)
        if gemm.high_precision:
            continue
        if gemm.a is None or gemm.b is None:
            problems.append(
                f"{g} multiplies a quantized operand by a high-precision one "
                f"({gemm.short()}); a native GEMM needs both operands quantized"
            )
            continue
        fa, fb = gemm.a.format, gemm.b.format
        for spec in (gemm.a, gemm.b):
            if spec.outer_block:
                problems.append(
                    f"{g}: {spec.short()}: the hardware GEMM takes one FP32 scale per tensor, not "
                    f"one per {spec.outer_block} elements (double-block NVFP4 needs its own kernel)"
                )
            native_block = _BLOCK.get(spec.fmt.scale)
            if spec.block_size is not None and spec.block_size != native_block:
                problems.append(
                    f"{g}: {spec.format} with block_size {spec.block_size}; the hardware GEMM "
                    f"takes {native_block}-element blocks"
                )
        if _family(fa) != _family(fb):
            problems.append(f"{g}: no native GEMM multiplies {fa} by {fb}")
        elif fa.endswith("e5m2") and fb.endswith("e5m2") and not (arch or "").startswith("gfx"):
            problems.append(f"{g}: {fa} x {fb}: cuBLAS has no GEMM with both operands in E5M2")
        for f in dict.fromkeys((fa, fb)):
            if f not in supported:
                missing.setdefault(f, []).append(g)
    if not missing and not problems:
        return
    lines = [f"backend native cannot run recipe {recipe.short()!r} on {name}:"]
    for f, gemms in missing.items():
        why = f" ({limits[f]})" if f in limits else ""
        lines.append(f"  {f} ({', '.join(gemms)}) has no native GEMM on this device{why}")
    lines += [f"  {p}" for p in problems]
    runs = [f for f in FORMATS if f in supported]
    if runs:
        lines.append(f"  {name} runs natively: {', '.join(runs)}")
    else:
        lines.append(f"  {name} runs no format natively ({_NO_DEVICE_HINT})")
    lines.append(
        "Use `backend: emulated` to run this recipe on any device (the same quantized values, "
        "multiplied in FP32)."
    )
    raise UnsupportedFormatError("\n".join(lines))


_FAMILY = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "mxfp8_e4m3": "mxfp8", "mxfp8_e5m2": "mxfp8"}


def _family(fmt: str) -> str:
    """Formats one GEMM can pair: E4M3 with E5M2 within FP8 and within MXFP8."""
    return _FAMILY.get(fmt, fmt)


HAS_V2 = hasattr(torch.nn.functional, "scaled_mm")
"""Whether this torch has the explicit scaled GEMM, ``torch.nn.functional.scaled_mm`` (v2)."""


def _v2_kernel(key: str) -> bool:
    try:
        return HAS_V2 and torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm_v2", key)
    except RuntimeError:  # no such operator in this torch
        return False


V2_ON: dict[str, bool] = {"cpu": _v2_kernel("CPU"), "cuda": _v2_kernel("CUDA")}
"""Device type -> whether v2 runs there: torch 2.11 has it on CUDA (and ROCm) only, and runs the
CPU's per-tensor FP8 GEMM through ``torch._scaled_mm`` (v1); torch 2.13 has both. The two CPU
kernels agree to FP32 accumulation, not always to the bit (the oneDNN kernel an AVX-512 CPU's v1
takes sums K in another order than v2), so a CPU's native FP8 numbers may differ between the two
torches in their last bits. Read at import, so that a traced model reads a constant."""
