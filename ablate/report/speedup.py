"""Projected step-throughput gain of a recipe from GEMM throughput ratios (pure Python + pydantic).

The end-to-end question is "how much sooner does this recipe reach the target?":

    projected speedup = step-throughput gain / (1 + relative token cost)

where the gain is (baseline step time) / (recipe step time). It is *measured* (tokens/s) when the runs
used native GEMMs, otherwise it comes from this module's model of one training step, measured in
units of a BF16 step (``step_time`` of an all-BF16 recipe is 1):

    step_time = (1 - sum(share))                                 # attention, norms, optimizer, ...
              + sum over roles r in (fprop, dgrad, wgrad) of
                share[r] * (1 / ratio[format_r] + overhead_r)     # the linear layers' GEMMs

    share[r]     fraction of a BF16 step spent in GEMM role r (``gemm_share`` split equally, or
                 ``role_share``); the rest of the step does not change with the recipe
    ratio[f]     dense GEMM throughput of format f relative to BF16 on the named device (``DEVICES``,
                 vendor peak figures; ``throughput`` overrides them)
    overhead_r   ``quant_overhead`` for a role whose GEMM is quantized (any format but bf16), else 0:
                 the cost of quantizing its operands as a fraction of that GEMM's BF16 time; plus
                 the role's interventions: ``hadamard_overhead`` x g/16 for a g-point Hadamard
                 transform and ``sr_overhead`` for stochastic rounding (none, SR, RHT16 and DHT16
                 thus project different gains; the interventions apply to the FP4 GEMMs); plus
                 the quantizers of the 2026 recipes, each charged to a GEMM with an operand that
                 uses it: ``scale_rule_overhead`` for Four Over Six (``4over6``: every block is
                 quantized twice, once per candidate scale, dequantized and compared, all in the
                 quantizer's pass over the operand) and ``eden_overhead`` for MS-EDEN (``eden``:
                 two sums per Hadamard group for the correction and a random number per block
                 for the scale; its Hadamard transform is charged as any other)

Calibration. The defaults (device ``mi355x``, ``gemm_share`` 0.5, ``quant_overhead`` 0) reproduce the
MXFP4 paper's measurement on MI355X (arXiv 2605.09825, Llama 3.1-8B): full MXFP4 (all three GEMMs)
versus an all-FP8 baseline gives +20% step throughput. With peak ratios fp8 = 2, mxfp4 = 4:

    FP8 step   = 0.5 + 0.5 / 2 = 0.75
    MXFP4 step = 0.5 + 0.5 / 4 = 0.625      gain = 0.75 / 0.625 = 1.20

A GEMM share of one half of a BF16 step is plausible for an 8B model at long sequence length, where
attention, normalization, the optimizer and communication take the other half; the measured +20% also
already contains the quantization cost, which is why ``quant_overhead`` is 0 by default (set it, and lower nothing else, and the calibration no longer holds). The model is a
projection, not a measurement: the report always says which one it used ("measured" or
"model:<device>").

The ``speedup:`` section and the device table live in ``ablate.study.speedup``; this module is the
model. Pure Python: no pandas, no matplotlib.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from ablate.errors import ReportError
from ablate.study.speedup import BASE_FORMATS, FP4_FORMATS, ROLES, SpeedupSection, format_name
from backends.recipes.intervention import Intervention, UnknownPart, parse_label


def role_formats(fp4_gemms: str, fp4_format: str, base_format: str) -> dict[str, str]:
    """Per-role GEMM format of a cell: the roles in ``fp4_gemms`` use ``fp4_format``, the rest ``base_format``.

    ``fp4_gemms`` is the contract's ``""``, ``"fprop"``, ``"fprop+dgrad"`` ... (commas also accepted).
    """
    fp4 = format_name(fp4_format)
    base = format_name(base_format)
    if fp4 not in FP4_FORMATS:
        raise ReportError(f"fp4_format {fp4_format!r} is not one of {', '.join(FP4_FORMATS)}")
    if base not in BASE_FORMATS:
        raise ReportError(f"base_format {base_format!r} is not one of {', '.join(BASE_FORMATS)}")
    names = [g.strip() for g in fp4_gemms.replace(",", "+").split("+") if g.strip()]
    unknown = [g for g in names if g not in ROLES]
    if unknown:
        raise ReportError(
            f"fp4_gemms {fp4_gemms!r} names {', '.join(unknown)}; allowed: {', '.join(ROLES)}"
        )
    return {r: fp4 if r in names else base for r in ROLES}


class Costs(NamedTuple):
    """What a GEMM's intervention label charges (``intervention_costs``)."""

    points: int = 0
    """Hadamard points (a g-point transform costs ``hadamard_overhead`` x g/16)."""
    sr: bool = False
    """Stochastic rounding (``sr_overhead``)."""
    four_over_six: bool = False
    """Four Over Six block scales (``scale_rule_overhead``)."""
    eden: bool = False
    """MS-EDEN's correction and scale rounding (``eden_overhead``)."""


def intervention_costs(intervention: str | Intervention) -> Costs:
    """The cost terms of an intervention, or of its label such as ``none``, ``sr``, ``dht16``,
    ``sr+rht64``, ``sr+4over6+fht16``, ``eden+rht128`` (read by ``backends.recipes.intervention``,
    whose default size a Hadamard part without one gets); ReportError for a part it does not know."""
    iv = read_label(intervention) if isinstance(intervention, str) else intervention
    if not isinstance(iv, Intervention):
        raise ReportError(f"intervention {intervention!r}: one GEMM's label, not one per GEMM")
    points = 0 if iv.hadamard is None else iv.hadamard.size
    return Costs(points, iv.sr, iv.four_over_six, iv.eden)


def read_label(intervention: str) -> Intervention | dict[str, Intervention]:
    """A label MLflow recorded, read by the grammar (``parse_label``): one intervention, or one
    per GEMM; ReportError naming the part it does not know."""
    try:
        return parse_label(intervention)
    except UnknownPart as e:
        raise ReportError(
            f"intervention {intervention!r}: unknown part {e.part!r}; allowed: {e.allowed}"
        ) from None
    except ValueError as e:
        raise ReportError(str(e)) from None


def step_time(
    formats: Mapping[str, str],
    spec: SpeedupSection,
    interventions: Mapping[str, Costs] | None = None,
) -> float:
    """Modelled step time of a recipe (per-role formats, and per role the cost terms of
    ``intervention_costs``) in units of an all-BF16 step."""
    ratios = spec.ratios()
    shares = spec.shares()
    t = 1.0 - sum(shares.values())
    for role in ROLES:
        fmt = format_name(formats[role])
        if fmt not in ratios:
            raise ReportError(
                f"device {spec.device!r} has no native {fmt} GEMM (it runs {', '.join(ratios)}); "
                f"pick another speedup device or give its throughput, e.g. throughput: {{{fmt}: 4.0}}"
            )
        overhead = spec.quant_overhead if fmt != "bf16" else 0.0
        c = Costs(*(interventions or {}).get(role, Costs()))
        overhead += spec.hadamard_overhead * c.points / 16 + (spec.sr_overhead if c.sr else 0.0)
        overhead += spec.scale_rule_overhead if c.four_over_six else 0.0
        overhead += spec.eden_overhead if c.eden else 0.0
        t += shares[role] * (1.0 / ratios[fmt] + overhead)
    return t


def role_interventions(fp4_gemms: str, intervention: str) -> dict[str, Costs]:
    """Per role, the intervention's cost terms: the intervention applies to the FP4 GEMMs; or, for
    a per-GEMM intervention such as ``fprop:none,dgrad:sr,wgrad:sr+fht16`` (a named or explicit
    recipe whose GEMMs differ), each listed role's own."""
    names = {g.strip() for g in fp4_gemms.replace(",", "+").split("+") if g.strip()}
    iv = read_label(intervention)
    if isinstance(iv, Intervention):
        costs = intervention_costs(iv)
        return {r: costs for r in ROLES if r in names}
    return {role: intervention_costs(v) for role, v in iv.items()}


def recipe_gain(cell: Mapping[str, Any], base: Mapping[str, Any], spec: SpeedupSection) -> float:
    """``throughput_gain`` of one recipe over another, each given by its recipe axes as a cell
    records them (``fp4_gemms``, ``intervention``, ``fp4_format``, ``base_format``: a report's
    ``cells`` row or a ``Cell.recipe_axes``; a missing one at ``report.frames.cell_row``'s
    default). ReportError where the model has no rate for a format."""

    return schedule_time(base, spec) / schedule_time(cell, spec)


def schedule_time(a: Mapping[str, Any], spec: SpeedupSection) -> float:
    """Modelled step time of a cell's recipe, given by its recipe axes: with a precision schedule
    (``phases``, ``ablate.study.phases.timeline_axes``), the mean of its segments' step times
    weighted by their share of the steps (the run's time is the sum of its steps' times)."""
    segments = a.get("phases") or ""
    if isinstance(segments, str) and segments:
        total = 0.0
        for seg in json.loads(segments):
            roles = seg["gemms"]
            formats: dict[str, str] = {r: roles[r]["format"] for r in ROLES}
            iv: dict[str, Costs] = {
                r: intervention_costs(roles[r]["intervention"])
                for r in ROLES
                if "intervention" in roles[r]
            }
            total += float(seg["share"]) * step_time(formats, spec, iv)
        return total
    gemms, label = a.get("fp4_gemms", ""), a.get("intervention", "none")
    own = role_formats(gemms, a.get("fp4_format", "mxfp4"), a.get("base_format", "bf16"))
    return step_time(own, spec, role_interventions(gemms, label))


def throughput_gain(
    cell_formats: Mapping[str, str],
    baseline_formats: Mapping[str, str],
    spec: SpeedupSection,
    cell_interventions: Mapping[str, Costs] | None = None,
    baseline_interventions: Mapping[str, Costs] | None = None,
) -> float:
    """Modelled step-throughput gain of a recipe over the baseline: baseline step time / its step time."""
    return step_time(baseline_formats, spec, baseline_interventions) / step_time(
        cell_formats, spec, cell_interventions
    )


def projected_speedup(gain: float, relative_token_cost: float) -> float:
    """End-to-end speedup: gain / (1 + relative token cost); NaN when either is undefined (an
    infinite cost, the open end of a lower bound, gives 0)."""
    if not math.isfinite(gain) or math.isnan(relative_token_cost):
        return math.nan
    return gain / (1.0 + relative_token_cost)
