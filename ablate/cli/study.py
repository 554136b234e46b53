"""The study commands: ``validate``, ``schema``, ``plan``, ``run``, ``status``, ``ui``."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import AblateError
from ..spec import Study
from .common import (
    address_opt,
    executor_opt,
    load,
    max_cells_opt,
    output_opt,
    preflight_or_exit,
    refuse,
    study_arg,
    tracking_uri_opt,
)

if TYPE_CHECKING:
    from ..train.memory import MemoryEstimate


@click.command()
@study_arg
@output_opt
@max_cells_opt
@executor_opt("cell")
@address_opt
@tracking_uri_opt()
@click.option("--rerun-failed", is_flag=True, help="Run cells that failed before again.")
@click.option(
    "--rerun-stale",
    is_flag=True,
    help="Run again, in new runs, finished cells that other training code produced "
    "(env.code_hash differs; the old runs are kept).",
)
@click.option("--max-concurrent", type=int, default=None, help="At most N cells at once.")
@click.option("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--no-report", is_flag=True, help="Do not write the report when the study ends.")
@click.option(
    "--wait-warning",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="On Ray: say which cell has not started this long after it was submitted, what it asks "
    "for and what the cluster has free (default: 60; 0: never).",
)
def run(
    study_file: str,
    output: str | None,
    max_cells: int,
    executor: str,
    address: str | None,
    tracking_uri: str | None,
    rerun_failed: bool,
    rerun_stale: bool,
    max_concurrent: int | None,
    num_cpus: int | None,
    quiet: bool,
    no_report: bool,
    wait_warning: float | None,
) -> None:
    """Run a study: every cell that has no result yet, resuming interrupted ones.

    Finished and diverged cells are kept as they are; failed ones only rerun with --rerun-failed.
    Ctrl-C stops cleanly; run the same command again to continue.

    \b
    Example:
        ablate run studies/quickstart.yaml
        ablate run study.yaml --address ray://head:10001 --tracking-uri http://mlflow:5000
    """
    from ..progress import WAIT_WARN_S
    from ..runner import run_study

    study = load(study_file, output, max_cells, tracking_uri)
    try:
        result = run_study(
            study,
            executor="ray" if executor == "ray" else "local",
            address=address,
            rerun_failed=rerun_failed,
            rerun_stale=rerun_stale,
            max_concurrent=max_concurrent,
            num_cpus=num_cpus,
            progress=not quiet,
            wait_warning_s=WAIT_WARN_S if wait_warning is None else wait_warning,
        )
    except AblateError as e:
        raise refuse(e) from None
    _print_cells(study, as_json=False)
    if result.interrupted:
        sys.exit(130)
    if not no_report:
        from ..report.study import report_study

        try:
            rep = report_study(study)
            click.echo(f"report: {rep.report_md} ({rep.report_html})", err=True)
        except AblateError as e:
            click.echo(f"no report: {e}", err=True)
    left = [p for p in result.planned if p.action == "failed"]  # failed before, not rerun now
    if result.failed or left:
        now = f"{len(result.failed)} cell(s) failed" if result.failed else ""
        before = f"{len(left)} cell(s) failed before and were left as they are" if left else ""
        again = f" --tracking-uri {tracking_uri}" if tracking_uri else ""
        click.echo(
            f"{'; '.join(x for x in (now, before) if x)}; see `ablate status {study_file}{again}` and "
            "rerun them with --rerun-failed",
            err=True,
        )
        sys.exit(1)


def _device_memory(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from ..train.memory import parse_size

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
) -> None:
    """Show the expanded cells and what `run` would do to each: run, resume, skip, failed.

    Also each configuration's memory estimate per device in its parallel mode (parameters,
    gradients, AdamW state, activations of one worker's micro-batch, bf16 weight copies, DDP's
    gradient buckets or FSDP's unsharded working set, +10% allowance; see ablate.train.memory),
    with a warning for those that exceed the device's memory: --device-memory, else the visible
    GPU's for cells that train on CUDA. Reads the study's MLflow store if there is one; creates
    nothing.

    \b
    Example:
        ablate plan studies/mxfp4_wgrad.yaml
        ablate plan study.yaml --device-memory 80GiB
    """
    from ..runner import plan as plan_study
    from ..runner import summarize

    study = load(study_file, output, max_cells, tracking_uri)
    _checks(study, address)
    planned = plan_study(study, rerun_failed=rerun_failed, rerun_stale=rerun_stale)
    mem = _memory_estimates(study, device_memory)
    if as_json:
        rows = [
            {
                "key": p.cell.key,
                "label": p.cell.label,
                "config": p.cell.config_label,
                "baseline": p.cell.baseline,
                "action": p.action,
                "why": p.why,
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
        click.echo(json.dumps({"study": study.name, "cells": rows}, indent=2, default=str))
        _memory_warnings(mem, planned)
        return
    click.echo(f"study {study.name}: {len(planned)} cells, axes: {', '.join(study.axes)}")
    width = max(len(p.cell.label) for p in planned)
    for p in planned:
        mark = " (baseline)" if p.cell.baseline else ""
        click.echo(f"  {p.cell.key}  {p.cell.label:{width}s}  {p.action:7s} {p.why}{mark}")
    click.echo("would: " + ", ".join(f"{a} {n}" for a, n in summarize(planned).items()))
    from ..train.memory import format_bytes

    click.echo("memory per device (estimate):")
    for (est, limit), cells in _by_estimate(mem, planned).items():
        configs = sorted({c.config_label for c in cells})
        shown = ", ".join(configs[:3]) + (
            f" and {len(configs) - 3} more" if len(configs) > 3 else ""
        )
        of = f" (device: {format_bytes(limit)})" if limit is not None else ""
        click.echo(f"  {len(cells)} cell(s) ({shown}): {est.short()}{of}")
    _memory_warnings(mem, planned)


def _checks(study: Study, address: str | None) -> None:
    """What validate and plan check: ``preflight_or_exit`` (all that `run` checks), except for a
    study whose cells ask for more GPUs than this machine has, without --address: such a study is
    for other machines (8-GPU cells planned on a laptop), so it is checked as a cluster's driver
    checks it, the study alone (tracking store, device numbering, the backends of its CPU cells),
    with a warning that `ablate run` refuses it here; this machine's devices and cores are not
    checked, and `run` still refuses it."""
    import torch

    from ..errors import CannotRunError, TrackingError
    from ..runner import check_devices, check_ray_devices, target_headroom
    from ..tracking import check_store
    from ..train.config import device_kind

    res = study.spec.resources
    need, have = res.gpus * res.workers, torch.cuda.device_count()
    if address or need <= have:
        preflight_or_exit(study, address)
        return
    # resources.gpus > 0 here, so check_gpus (cells that need a GPU but get none) has nothing to say
    try:
        try:
            check_store(study.tracking_uri)
        except TrackingError as e:
            raise CannotRunError(str(e)) from None
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


def _memory_estimates(
    study: Study, device_memory: int | None
) -> dict[str, tuple[MemoryEstimate, int | None]]:
    """Each cell's estimate and the memory of the device it trains on (None: unknown)."""
    from ..train.config import device_kind
    from ..train.memory import estimate_run, visible_device_memory

    out: dict[str, tuple[MemoryEstimate, int | None]] = {}
    for cell in study.cells:
        kind = device_kind(cell.config.device)
        limit = device_memory
        if limit is None and kind == "cuda":
            limit = visible_device_memory()
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
    from ..train.memory import format_bytes

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

    Runs every check `ablate run` makes before it starts: the spec, the data (found, and large
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
    from ..spec import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@click.command()
@study_arg
@output_opt
@max_cells_opt
@tracking_uri_opt()
@click.option("--yes", is_flag=True, help="Adopt without asking.")
def adopt(
    study_file: str, output: str | None, max_cells: int, tracking_uri: str | None, yes: bool
) -> None:
    """Adopt a study's runs recorded before cell keys named the device and precision.

    Re-tags each such run with its cell's new key (and moves its checkpoint), so that `run`
    skips or resumes it instead of training it again. This asserts that the old runs trained
    on the device kind and precision the study now resolves to; if not, let them rerun.

    \b
    Example:
        ablate adopt studies/quickstart.yaml
    """
    from ..errors import TrackingError
    from ..runner import study_lock
    from ..tracking import StudyTracker
    from ..tracking.adopt import adopt as adopt_runs
    from ..tracking.adopt import adoptable
    from ..train.config import device_kind, resolved_precision

    study = load(study_file, output, max_cells, tracking_uri)
    try:
        with study_lock(study.output_dir), contextlib.ExitStack() as held:
            tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
            out = study.output_dir.resolve()
            held.enter_context(tracker.driver_lock("run", command="ablate adopt", output=out))
            found = adoptable(study, tracker)
            if not found:
                click.echo(f"{study.name}: no run recorded under an old key; nothing to adopt")
                return
            for a in found:
                kind = device_kind(a.cell.config.device)
                prec = resolved_precision(a.cell.config.train.precision, kind)
                ck = ", checkpoint" if a.checkpoint else ""
                click.echo(
                    f"  {a.old_key} -> {a.cell.key}  {a.cell.label}  ({a.status}{ck}; "
                    f"asserted {kind}/{prec})"
                )
            if not yes and not click.confirm(f"adopt these {len(found)} runs?", default=False):
                raise SystemExit(1)
            adopt_runs(study, tracker, found)
            click.echo(f"adopted {len(found)} runs")
    except (AblateError, TrackingError) as e:
        raise refuse(e) from None


@click.command()
@study_arg
@output_opt
@max_cells_opt
@tracking_uri_opt()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(
    study_file: str, output: str | None, max_cells: int, tracking_uri: str | None, as_json: bool
) -> None:
    """Show each cell's state from the study's MLflow store: status, step, last validation ppl.

    \b
    Example:
        ablate status studies/quickstart.yaml
        ablate status study.yaml --tracking-uri http://mlflow:5000
    """
    study = load(study_file, output, max_cells, tracking_uri)
    _print_cells(study, as_json=as_json)


def _print_cells(study: Study, *, as_json: bool) -> None:
    from ..tracking import StudyTracker, study_status
    from ..tracking.status import count

    try:
        statuses = study_status(study)
    except AblateError as e:
        if as_json:
            click.echo(json.dumps({"study": study.name, "error": str(e), "cells": []}))
        else:
            click.echo(f"{study.name}: nothing recorded yet ({e})")
        return
    from ..runner import driver_running, stale

    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    latest = tracker.latest_metrics([cs.run.run_id for cs in statuses if cs.run])
    # a cell left running or pending by a driver that is gone (killed, machine lost) is abandoned,
    # unless a driver from another output folder runs the study now (its lock in the store)
    gone = driver_running(study.output_dir) is False and not tracker.drivers("run")
    rows: list[dict[str, Any]] = []
    for cs in statuses:
        c, r = cs.cell, cs.run
        m = latest.get(r.run_id, {}) if r else {}
        rows.append(
            {
                "key": c.key,
                "label": c.label,
                "status": "abandoned"
                if gone and cs.status in ("running", "pending")
                else cs.status,
                "step": m.get("train_loss", (None, None))[0],
                "steps": c.config.train.steps,
                "val_ppl": m.get("val_ppl", (None, None))[1],
                "tokens_per_s": m.get("tokens_per_s", (None, None))[1],
                "run_id": r.run_id if r else None,
                "stale": stale(r) if r and cs.status in ("finished", "diverged") else "",
            }
        )
    if as_json:
        click.echo(json.dumps({"study": study.name, "cells": rows}, indent=2))
        return
    width = max(len(row["label"]) for row in rows)
    for row in rows:
        step = f"{row['step'] or 0}/{row['steps']}"
        ppl = f"{row['val_ppl']:.3f}" if row["val_ppl"] is not None else "-"
        tps = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] is not None else "-"
        mark = "  stale" if row["stale"] else ""
        click.echo(
            f"{row['label']:{width}s}  {row['status']:11s} step {step:>11s}  val ppl {ppl:>8s}  "
            f"tok/s {tps}{mark}"
        )
    counts = count([row["status"] for row in rows])
    click.echo(", ".join(f"{n} {s}" for s, n in counts.items()))
    n_stale = sum(bool(row["stale"]) for row in rows)
    if n_stale:
        click.echo(
            f"{n_stale} result(s) are stale: other training code produced them (env.code_hash); "
            "`ablate run --rerun-stale` trains them again in new runs"
        )
    if counts.get("abandoned"):
        click.echo(
            f"{counts['abandoned']} cell(s) were running when their driver stopped (no `ablate "
            "run` holds the study); run the study again to resume them"
        )


@click.command()
@click.argument("study_file", metavar="STUDY.yaml", required=False, type=click.Path(dir_okay=False))
@output_opt
@tracking_uri_opt(
    "Browse this store instead of a study's; an http(s) server is not started, only linked."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Server worker processes (each holds ~300 MB; one serves a person browsing).",
)
@click.option(
    "--timeout", default=120.0, show_default=True, help="Seconds to wait for the UI to answer."
)
@click.option("--study", "study_name", default=None, help="With --tracking-uri: the study to open.")
def ui(
    study_file: str | None,
    output: str | None,
    tracking_uri: str | None,
    host: str,
    port: int,
    workers: int,
    timeout: float,
    study_name: str | None,
) -> None:
    """Open the MLflow UI on a study's store, at the study's runs table.

    Starts `mlflow server` on the study's SQLite store (bound to 127.0.0.1 unless --host says
    otherwise, one worker, no job runner), waits until it answers and prints the URL of the study's
    runs. With --tracking-uri http(s)://... the server is already running: the URL is printed.

    \b
    Example:
        ablate ui studies/quickstart.yaml      # then open the printed URL
        ablate ui --tracking-uri http://mlflow-host:5000 --study mxfp4_wgrad
    """
    from ..tracking.ui import serve, study_url

    study = None
    if tracking_uri is None:
        if study_file is None:
            raise click.UsageError("give a STUDY.yaml or --tracking-uri")
        study = load(study_file, output)
        tracking_uri = study.tracking_uri
        db = tracking_uri.removeprefix("sqlite:///")
        if tracking_uri.startswith("sqlite:///") and not Path(db).exists():
            raise click.ClickException(
                f"{db}: no MLflow store yet; run `ablate run {study_file}` first"
            )
    elif study_file is not None:
        study = load(study_file, output)
    name = (study.experiment or study.name) if study is not None else study_name
    axes = study.axes if study is not None else []
    try:
        if tracking_uri.startswith(("http://", "https://")):
            click.echo(study_url(tracking_uri, tracking_uri, name, axes=axes))
            return
        status = serve(
            tracking_uri,
            host=host,
            port=port,
            workers=workers,
            timeout=timeout,
            experiment=name,
            axes=axes,
            echo=lambda m: click.echo(m, err=True),
        )
    except AblateError as e:
        raise click.ClickException(str(e)) from None
    sys.exit(status)
