"""The result commands: ``report`` (tokens to target, figures) and ``tune`` (Optuna searches)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ablate.cli.common import (
    SpecProblem,
    address_opt,
    check_tracking_uri,
    executor_opt,
    load,
    max_cells_opt,
    output_opt,
    refuse,
    study_arg,
    tracking_uri_opt,
)
from ablate.errors import AblateError


@click.command()
@click.argument("study_file", metavar="STUDY.yaml", required=False, type=click.Path(dir_okay=False))
@click.option(
    "-o", "--out", "out_dir", default=None, help="Report folder (default: reports/<study>/)."
)
@click.option("--runs", default=None, help="The study's output folder, if not its default.")
@tracking_uri_opt("Read this MLflow store instead of the study's.")
@click.option("--study", "study_name", default=None, help="With --tracking-uri and no STUDY.yaml.")
@max_cells_opt
@click.option(
    "--no-attach", is_flag=True, help="Do not attach the report to the parent MLflow run."
)
@click.option(
    "--no-titles", is_flag=True, help="Figures without titles (a paper's captions carry them)."
)
@click.option(
    "--mix-numerics",
    is_flag=True,
    help="Compare runs of two numerics versions (refused otherwise; the report says so).",
)
@click.option(
    "--mix-data",
    is_flag=True,
    help="Compare cells of one data configuration that trained on other tokens (their "
    "data.fingerprint differs: a corpus changed between their runs; refused otherwise; the "
    "report says so).",
)
def report(
    study_file: str | None,
    out_dir: str | None,
    runs: str | None,
    tracking_uri: str | None,
    study_name: str | None,
    max_cells: int,
    no_attach: bool,
    no_titles: bool,
    mix_numerics: bool,
    mix_data: bool,
) -> None:
    """Tokens to target per configuration, relative cost, projected speedup and convergence plots.

    Writes report.md, a self-contained report.html, summary.csv and PNG/SVG figures.

    \b
    Example:
        ablate report studies/quickstart.yaml            # -> reports/quickstart/
        ablate report --tracking-uri http://mlflow:5000 --study mxfp4_wgrad -o out/
    """
    from ablate.errors import TrackingError
    from ablate.report.ladder.render import LadderResult
    from ablate.report.study import report_folder, report_study
    from ablate.report.verdict import cost_and_speedup, verdict
    from ablate.study import parse_study
    from ablate.study.loader import parse_yaml
    from ablate.tracking import read_study_text
    from ablate.tracking.runs import check_study
    from ablate.tracking.store import sqlite_path

    if study_file is not None and study_name is not None:
        raise click.UsageError("--study goes with --tracking-uri and no STUDY.yaml")
    if study_file is None and runs is not None:
        raise click.UsageError("--runs goes with a STUDY.yaml (it is that study's output folder)")
    if study_file is not None:
        study = load(study_file, runs, max_cells, tracking_uri)
    elif tracking_uri and study_name:
        check_tracking_uri(tracking_uri)
        try:
            check_study(tracking_uri, study_name)
        except TrackingError as e:  # not in the store: refused before anything is written
            raise SpecProblem(f"--study: {e}") from None
        kept = f"the study.yaml kept for study {study_name} in {tracking_uri}"
        try:
            text = read_study_text(tracking_uri, study_name)
            study = parse_study(
                parse_yaml(text, kept),
                text=text,
                source=kept,
                check_files=False,
                max_cells=max_cells,
            )
        except AblateError as e:
            raise refuse(e) from None
        if study.experiment != study_name:
            raise SpecProblem(
                f"--study: {kept} is study {study.name!r} (MLflow experiment "
                f"{study.experiment!r}), not this one; nothing was written: report it with its "
                "study file"
            )
        study.file.tracking.uri = tracking_uri
        if (db := sqlite_path(tracking_uri)) is not None:  # its folder: where -o may not go
            study.output_dir = db.parent
    else:
        raise click.UsageError("give a STUDY.yaml, or --tracking-uri and --study")
    try:
        report_folder(study, out_dir)
    except AblateError as e:  # refused before anything is read or written
        raise SpecProblem(str(e)) from None
    try:
        rep = report_study(
            study,
            out_dir,
            attach=not no_attach,
            titles=not no_titles,
            mix_numerics=mix_numerics,
            mix_data=mix_data,
        )
    except AblateError as e:
        raise refuse(e) from None
    click.echo(rep.report_md)
    if isinstance(rep, LadderResult):
        _echo_ladder(rep)
        return
    t = rep.config_table
    click.echo(f"target: val ppl {rep.target_ppl:.4g}", err=True)
    for r in t.to_dict("records"):
        reached = f"{r['seeds_reached']}/{r['seeds_total']} reached"
        if r["baseline"]:
            click.echo(f"  {r['config']:40s} {reached:12s} baseline", err=True)
            continue
        cost, speed = cost_and_speedup(r)
        click.echo(
            f"  {r['config']:40s} {reached:12s} {verdict(r)[0]:17s} tokens {cost:28s} "
            f"speedup {speed}",
            err=True,
        )


def _echo_ladder(rep: Any) -> None:
    """A ladder's prediction, one line per configuration (stderr)."""
    rows = rep.table[rep.table["method"] == "sloped"]
    if rows.empty:
        click.echo("ladder: no prediction (no ladder.predict, or no fit)", err=True)
    for r in rows.to_dict("records"):
        click.echo(
            f"  {r['config']:40s} token ratio {r['token_ratio']:.3g} "
            f"[{r['ratio_lo']:.3g}, {r['ratio_hi']:.3g}] at N*={r['target_params']:.3g}, "
            f"D*={r['target_tokens']:.3g}; reachable: {r['reachable']}; "
            f"back-test covered: {r['backtest_covered']}",
            err=True,
        )


@click.command()
@study_arg
@output_opt
@max_cells_opt
@executor_opt("trial (a pruned one is cancelled)")
@address_opt
@tracking_uri_opt()
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
    max_cells: int,
    executor: str,
    address: str | None,
    tracking_uri: str | None,
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
    from ablate.errors import TuneError
    from ablate.tune import format_summary, run_tune, tune_spec

    study = load(study_file, output, max_cells, tracking_uri)
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
        raise refuse(e) from None
    click.echo(format_summary(result.summary))
    if result.best_path is not None:
        click.echo(f"best parameters per search: {result.best_path}", err=True)
    if result.interrupted:
        sys.exit(130)
