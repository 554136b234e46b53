"""The ``ablate`` command line: a thin click layer over the library.

Status goes to stderr, results to stdout, ``--json`` where a machine reads the output. The library
raises ``ablate.errors.AblateError``s; here a ``SpecError`` exits with status 2 (a usage error,
before anything starts) and any other with status 1, its message printed as it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from backends.recipe import GEMMS, OPERANDS, Recipe

from . import __version__
from .errors import AblateError, SpecError
from .spec import Study, load_study


class SpecProblem(click.ClickException):
    """A study that cannot run: exit status 2, like any usage error, before anything starts."""

    exit_code = 2


def _load(path: str, output: str | None = None) -> Study:
    try:
        study = load_study(path, output=output)
    except SpecError as e:
        raise SpecProblem(str(e)) from None
    for note in study.notes:
        click.echo(f"note: {note}", err=True)
    return study


study_arg = click.argument("study_file", metavar="STUDY.yaml", type=click.Path(dir_okay=False))
output_opt = click.option(
    "-o", "--output", default=None, help="Output folder (default: the study's output, runs/<name>)."
)


@click.group()
@click.version_option(__version__, prog_name="ablate")
def main() -> None:
    """Controlled ablation studies of FP4 (MXFP4, NVFP4) and FP8 training recipes."""


@main.command()
@click.option(
    "--fp4",
    "fp4_gemms",
    default="",
    help="Comma-separated GEMMs in FP4: fprop, dgrad, wgrad (empty: none).",
)
@click.option("--intervention", default="none", show_default=True, help="none, sr, rht, dht, ...")
@click.option("--format", "fp4_format", default="mxfp4", show_default=True, help="mxfp4 or nvfp4.")
@click.option("--base", default="bf16", show_default=True, help="Other GEMMs: bf16, fp8, mxfp8.")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved recipe as JSON.")
def recipe(fp4_gemms: str, intervention: str, fp4_format: str, base: str, as_json: bool) -> None:
    """Show what a recipe shorthand resolves to, operand by operand.

    \b
    Example:
        ablate recipe --fp4 fprop,dgrad,wgrad --intervention dht --base fp8
    """
    gemms = [g.strip() for g in fp4_gemms.split(",") if g.strip()]
    try:
        r = Recipe.from_shorthand(gemms, intervention, fp4_format=fp4_format, base=base)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    if as_json:
        click.echo(json.dumps(r.to_dict(), indent=2))
        return
    click.echo(r.short())
    for g in GEMMS:
        gr = r.gemm(g)
        a_op, b_op = OPERANDS[g]
        a = gr.a.short() if gr.a else "bf16"
        b = gr.b.short() if gr.b else "bf16"
        had = f"  hadamard={gr.hadamard.short()}" if gr.hadamard else ""
        click.echo(f"  {g:6s} {a_op + '=' + a:22s} {b_op + '=' + b:22s}{had}".rstrip())


@main.command()
@study_arg
@output_opt
@click.option(
    "--executor",
    type=click.Choice(["ray", "local"]),
    default="ray",
    show_default=True,
    help="ray: each cell a Ray task; local: one after another in this process.",
)
@click.option(
    "--address",
    default=None,
    envvar="RAY_ADDRESS",
    help="An existing Ray cluster (ray://host:10001 or host:6379); default: start Ray locally.",
)
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (overrides the study's).")
@click.option("--rerun-failed", is_flag=True, help="Run cells that failed before again.")
@click.option("--max-concurrent", type=int, default=None, help="At most N cells at once.")
@click.option("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--no-report", is_flag=True, help="Do not write the report when the study ends.")
def run(
    study_file: str,
    output: str | None,
    executor: str,
    address: str | None,
    tracking_uri: str | None,
    rerun_failed: bool,
    max_concurrent: int | None,
    num_cpus: int | None,
    quiet: bool,
    no_report: bool,
) -> None:
    """Run a study: every cell that has no result yet, resuming interrupted ones.

    Finished and diverged cells are kept as they are; failed ones only rerun with --rerun-failed.
    Ctrl-C stops cleanly; run the same command again to continue.

    \b
    Example:
        ablate run studies/quickstart.yaml
        ablate run study.yaml --address ray://head:10001 --tracking-uri http://mlflow:5000
    """
    from .runner import run_study

    study = _load(study_file, output)
    if tracking_uri:
        study.spec.tracking.uri = tracking_uri
    try:
        result = run_study(
            study,
            executor="ray" if executor == "ray" else "local",
            address=address,
            rerun_failed=rerun_failed,
            max_concurrent=max_concurrent,
            num_cpus=num_cpus,
            progress=not quiet,
        )
    except AblateError as e:
        raise click.ClickException(str(e)) from None
    _print_cells(study, as_json=False)
    if result.interrupted:
        sys.exit(130)
    if not no_report:
        from .report.study import report_study

        try:
            rep = report_study(study)
            click.echo(f"report: {rep.report_md} ({rep.report_html})", err=True)
        except AblateError as e:
            click.echo(f"no report: {e}", err=True)
    if result.failed:
        click.echo(
            f"{len(result.failed)} cell(s) failed; see `ablate status {study_file}` and rerun them "
            "with --rerun-failed",
            err=True,
        )
        sys.exit(1)


@main.command()
@study_arg
@output_opt
@click.option("--rerun-failed", is_flag=True, help="Plan as `run --rerun-failed` would.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan(study_file: str, output: str | None, rerun_failed: bool, as_json: bool) -> None:
    """Show the expanded cells and what `run` would do to each: run, resume, skip, failed.

    Reads the study's MLflow store if there is one; creates nothing.

    \b
    Example:
        ablate plan studies/mxfp4_wgrad.yaml
    """
    from .runner import check_devices, summarize
    from .runner import plan as plan_study

    study = _load(study_file, output)
    try:
        check_devices(study)
    except AblateError as e:
        raise click.ClickException(
            f"{e}\n(plan checks this machine's device; on a cluster, `ablate run --address` checks the workers')"
        ) from None
    planned = plan_study(study, rerun_failed=rerun_failed)
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
            }
            for p in planned
        ]
        click.echo(json.dumps({"study": study.name, "cells": rows}, indent=2, default=str))
        return
    click.echo(f"study {study.name}: {len(planned)} cells, axes: {', '.join(study.axes)}")
    width = max(len(p.cell.label) for p in planned)
    for p in planned:
        mark = " (baseline)" if p.cell.baseline else ""
        click.echo(f"  {p.cell.key}  {p.cell.label:{width}s}  {p.action:7s} {p.why}{mark}")
    click.echo("would: " + ", ".join(f"{a} {n}" for a, n in summarize(planned).items()))


@main.command()
@study_arg
@output_opt
def validate(study_file: str, output: str | None) -> None:
    """Check a study without running anything (exit status 2 and every problem when invalid).

    \b
    Example:
        ablate validate studies/quickstart.yaml
    """
    study = _load(study_file, output)
    configs = {c.config_label for c in study.cells}
    base = study.baseline_cells[0].config_label if study.baseline_cells else "none"
    click.echo(
        f"ok: {study.name}: {len(study.cells)} cells, {len(configs)} configurations, "
        f"axes {', '.join(study.axes)}; baseline {base}"
    )


@main.command()
def schema() -> None:
    """Print the JSON Schema of a study file (for editors and validators).

    \b
    Example:
        ablate schema > study.schema.json
    """
    from .spec import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@main.command()
@study_arg
@output_opt
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(study_file: str, output: str | None, as_json: bool) -> None:
    """Show each cell's state from the study's MLflow store: status, step, last validation ppl.

    \b
    Example:
        ablate status studies/quickstart.yaml
    """
    study = _load(study_file, output)
    _print_cells(study, as_json=as_json)


def _print_cells(study: Study, *, as_json: bool) -> None:
    from .tracking import StudyTracker, study_status
    from .tracking.status import count

    try:
        statuses = study_status(study)
    except AblateError as e:
        if as_json:
            click.echo(json.dumps({"study": study.name, "error": str(e), "cells": []}))
        else:
            click.echo(f"{study.name}: nothing recorded yet ({e})")
        return
    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    latest = tracker.latest_metrics([cs.run.run_id for cs in statuses if cs.run])
    rows: list[dict[str, Any]] = []
    for cs in statuses:
        c, r = cs.cell, cs.run
        m = latest.get(r.run_id, {}) if r else {}
        rows.append(
            {
                "key": c.key,
                "label": c.label,
                "status": cs.status,
                "step": m.get("train_loss", (None, None))[0],
                "steps": c.config.train.steps,
                "val_ppl": m.get("val_ppl", (None, None))[1],
                "tokens_per_s": m.get("tokens_per_s", (None, None))[1],
                "run_id": r.run_id if r else None,
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
        click.echo(
            f"{row['label']:{width}s}  {row['status']:11s} step {step:>11s}  val ppl {ppl:>8s}  tok/s {tps}"
        )
    click.echo(", ".join(f"{n} {s}" for s, n in count([row["status"] for row in rows]).items()))


@main.command()
@click.argument("study_file", metavar="STUDY.yaml", required=False, type=click.Path(dir_okay=False))
@output_opt
@click.option("--tracking-uri", default=None, help="Browse this store instead of a study's.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=5000, show_default=True, type=int)
def ui(
    study_file: str | None, output: str | None, tracking_uri: str | None, host: str, port: int
) -> None:
    """Open the MLflow UI on a study's store (bound to 127.0.0.1 unless --host says otherwise).

    \b
    Example:
        ablate ui studies/quickstart.yaml      # then browse http://127.0.0.1:5000
    """
    import os
    import shutil

    if tracking_uri is None:
        if study_file is None:
            raise click.UsageError("give a STUDY.yaml or --tracking-uri")
        study = _load(study_file, output)
        tracking_uri = study.tracking_uri
        db = tracking_uri.removeprefix("sqlite:///")
        if tracking_uri.startswith("sqlite:///") and not Path(db).exists():
            raise click.ClickException(
                f"{db}: no MLflow store yet; run `ablate run {study_file}` first"
            )
    exe = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    cmd = [exe, "ui", "--backend-store-uri", tracking_uri, "--host", host, "--port", str(port)]
    click.echo(f"MLflow UI on http://{host}:{port} (Ctrl-C to stop)", err=True)
    os.execv(exe, cmd)


@main.command()
@click.argument("study_file", metavar="STUDY.yaml", required=False, type=click.Path(dir_okay=False))
@click.option(
    "-o", "--out", "out_dir", default=None, help="Report folder (default: reports/<study>/)."
)
@click.option("--runs", default=None, help="The study's output folder, if not its default.")
@click.option("--tracking-uri", default=None, help="Read this MLflow store instead of the study's.")
@click.option("--study", "study_name", default=None, help="With --tracking-uri and no STUDY.yaml.")
@click.option(
    "--no-attach", is_flag=True, help="Do not attach the report to the parent MLflow run."
)
def report(
    study_file: str | None,
    out_dir: str | None,
    runs: str | None,
    tracking_uri: str | None,
    study_name: str | None,
    no_attach: bool,
) -> None:
    """Tokens to target per configuration, relative cost, projected speedup and convergence plots.

    Writes report.md, a self-contained report.html, summary.csv and PNG/SVG figures.

    \b
    Example:
        ablate report studies/quickstart.yaml            # -> reports/quickstart/
        ablate report --tracking-uri http://mlflow:5000 --study mxfp4_wgrad -o out/
    """
    from .report.study import report_study
    from .spec import parse_study
    from .tracking import read_study_text

    if study_file is not None:
        study = _load(study_file, runs)
        if tracking_uri:
            study.spec.tracking.uri = tracking_uri
    elif tracking_uri and study_name:
        try:
            text = read_study_text(tracking_uri, study_name)
            study = parse_study(yaml.safe_load(text), text=text, check_files=False)
        except AblateError as e:
            raise click.ClickException(str(e)) from None
        study.spec.tracking.uri = tracking_uri
    else:
        raise click.UsageError("give a STUDY.yaml, or --tracking-uri and --study")
    try:
        rep = report_study(study, out_dir, attach=not no_attach)
    except AblateError as e:
        raise click.ClickException(str(e)) from None
    click.echo(rep.report_md)
    t = rep.config_table
    click.echo(f"target: val ppl {rep.target_ppl:.4g}", err=True)
    for _, r in t.iterrows():
        reached = f"{r['n_reached']}/{r['n_seeds']} reached"
        cost = (
            f"{r['rel_token_cost']:+.1%} tokens"
            if r["rel_token_cost"] == r["rel_token_cost"]
            else "-"
        )
        sp = r["projected_speedup"]
        speed = f"speedup x{sp:.3f} ({r['speedup_source']})" if sp == sp else ""
        click.echo(f"  {r['config']:40s} {reached:12s} {cost:14s} {speed}", err=True)


@main.command()
@study_arg
@output_opt
@click.option(
    "--executor",
    type=click.Choice(["ray", "local"]),
    default="ray",
    show_default=True,
    help="ray: each trial a Ray task (pruned ones are cancelled); local: one at a time in this process.",
)
@click.option(
    "--address",
    default=None,
    envvar="RAY_ADDRESS",
    help="An existing Ray cluster (ray://host:10001 or host:6379); default: start Ray locally.",
)
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=None,
    help="Trials per search in total, done ones included (overrides tune.trials).",
)
@click.option("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all).")
def tune(
    study_file: str,
    output: str | None,
    executor: str,
    address: str | None,
    trials: int | None,
    num_cpus: int | None,
) -> None:
    """Search the study's `tune:` space with Optuna, one search per group of cells.

    Trials run like cells (Ray tasks or in this process) and appear in the study's MLflow
    experiment as child runs tagged ablate.role=trial. The Optuna storage is <output>/optuna.db;
    running the command again continues each search up to its trial count. Prints the best
    parameters per search and writes them to <output>/tune/best.yaml as a study grid.

    \b
    Example:
        ablate tune studies/tune_lr.yaml --executor local
        ablate tune studies/tune_lr.yaml --trials 12      # continue to 12 trials per search
    """
    from .errors import TuneError
    from .tune import format_summary, run_tune, tune_spec

    study = _load(study_file, output)
    try:
        tune_spec(study)
    except TuneError as e:
        raise SpecProblem(str(e)) from None
    try:
        result = run_tune(
            study,
            executor="ray" if executor == "ray" else "local",
            address=address,
            trials=trials,
            num_cpus=num_cpus,
        )
    except AblateError as e:
        raise click.ClickException(str(e)) from None
    click.echo(format_summary(result.summary))
    if result.best_path is not None:
        click.echo(f"best parameters per search: {result.best_path}", err=True)
    if result.interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
