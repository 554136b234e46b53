"""The commands that look at a study before it runs and write nothing: ``validate`` (every check
``run`` makes), ``plan`` (what ``run`` would do to each cell, and each configuration's memory
estimate per device, with a warning for those that will not fit) and ``schema`` (the JSON Schema of a
study file)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ablate.cli.common import (
    FiniteRange,
    address_opt,
    load,
    max_cells_opt,
    output_opt,
    preflight_or_exit,
    refuse,
    study_arg,
    tracking_uri_opt,
)
from ablate.errors import AblateError
from ablate.study import Cell, Study

if TYPE_CHECKING:
    from ablate.driver.branching import Member
    from ablate.driver.planning import PlannedCell
    from ablate.train.memory import MemoryEstimate


def _device_memory(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from ablate.train.memory import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


@click.command()
@study_arg
@output_opt
@max_cells_opt
@click.option("--rerun-failed", is_flag=True, help="Plan as `run --rerun-failed` would.")
@click.option("--rerun-stale", is_flag=True, help="Plan as `run --rerun-stale` would.")
@address_opt
@tracking_uri_opt()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--device-memory",
    callback=_device_memory,
    default=None,
    metavar="SIZE",
    help="Memory of the device each cell trains on, e.g. 80GiB, 24GB, 512MiB (default: the "
    "visible GPU's, for cells that train on CUDA).",
)
@click.option(
    "--gpu-tflops",
    type=FiniteRange(min=1e-3, max=1e6),  # 1 GFLOP/s to 1 EFLOP/s: beyond, the hours are noise
    default=None,
    metavar="TFLOPS",
    help="Sustained TFLOP/s per GPU for the GPU-hours estimate (default 400: an H100's dense "
    "BF16 at 40%).",
)
@click.option(
    "--noise-from",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="STUDY",
    help="A finished study (its YAML file) whose report measures the noise model of the seed "
    "plan: the paired residual sd of log tokens to target and the stall rate.",
)
@click.option(
    "--noise-output",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="The --noise-from study's output folder, where it is not its default.",
)
@click.option(
    "--noise",
    type=FiniteRange(min=0, min_open=True),
    default=None,
    metavar="SIGMA",
    help="Declare the paired residual sd of log tokens to target instead (e.g. 0.06).",
)
@click.option(
    "--stall-rate",
    type=FiniteRange(min=0, max=1, max_open=True),
    default=None,
    help="With --noise: the share of runs that stall (default 0).",
)
@click.option(
    "--margin",
    type=FiniteRange(min=0, max=1, min_open=True, max_open=True),
    default=None,
    help="Decide a relative token cost this far from the break-even, e.g. 0.05 (default: each "
    "configuration's break-even cost, from its modelled step-throughput gain).",
)
@click.option(
    "--power",
    type=FiniteRange(min=0.5, max=1, max_open=True),
    default=0.8,
    show_default=True,
    help="The probability that the seed plan decides each comparison.",
)
def plan(
    study_file: str,
    output: str | None,
    max_cells: int,
    rerun_failed: bool,
    rerun_stale: bool,
    address: str | None,
    tracking_uri: str | None,
    as_json: bool,
    device_memory: int | None,
    gpu_tflops: float | None,
    noise_from: str | None,
    noise_output: str | None,
    noise: float | None,
    stall_rate: float | None,
    margin: float | None,
    power: float,
) -> None:
    """Show the expanded cells and what `run` would do to each: run, resume, skip, failed,
    stale-data (interrupted on data that prepare to other tokens now: `run` refuses it).

    Also each configuration's memory estimate per device in its parallel mode (parameters,
    gradients, AdamW state, activations of one worker's micro-batch, bf16 weight copies, DDP's
    gradient buckets or FSDP's unsharded working set, +10% allowance; see ablate.train.memory),
    with a warning for those that exceed the device's memory: --device-memory, else the visible
    GPU's for cells that train on CUDA. Reads the study's MLflow store if there is one; creates
    nothing. And the compute of the cells to run: the FLOPs of the steps they train (decay
    branches from their branch points) and the GPU-hours at --gpu-tflops sustained per GPU. And
    the seeds each comparison needs to be decided at --power (paired seeds; the noise from
    --noise-from a finished study, or --noise), with their GPU-hours.

    \b
    Example:
        ablate plan studies/mxfp4_wgrad.yaml
        ablate plan study.yaml --device-memory 80GiB
        ablate plan studies/ladder_8b.yaml --gpu-tflops 400
        ablate plan studies/mxfp4_wgrad_8b.yaml --noise-from studies/quickstart.yaml
    """
    from ablate.cli.seeds import echo_seed_plan, measured_noise, noise_model, seed_rows
    from ablate.driver import branching
    from ablate.driver.compute import SUSTAINED_TFLOPS, compute
    from ablate.driver.planning import plan as plan_study
    from ablate.driver.planning import summarize

    if noise_from is not None and noise is not None:
        raise click.UsageError("give --noise-from or --noise, not both")
    if noise_output is not None and noise_from is None:
        raise click.UsageError("--noise-output goes with --noise-from")
    if stall_rate is not None and noise is None:
        raise click.UsageError("--stall-rate goes with --noise (--noise-from measures it)")
    study = load(study_file, output, max_cells, tracking_uri)
    model = (
        measured_noise(noise_from, noise_output, None)
        if noise_from is not None
        else noise_model(noise, stall_rate)
    )
    _checks(study, address, memory=False)  # the estimates are shown below, over a limit warned
    planned = plan_study(study, rerun_failed=rerun_failed, rerun_stale=rerun_stale)
    mem = _memory_estimates(study, device_memory)
    members, notes = branching.members(study), branching.notes(study, planned)
    by_key = {p.cell.key: p for p in planned}
    trained, budgets = branching.cost(study, planned)
    cost = compute(study, planned)
    tflops = gpu_tflops if gpu_tflops is not None else SUSTAINED_TFLOPS
    if as_json:
        rows = [
            {
                "key": p.cell.key,
                "label": p.cell.label,
                "config": p.cell.config_label,
                "baseline": p.cell.baseline,
                "steps": p.cell.config.train.steps,
                "schedule_steps": p.cell.config.train.schedule_end,
                "action": p.action,
                "why": p.why,
                **_branch_row(p, members.get(p.cell.key), study, by_key),
                "values": dict(p.cell.values),
                "memory": {
                    **mem[p.cell.key][0].breakdown(),
                    "parallel": mem[p.cell.key][0].parallel,
                    "workers": mem[p.cell.key][0].workers,
                    "device_memory": mem[p.cell.key][1],
                },
            }
            for p in planned
        ]
        totals = {
            "steps_to_train": trained,
            "budget_steps": budgets,
            "compute": {
                "tokens": cost.tokens,
                "flops": cost.flops,
                "gpu_tflops": tflops,
                "gpu_hours": cost.gpu_hours(tflops),
            },
            "seeds": seed_rows(study, model, margin, power, tflops),
        }
        doc = {"study": study.name, "cells": rows, **totals, "ladder_width": _ladder_width(study)}
        click.echo(json.dumps(doc, indent=2, default=str))
        _memory_warnings(mem, planned)
        return
    click.echo(f"study {study.name}: {len(planned)} cells, axes: {', '.join(study.axes)}")
    if study.extension_note:
        click.echo(study.extension_note)
    width = max(len(p.cell.label) for p in planned)
    for p in planned:
        marks = [p.cell.role] if p.cell.baseline else []
        marks += [notes[p.cell.key]] if p.cell.key in notes else []
        mark = "".join(f" ({m})" for m in marks)
        click.echo(f"  {p.cell.key}  {p.cell.label:{width}s}  {p.action:7s} {p.why}{mark}")
    click.echo("would: " + ", ".join(f"{a} {n}" for a, n in summarize(planned).items()))
    if (seq := study.sequential) is not None:
        first = sum(c.seed < seq.initial for c in study.cells)
        click.echo(
            f"sequential seeds: at most these {len(study.cells)} cells (seeds.max {seq.max}); the "
            f"first wave trains {first}, later waves only the seeds of comparisons still open "
            "(the compute below is the most)"
        )
    if members:
        kinds = {m.family.key: m.family.kind for m in members.values()}
        told = {"decay": "of wsd budgets", "schedule": "of precision schedules"}
        said = []
        for kind, what in told.items():
            n = sum(k == kind for k in kinds.values())
            if n:
                said.append(f"{n} famil{'ies' if n > 1 else 'y'} {what}")
        click.echo(
            f"branches: {' and '.join(said)}; the cells to run train {trained:,} steps (trunks, "
            f"then each branch from its branch point), {budgets:,} without branches"
        )
    click.echo(
        f"compute: {cost.tokens:.3g} tokens, {cost.flops:.3g} FLOPs to train; "
        f"{cost.gpu_hours(tflops):,.0f} GPU-hours at {tflops:g} TFLOP/s sustained per GPU "
        "(--gpu-tflops; training only, as native GEMMs run it)"
    )
    _echo_schedules(study)
    if (line := _ladder_width(study)) is not None:
        click.echo(f"ladder: {line}")
    echo_seed_plan(study, model, margin, power, tflops)
    from ablate.train.memory import format_bytes

    click.echo("memory per device (estimate):")
    for (est, limit), cells in _by_estimate(mem, planned).items():
        configs = sorted({c.config_label for c in cells})
        shown = ", ".join(configs[:3]) + (
            f" and {len(configs) - 3} more" if len(configs) > 3 else ""
        )
        of = f" (device: {format_bytes(limit)})" if limit is not None else ""
        click.echo(f"  {len(cells)} cell(s) ({shown}): {est.short()}{of}")
    _memory_warnings(mem, planned)


def _echo_schedules(study: Study) -> None:
    """The configurations with a precision schedule: their segments, and the step-throughput
    gain the speedup model projects for each over the baseline, its segments weighted by their
    share of the steps."""
    from ablate.errors import ReportError
    from ablate.report.speedup import recipe_gain
    from ablate.train.phases import timeline

    by_config: dict[str, Cell] = {}
    for c in study.cells:
        if c.config.phases:
            by_config.setdefault(c.config_label, c)
    if not by_config:
        return
    base = next((c for c in study.cells if c.baseline), None)
    click.echo("precision schedules (optimizer steps [start, end), the recipe of each):")
    for name, c in by_config.items():
        steps = c.config.train.steps
        parts = [
            f"[{a}, {b}) {r.short()}"
            for a, b, r in timeline(c.config.phases, c.config.recipe, steps)
        ]
        gain = ""
        if base is not None:
            try:
                g = recipe_gain(c.recipe_axes, base.recipe_axes, study.file.speedup)
                gain = f"; modelled gain {g:.3f}x over the baseline, the segments weighted by steps"
            except ReportError as e:
                gain = f"; no modelled gain ({e})"
        click.echo(f"  {name}: {', '.join(parts)}{gain}")


def _branch_row(
    p: PlannedCell, m: Member | None, study: Study, planned: dict[str, PlannedCell]
) -> dict[str, Any]:
    """A cell's decay branches in ``plan --json``: its family, its trunk and branch point (a
    branch), and the step it would start from."""
    from ablate.driver.branching import start_step
    from ablate.driver.planning import TO_RUN

    start = start_step(study, p, planned, m) if p.action in TO_RUN else None
    if m is None:
        return {"family": None, "trunk": None, "branch_point": None, "starts_at": start}
    trunk = m.trunk.key if m.trunk is not None else None
    return {"family": m.family.key, "trunk": trunk, "branch_point": m.point, "starts_at": start}


def _ladder_width(study: Study) -> str | None:
    """``planning.ladder_width`` from the study's default report folder's points, if any."""
    from pathlib import Path

    from ablate.driver.planning import ladder_width

    if study.file.ladder is None or study.file.ladder.predict is None:
        return None
    click.echo("ladder: simulating this design's prediction (about 30 s)...", err=True)
    return ladder_width(study, Path("reports") / study.name / "ladder_points.csv")


def _checks(study: Study, address: str | None, *, memory: bool = True) -> None:
    """What validate and plan check: ``preflight_or_exit`` (all that `run` checks), except for a
    study whose cells ask for more GPUs than this machine has, without --address: such a study is
    for other machines (8-GPU cells planned on a laptop), so it is checked as a cluster's driver
    checks it, the study alone (tracking stores, device numbering, the backends of its CPU cells)
    and this process's ``ABLATE_*`` switches, with a warning that `ablate run` refuses it here;
    this machine's devices and cores are not checked, and `run` still refuses it."""
    import torch

    from ablate.driver.planning import ladder_brackets, target_headroom
    from ablate.driver.preflight import (
        check_baseline_source,
        check_devices,
        check_environment,
        check_ray_devices,
    )
    from ablate.errors import CannotRunError, TrackingError
    from ablate.tracking import check_store
    from ablate.train.config import device_kind

    res = study.file.resources
    need, have = res.gpus * res.workers, torch.cuda.device_count()
    if address or need <= have:
        preflight_or_exit(study, address, memory=memory)
        return
    # resources.gpus > 0 here, so check_gpus (cells that need a GPU but get none) has nothing to say
    try:
        check_environment()
        try:
            check_store(study.tracking_uri)
        except TrackingError as e:
            raise CannotRunError(str(e)) from None
        check_baseline_source(study)
        check_ray_devices(study)
        check_devices(study, [c for c in study.cells if device_kind(c.config.device) == "cpu"])
    except AblateError as e:
        raise refuse(e) from None
    click.echo(
        f"warning: each cell asks for {need:g} GPU(s) (resources.gpus {res.gpus:g} x "
        f"resources.workers {res.workers}) and this machine has {have}: `ablate run` refuses the "
        "study here; run it on a cluster (--address) or a machine with that many GPUs (checked "
        "here: the study itself; not this machine's devices and cores)",
        err=True,
    )
    if warning := target_headroom(study):
        click.echo(f"warning: {warning}", err=True)
    for line in ladder_brackets(study):
        click.echo(f"warning: {line}", err=True)


def _memory_estimates(
    study: Study, device_memory: int | None
) -> dict[str, tuple[MemoryEstimate, int | None]]:
    """Each cell's estimate and the memory of the device it trains on (None: unknown)."""
    from ablate.driver.preflight import machine_memory
    from ablate.train.config import device_kind
    from ablate.train.memory import estimate_run, visible_device_memory

    out: dict[str, tuple[MemoryEstimate, int | None]] = {}
    for cell in study.cells:
        kind = device_kind(cell.config.device)
        limit = device_memory
        if limit is None and kind == "cuda":
            limit = visible_device_memory()
        elif limit is None and kind == "cpu":  # `run` refuses a CPU cell over this machine's
            limit = machine_memory()
        out[cell.key] = (estimate_run(cell.config, kind), limit)
    return out


def _by_estimate(
    mem: dict[str, tuple[MemoryEstimate, int | None]], planned: list[Any]
) -> dict[tuple[MemoryEstimate, int | None], list[Any]]:
    groups: dict[tuple[MemoryEstimate, int | None], list[Any]] = {}
    for p in planned:
        groups.setdefault(mem[p.cell.key], []).append(p.cell)
    return groups


def _memory_warnings(mem: dict[str, tuple[MemoryEstimate, int | None]], planned: list[Any]) -> None:
    """A warning on stderr per configuration whose estimate exceeds its device's memory."""
    from ablate.train.memory import format_bytes

    for (est, limit), cells in _by_estimate(mem, planned).items():
        if limit is not None and est.total > limit:
            fixed = est.parameters + est.gradients + est.optimizer
            configs = sorted({c.config_label for c in cells})
            mode = f" ({est.parallel} x{est.workers})" if est.parallel != "none" else ""
            fixes = (
                ["raise train.grad_accum for smaller micro-batches"] if est.micro_batch > 1 else []
            )
            fixes.append("shorten train.seq_len")
            fixes.append(
                "raise resources.workers"
                if est.parallel == "fsdp"
                else "shard the model over more GPUs (resources.workers, train.parallel: fsdp)"
            )
            click.echo(
                f"warning: memory: {len(cells)} cell(s) ({', '.join(configs[:3])}"
                f"{' ...' if len(configs) > 3 else ''}) need about {format_bytes(est.total)} per "
                f"device{mode}, more than the device's {format_bytes(limit)}: they will not fit "
                f"(parameters, gradients and AdamW state alone: {format_bytes(fixed)}; "
                f"{', '.join(fixes)}, or pick a smaller model)",
                err=True,
            )


@click.command()
@study_arg
@output_opt
@max_cells_opt
@address_opt
@tracking_uri_opt()
def validate(
    study_file: str,
    output: str | None,
    max_cells: int,
    address: str | None,
    tracking_uri: str | None,
) -> None:
    """Check a study without running anything (exit status 2 and every problem when invalid).

    Runs every check `ablate run` makes before it starts: the study file, the data (found, and large
    enough for a training and a validation batch), the tracking store, and (without --address)
    whether this machine's device and cores can run every cell.

    \b
    Example:
        ablate validate studies/quickstart.yaml
    """
    study = load(study_file, output, max_cells, tracking_uri)
    _checks(study, address)
    configs = {c.config_label for c in study.cells}
    base = study.baseline_cells[0].config_label if study.baseline_cells else "none"
    click.echo(
        f"ok: {study.name}: {len(study.cells)} cells, {len(configs)} configurations, "
        f"axes {', '.join(study.axes)}; baseline {base}"
    )


@click.command()
def schema() -> None:
    """Print the JSON Schema of a study file (for editors and validators).

    \b
    Example:
        ablate schema > study.schema.json
    """
    from ablate.study import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
