"""The commands that run a study and look at its runs: ``run``, ``status``, ``adopt`` (runs
recorded under an older key, taken over knowingly) and ``ui`` (the MLflow UI on the study's store)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from ablate.cli.common import (
    FiniteRange,
    SpecProblem,
    address_opt,
    executor_opt,
    load,
    max_cells_opt,
    output_opt,
    refuse,
    study_arg,
    tracking_uri_opt,
)
from ablate.errors import AblateError, DamagedStoreError
from ablate.study import Study


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
    "(env.code_hash differs), and finished or interrupted ones whose data now prepare to other "
    "tokens (data.fingerprint differs); the old runs are kept.",
)
@click.option("--max-concurrent", type=int, default=None, help="At most N cells at once.")
@click.option("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--no-report", is_flag=True, help="Do not write the report when the study ends.")
@click.option(
    "--wait-warning",
    type=FiniteRange(min=0),
    default=None,
    metavar="SECONDS",
    help="On Ray: say which cell has not started this long after it was submitted while the "
    "study's own running cells do not hold what it needs (something else does, or no node has "
    "room), with what it asks for and what the cluster has free (default: 60; 0: never).",
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
    from ablate.driver.progress import WAIT_WARN_S
    from ablate.driver.runner import run_study

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
        from ablate.report.study import report_study

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


@click.command()
@study_arg
@output_opt
@max_cells_opt
@tracking_uri_opt()
@click.option("--yes", is_flag=True, help="Adopt without asking.")
def adopt(
    study_file: str, output: str | None, max_cells: int, tracking_uri: str | None, yes: bool
) -> None:
    """Adopt a study's runs recorded under an older key, knowingly.

    A cell's key changed when keys came to name the device kind and precision, and changes at
    every bump of the numerics version (the numbers the code computes). Adopting re-tags each
    run found under a cell's older key with its current key (and moves its checkpoint), so that
    `run` skips or resumes it instead of training it again. It asserts that the old runs trained
    on the device kind and precision the study now resolves to. A run of an older numerics
    version keeps its version: `report` then refuses to compare it with newer runs unless given
    --mix-numerics; only runs that ended are adopted across numerics (an unfinished one would
    resume with other numerics), the others run again.

    \b
    Example:
        ablate adopt studies/quickstart.yaml
    """
    from ablate.driver.setup import study_lock
    from ablate.errors import TrackingError
    from ablate.numerics import NUMERICS_VERSION
    from ablate.tracking import StudyTracker
    from ablate.tracking.adopt import adopt as adopt_runs
    from ablate.tracking.adopt import adoptable
    from ablate.tracking.store import sqlite_path
    from ablate.train.config import device_kind, resolved_precision

    study = load(study_file, output, max_cells, tracking_uri)
    db = sqlite_path(study.tracking_uri)
    if db is not None and not db.is_file():  # nothing recorded there: nothing made either
        click.echo(f"{study.name}: no MLflow store at {db}; nothing to adopt")
        return
    try:
        with study_lock(study.output_dir), contextlib.ExitStack() as held:
            tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
            out = study.output_dir.resolve()
            held.enter_context(tracker.driver_lock("run", command="ablate adopt", output=out))
            found, rerun = adoptable(study, tracker)
            for a in rerun:
                click.echo(
                    f"  not adopted: {a.cell.label} ({a.status} under numerics {a.numerics}: "
                    f"resumed now it would mix two numerics in one run; it runs again)"
                )
            if not found:
                click.echo(f"{study.name}: no run recorded under an old key; nothing to adopt")
                return
            for a in found:
                kind = device_kind(a.cell.config.device)
                prec = resolved_precision(a.cell.config.train.precision, kind)
                ck = ", checkpoint" if a.checkpoint else ""
                click.echo(
                    f"  {a.old_key} -> {a.cell.key}  {a.cell.label}  ({a.status}{ck}; "
                    f"numerics {a.numerics}; asserted {kind}/{prec})"
                )
            older = sum(a.numerics != NUMERICS_VERSION for a in found)
            if older:
                click.echo(
                    f"  {older} of these trained with older numerics than this code's "
                    f"({NUMERICS_VERSION}); they keep their version, and `ablate report` compares "
                    "them with newer runs only with --mix-numerics"
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


def _waves(study: Study, runs: Any) -> Any:
    """A sequential study's waves replayed from its store (``report.waves.replay``) with its
    ``runs`` by key as already read, or None."""
    if study.sequential is None:
        return None
    from ablate.report.waves import cell_rows, replay

    return replay(study, cell_rows(study, runs))


def _print_cells(study: Study, *, as_json: bool) -> None:
    from ablate.tracking import StudyTracker, join_runs, read_cells, shared_order_note
    from ablate.tracking.status import count

    try:  # read once: the shared-order note below looks up keys the study's cells no longer have
        runs = {
            r.key: r
            for r in read_cells(study.tracking_uri, study.name, experiment=study.experiment)
        }
        statuses = join_runs(study, runs)
        waves = _waves(study, runs)
    except DamagedStoreError as e:  # not "nothing recorded": the records are there, unreadable
        raise refuse(e) from None
    except AblateError as e:
        if as_json:
            click.echo(json.dumps({"study": study.name, "error": str(e), "cells": []}))
        else:
            click.echo(f"{study.name}: nothing recorded yet ({e})")
        return
    from ablate.driver.planning import data_changed, stale
    from ablate.driver.setup import driver_running

    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    latest = tracker.latest_metrics([cs.run.run_id for cs in statuses if cs.run])
    # a cell left running or pending by a driver that is gone (killed, machine lost) is abandoned,
    # unless a driver from another output folder runs the study now (its lock in the store)
    gone = driver_running(study.output_dir) is False and not tracker.drivers("run")
    changed = data_changed(study, statuses)
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
                "data_changed": changed[c.key].said() if c.key in changed else "",
                "data_tokens_changed": c.key in changed and changed[c.key].tokens,
            }
        )
    if waves is not None:  # sequential seeds: the cells its waves asked for, and their verdicts
        asked = {c.key for c in waves.cells}
        rows = [row for row in rows if row["key"] in asked]
    if as_json:
        doc: dict[str, Any] = {"study": study.name, "cells": rows}
        if waves is not None:
            doc["comparisons"] = {
                c.config: {"state": c.judgement.state, "seeds": c.seeds, "pairs": c.judgement.pairs}
                for c in waves.judged.values()
            }
        click.echo(json.dumps(doc, indent=2))
        return
    width = max(len(row["label"]) for row in rows)
    for row in rows:
        step = f"{row['step'] or 0}/{row['steps']}"
        ppl = f"{row['val_ppl']:.3f}" if row["val_ppl"] is not None else "-"
        tps = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] is not None else "-"
        mark = "  stale" if row["stale"] else ""
        if row["data_changed"]:
            mark += "  data changed" if row["data_tokens_changed"] else "  data files changed"
        click.echo(
            f"{row['label']:{width}s}  {row['status']:11s} step {step:>11s}  val ppl {ppl:>8s}  "
            f"tok/s {tps}{mark}"
        )
    counts = count([row["status"] for row in rows])
    click.echo(", ".join(f"{n} {s}" for s, n in counts.items()))
    if waves is not None:
        where = "done" if waves.done else f"wave {waves.waves + 1} under way or to run"
        click.echo(f"sequential seeds: {waves.waves} wave(s) judged, {where}")
        for comp in waves.judged.values():
            click.echo(f"  {comp.line()}")
    if note := shared_order_note(study, runs):
        click.echo(note.strip())
    n_stale = sum(bool(row["stale"]) for row in rows)
    if n_stale:
        click.echo(
            f"{n_stale} result(s) are stale: other training code produced them (env.code_hash); "
            "`ablate run --rerun-stale` trains them again in new runs"
        )
    if n_data := sum(bool(row["data_tokens_changed"]) for row in rows):
        click.echo(
            f"{n_data} cell(s) trained on other data than theirs prepare to now (data "
            "changed): `ablate plan` names the field; `ablate run --rerun-stale` trains them "
            "again in new runs"
        )
    if n_files := sum(bool(row["data_changed"]) and not row["data_tokens_changed"] for row in rows):
        click.echo(
            f"{n_files} cell(s)' data files changed since they trained (data files changed): "
            "whether their tokens did is known once they are prepared (`ablate data prepare`)"
        )
    if counts.get("abandoned"):
        click.echo(
            f"{counts['abandoned']} cell(s) were running when their driver stopped (no `ablate "
            "run` holds the study); run the study again to resume them"
        )


MAX_UI_WORKERS = 64
"""The most ``ablate ui --workers``: server workers are mostly idle, so the CPUs are no bound, but
each is a process of about 300 MB."""


def _at_most_ui_workers(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value > MAX_UI_WORKERS:
        raise click.BadParameter(
            f"{value} server workers is more than {MAX_UI_WORKERS}: each is a process of about "
            "300 MB, and one serves a person browsing",
            ctx,
            param,
        )
    return value


@click.command()
@click.argument("study_file", metavar="STUDY.yaml", required=False, type=click.Path(dir_okay=False))
@output_opt
@tracking_uri_opt(
    "Browse this store instead of a study's; an http(s) server is not started, only linked."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind: one of this machine's (0.0.0.0: every interface).",
)
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    callback=_at_most_ui_workers,
    help=f"Server worker processes (each holds ~300 MB; one serves a person browsing; at most "
    f"{MAX_UI_WORKERS}).",
)
@click.option(
    "--timeout",
    type=FiniteRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds to wait for the UI to answer.",
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
    from ablate.tracking.ui import check_browsable, check_host, serve, study_url

    try:  # before anything is read or started
        check_host(host, workers)
    except AblateError as e:
        raise click.BadParameter(str(e), param_hint="--host") from None
    study = None
    if tracking_uri is None:
        if study_file is None:
            raise click.UsageError("give a STUDY.yaml or --tracking-uri")
        study = load(study_file, output)
        tracking_uri = study.tracking_uri
        db = tracking_uri.removeprefix("sqlite:///")
        if tracking_uri.startswith("sqlite:///") and not Path(db).exists():
            raise SpecProblem(f"{db}: no MLflow store yet; run `ablate run {study_file}` first")
    else:
        try:  # before MLflow is asked (its client retries 2 min) or starts a server on it
            check_browsable(tracking_uri)
        except AblateError as e:
            raise click.BadParameter(str(e), param_hint="--tracking-uri") from None
        if study_file is not None:
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
        raise refuse(e) from None
    sys.exit(status)
