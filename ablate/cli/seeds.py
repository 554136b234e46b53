"""``ablate plan``'s seed section: per comparison of a study, the seeds that decide it at a stated
power and the GPU-hours of that design (``ablate.report.planner``), from a noise model measured on
a finished study (``--noise-from``) or declared (``--noise``, ``--stall-rate``)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ablate.report.planner import Noise
    from ablate.study import Cell, Study


@dataclass(frozen=True)
class Comparison:
    """One configuration against its baseline: the modelled step-throughput gain, the margin
    (log scale), the seeds per configuration that decide it, and their GPU-hours (NaN unknown)."""

    config: str
    gain: float
    margin: float
    seeds: int | None
    gpu_hours: float


def noise_model(sigma: float | None, stall_rate: float | None) -> Noise:
    """The declared noise model (``--noise``, ``--stall-rate``), or the default one."""
    from ablate.report.planner import DEFAULT_NOISE, Noise

    if sigma is None:
        return DEFAULT_NOISE
    return Noise(sigma, stall_rate or 0.0, "declared (--noise)")


def seed_rows(
    study: Study, noise: Noise, margin: float | None, power: float, tflops: float
) -> dict[str, Any]:
    """The seed plan as ``plan --json`` gives it."""
    rows = comparisons(study, noise, margin, power, tflops)
    return {
        "power": power,
        "noise": {"sigma": noise.sigma, "stall_rate": noise.stall_rate, "source": noise.source},
        "comparisons": [
            {
                "config": r.config,
                "throughput_gain": r.gain if math.isfinite(r.gain) else None,
                "margin_tokens": math.expm1(r.margin) if math.isfinite(r.margin) else None,
                "seeds": r.seeds,
                "gpu_hours": r.gpu_hours if math.isfinite(r.gpu_hours) else None,
            }
            for r in rows
        ],
    }


def measured_noise(study_file: str, output: str | None, tracking_uri: str | None) -> Noise:
    """The noise model of a finished study: its report's paired residual sd and stall rate."""
    from ablate.cli.common import load
    from ablate.errors import AblateError, ReportError
    from ablate.report.metrics import per_cell, per_config, resolve_target
    from ablate.report.planner import PAIRED_SOURCE, study_noise
    from ablate.report.recorded import study_frames

    other = load(study_file, output, tracking_uri=tracking_uri)
    try:
        cells, evals = study_frames(other)
    except AblateError as e:
        raise click.BadParameter(f"{study_file}: {e}", param_hint="--noise-from") from None
    if not len(cells) or other.target is None:
        why = "no recorded runs" if not len(cells) else "no target (and no baseline)"
        raise click.BadParameter(f"{study_file}: {why}", param_hint="--noise-from")
    try:
        from ablate.report.inputs import clean_evals

        ev = clean_evals(cells, evals)
        table = per_cell(cells, ev, resolve_target(other.target.model_dump(), ev, cells))
        configs = per_config(table, other.file.speedup, ev)
    except ReportError as e:
        raise click.BadParameter(f"{study_file}: {e}", param_hint="--noise-from") from None
    noise = study_noise(configs)
    if noise is None:
        raise click.BadParameter(
            f"{study_file}: no comparison there has an interval to take the noise from (too few "
            "seeds reached the target)",
            param_hint="--noise-from",
        )
    what = (
        ""
        if noise.source == PAIRED_SOURCE
        else ": no comparison there shares two seeds with the baseline, an overestimate"
    )
    return dataclasses.replace(
        noise, source=f"the {noise.source} of {other.name} ({len(table)} runs{what})"
    )


def _run_hours(cell: Cell, tflops: float) -> float:
    """GPU-hours of one run of the cell, all its steps, as ``plan``'s compute counts them."""
    from ablate.driver.compute import Compute, flops_per_token_of

    t = cell.config.train
    tokens = t.steps * t.tokens_per_step
    return Compute(t.steps, tokens, tokens * flops_per_token_of(cell)).gpu_hours(tflops)


def comparisons(
    study: Study, noise: Noise, margin: float | None, power: float, tflops: float
) -> list[Comparison]:
    """Each non-baseline configuration of ``study`` against its baseline (``margin``: a relative
    token cost such as 0.05, or None for each configuration's break-even)."""
    from ablate.errors import ReportError
    from ablate.report.planner import default_margin, seeds_needed
    from ablate.report.speedup import recipe_gain

    by_config: dict[str, Cell] = {}
    for c in study.cells:
        by_config.setdefault(c.config_label, c)
    base = next((c for c in by_config.values() if c.baseline), None)
    if base is None:
        return []

    out = []
    for name, cell in by_config.items():
        if cell.baseline:
            continue
        try:
            gain = recipe_gain(cell.recipe_axes, base.recipe_axes, study.file.speedup)
        except ReportError:
            gain = math.nan
        m = math.log1p(margin) if margin is not None else default_margin(gain)
        n = seeds_needed(m, noise, len(by_config), power) if m > 0 else None
        hours = (_run_hours(cell, tflops) + _run_hours(base, tflops)) * n if n else math.nan
        out.append(Comparison(name, gain, m, n, hours))
    return out


def echo_seed_plan(
    study: Study, noise: Noise, margin: float | None, power: float, tflops: float
) -> list[Comparison]:
    """Print the seed section of ``ablate plan`` and return its rows."""
    rows = comparisons(study, noise, margin, power, tflops)
    click.echo(
        f"seeds to decide each comparison at {power:.0%} power (paired seeds, 95% intervals; "
        f"noise: sigma {noise.sigma:.3g} in log tokens to target, {noise.stall_rate:.0%} of runs "
        f"stall, {noise.source}):"
    )
    if not rows:
        click.echo("  no baseline: nothing to compare")
        return rows
    width = max(len(r.config) for r in rows)
    for r in rows:
        what = (
            f"a margin of {math.expm1(r.margin):+.1%} tokens"
            if margin is not None
            else f"break-even at {math.expm1(r.margin):+.1%} tokens (gain {r.gain:.2f}x)"
        )
        if not math.isfinite(r.margin):
            click.echo(f"  {r.config:{width}s}  no throughput gain to break even against: --margin")
            continue
        if r.seeds is None:
            click.echo(f"  {r.config:{width}s}  {what}: out of reach (over 10,000 seeds)")
            continue
        click.echo(
            f"  {r.config:{width}s}  {what}: {r.seeds} seeds each, "
            f"{_hours(r.gpu_hours)} GPU-hours with its baseline"
        )
    decided = [r for r in rows if r.seeds is not None]
    if decided:
        n = max(r.seeds for r in decided if r.seeds is not None)
        first = {c.config_label: c for c in reversed(study.cells)}  # as `comparisons` picks
        total = sum(_run_hours(c, tflops) * n for c in first.values())
        seeds = max(Counter(c.config_label for c in study.cells).values())
        click.echo(
            f"every comparison decided: {n} seeds per configuration, {_hours(total)} GPU-hours at "
            f"{tflops:g} TFLOP/s (the study as written: {seeds} seed(s) per configuration)"
        )
    return rows


def _hours(h: float) -> str:
    """GPU-hours as a reader takes them in: 1,234 / 12.3 / 0.0123."""
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"
