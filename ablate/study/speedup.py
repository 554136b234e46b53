"""The study's ``speedup:`` section (``SpeedupSection``) and the named devices it can point at.

A device profile is the dense GEMM throughput of each format relative to BF16, from the vendors'
data sheets. The section says which profile the report's step-time model uses and how a BF16 step
splits between the linear layers' GEMMs and everything else; the model itself (and why its defaults
are what they are) is in ``ablate.report.speedup``. Only pydantic here: the report imports it, so it must stay cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["fprop", "dgrad", "wgrad"]
"""A GEMM as the speedup model names it: ``backends.recipes.Gemm``, spelled here so that the model
imports no torch (a test holds the two equal)."""
ROLES: tuple[Role, ...] = get_args(Role)
FORMATS = ("bf16", "fp8", "mxfp8", "mxfp4", "nvfp4")
BASE_FORMATS = ("bf16", "fp8", "mxfp8")
FP4_FORMATS = ("mxfp4", "nvfp4")
DEFAULT_GEMM_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Device:
    """A named accelerator: dense GEMM throughput per format relative to BF16.

    A format the device cannot run natively is absent from ``throughput``.
    """

    name: str
    description: str
    throughput: Mapping[str, float]
    source: str


# Peak dense (no 2:4 sparsity) tensor throughput from the vendors' data sheets; only the ratios matter.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # AMD Instinct MI355X (CDNA 4, gfx950) data sheet: BF16 2.5 PFLOPS, FP8/MXFP8 5.0 PFLOPS,
        # MXFP6/MXFP4 10.1 PFLOPS dense. Block-scaled formats are OCP MX only: no NVFP4.
        Device(
            "mi355x",
            "AMD Instinct MI355X",
            {"bf16": 1.0, "fp8": 2.0, "mxfp8": 2.0, "mxfp4": 4.0},
            "AMD MI355X data sheet: BF16 2.5, FP8 5.0, MXFP4 10.1 PFLOPS dense",
        ),
        # NVIDIA HGX B200 data sheet (1,000 W): BF16 2.25, FP8/FP6 4.5, FP4 9 PFLOPS dense; MXFP8 runs at
        # the FP8 rate, MXFP4 and NVFP4 at the FP4 rate (sm_100 block-scaled MMA).
        Device(
            "b200",
            "NVIDIA B200 (HGX, 1,000 W)",
            {"bf16": 1.0, "fp8": 2.0, "mxfp8": 2.0, "mxfp4": 4.0, "nvfp4": 4.0},
            "NVIDIA HGX B200 data sheet: BF16 2.25, FP8 4.5, FP4 9 PFLOPS dense",
        ),
        # NVIDIA H100 SXM data sheet: BF16 989 TFLOPS, FP8 1,979 TFLOPS dense; no block-scaled formats.
        Device(
            "h100",
            "NVIDIA H100 SXM",
            {"bf16": 1.0, "fp8": 2.0},
            "NVIDIA H100 SXM data sheet: BF16 989, FP8 1,979 TFLOPS dense",
        ),
        # AMD Instinct MI300X data sheet: BF16 1,307 TFLOPS, FP8 2,615 TFLOPS dense; no MX formats.
        Device(
            "mi300x",
            "AMD Instinct MI300X",
            {"bf16": 1.0, "fp8": 2.0},
            "AMD MI300X data sheet: BF16 1,307, FP8 2,615 TFLOPS dense",
        ),
    )
}


def format_name(fmt: str) -> str:
    """``fp8_e4m3`` -> ``fp8``, ``mxfp8_e5m2`` -> ``mxfp8``: throughput depends on the family only."""
    name = fmt.strip().lower()
    for suffix in ("_e4m3", "_e5m2"):
        name = name.removesuffix(suffix)
    return name


class SpeedupSection(BaseModel):
    """How the report projects step throughput when it was not measured on native GEMMs."""

    model_config = ConfigDict(extra="forbid")

    device: str = Field(
        default="mi355x",
        description=f"Named device profile whose GEMM throughput ratios apply: {', '.join(DEVICES)}.",
    )
    gemm_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Fraction of a BF16 training step spent in the linear layers' three GEMMs (fprop, dgrad, "
            f"wgrad), split equally among them. Default {DEFAULT_GEMM_SHARE} (calibrated to +20% step "
            "throughput for full MXFP4 versus FP8 on MI355X). Give this or role_share, not both."
        ),
    )
    role_share: dict[Role, float] | None = Field(
        default=None,
        description="Fraction of a BF16 step in each GEMM role, e.g. {fprop: 0.2, dgrad: 0.2, wgrad: 0.2}.",
    )
    throughput: dict[str, float] = Field(
        default_factory=dict,
        description="Overrides of the device's dense GEMM throughput relative to BF16, e.g. {mxfp4: 3.5}.",
    )
    quant_overhead: float = Field(
        default=0.0,
        ge=0,
        description=(
            "Time to quantize a GEMM's operands, as a fraction of that GEMM's BF16 time, added for every "
            "GEMM that is not BF16. Default 0: the calibration measurement already contains it."
        ),
    )

    hadamard_overhead: float = Field(
        default=0.01,
        ge=0,
        description=(
            "Cost of a 16-point Hadamard transform of a GEMM's two operands, as a fraction of that "
            "GEMM's BF16 time, added to every GEMM that has one and scaled by size/16 (a g-point "
            "transform does g multiply-adds per element). Default 0.01: an estimate (one extra "
            "pass over the operands of a memory-bound quantizer), not a measurement; set it from "
            "a profile of your device."
        ),
    )
    sr_overhead: float = Field(
        default=0.01,
        ge=0,
        description=(
            "Cost of stochastic rounding (a random number per element) on a GEMM's operands, as a "
            "fraction of that GEMM's BF16 time, added to every GEMM that rounds stochastically. "
            "Default 0.01: an estimate, not a measurement."
        ),
    )

    scale_rule_overhead: float = Field(
        default=0.01,
        ge=0,
        description=(
            "Cost of Four Over Six block scales (4/6) on a GEMM's operands, as a fraction of that "
            "GEMM's BF16 time, added to every GEMM with an operand that uses them: each block is "
            "quantized twice (map-to-6 and map-to-4), dequantized and its errors compared, in "
            "the quantizer's one pass over the operand. Default 0.01: an estimate (as much again "
            "as a quantizer's arithmetic, like one extra pass), not a measurement."
        ),
    )
    eden_overhead: float = Field(
        default=0.01,
        ge=0,
        description=(
            "Cost of MS-EDEN (Quartet II) on a GEMM's operands beyond their Hadamard transform "
            "(charged by hadamard_overhead): two sums per rotation group for the scale "
            "correction and a random number per block to round the corrected scale. Default "
            "0.01: an estimate, not a measurement."
        ),
    )

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        if v not in DEVICES:
            raise ValueError(f"unknown device {v!r}; allowed: {', '.join(DEVICES)}")
        return v

    @field_validator("throughput")
    @classmethod
    def _known_formats(cls, v: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for fmt, ratio in v.items():
            name = format_name(fmt)
            if name not in FORMATS:
                raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
            if not (ratio > 0 and math.isfinite(ratio)):
                raise ValueError(f"throughput of {fmt!r} must be a positive number, got {ratio}")
            out[name] = float(ratio)
        return out

    @model_validator(mode="after")
    def _shares(self) -> SpeedupSection:
        if self.role_share is not None:
            if self.gemm_share is not None:
                raise ValueError("give gemm_share or role_share, not both")
            missing = [r for r in ROLES if r not in self.role_share]
            if missing:
                raise ValueError(
                    f"role_share is missing {', '.join(missing)}; give all of fprop, dgrad, wgrad"
                )
            if any(s < 0 for s in self.role_share.values()):
                raise ValueError("role_share values must be >= 0")
            total = sum(self.role_share.values())
            if not 0 < total <= 1:
                raise ValueError(f"role_share must sum to a fraction in (0, 1], got {total:g}")
        return self

    def shares(self) -> dict[str, float]:
        """Fraction of a BF16 step spent in each GEMM role."""
        if self.role_share is not None:
            return {r: float(self.role_share[r]) for r in ROLES}
        g = DEFAULT_GEMM_SHARE if self.gemm_share is None else self.gemm_share
        return {r: g / 3 for r in ROLES}

    def ratios(self) -> dict[str, float]:
        """GEMM throughput relative to BF16 per format: the device's table with the overrides."""
        return {**DEVICES[self.device].throughput, **self.throughput}

    def source(self) -> str:
        """How the summary names this model: ``model:<device>``."""
        return f"model:{self.device}"

    def describe(self) -> str:
        """One paragraph of the assumptions, for the report's method notes."""
        shares = self.shares()
        ratios = ", ".join(f"{f} {r:g}" for f, r in self.ratios().items())
        roles = ", ".join(f"{r} {shares[r]:.1%}" for r in ROLES)
        overridden = f" (overridden: {', '.join(self.throughput)})" if self.throughput else ""
        return (
            f"Step-time model for {DEVICES[self.device].description} (`{self.device}`): dense GEMM "
            f"throughput relative to BF16: {ratios}{overridden}; source: {DEVICES[self.device].source}. "
            f"A BF16 step spends {sum(shares.values()):.0%} of its time in the linear layers' GEMMs "
            f"({roles}); the rest does not change with the recipe. Quantization overhead: "
            f"{self.quant_overhead:.0%} of a quantized GEMM's BF16 time; interventions add "
            f"{self.hadamard_overhead:.1%} per 16 Hadamard points and {self.sr_overhead:.1%} for "
            "stochastic rounding of each GEMM they apply to, and the 2026 quantizers "
            f"{self.scale_rule_overhead:.1%} for Four Over Six block scales and "
            f"{self.eden_overhead:.1%} for MS-EDEN (estimates, not measurements). The "
            "defaults reproduce the measured +20% step throughput of full MXFP4 over FP8 on MI355X "
            "(a recipe without interventions)."
        )
