"""The ``probe`` command: the study's gradient-fidelity probes run post hoc on saved checkpoints of
its cells (``ablate.train.probe.probe_checkpoints``), written to a CSV and optionally recorded in
the cells' MLflow runs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import click

from ablate.cli.common import (
    environment_or_exit,
    load,
    max_cells_opt,
    output_opt,
    refuse,
    study_arg,
    tracking_uri_opt,
)
from ablate.errors import AblateError, CheckpointError
from ablate.study import Cell, Study
from backends.recipes import GEMMS

_SUMMARY = ("cos", "align", "rel_err", "sqnr_db", "bias_ratio", "step_cos", "sum_ratio")


@click.command()
@study_arg
@output_opt
@max_cells_opt
@click.option(
    "--checkpoint",
    "checkpoints",
    multiple=True,
    type=click.Path(exists=True),
    help="A checkpoint.pt, or the folder holding one, of a cell of the study (found by the "
    "configuration that wrote it); repeat for several, probed in step order. Default: the "
    "current checkpoint of every selected cell.",
)
@click.option(
    "--cell", "cells", multiple=True, help="Only the cells with this label or key (repeatable)."
)
@click.option(
    "--csv",
    "csv_path",
    default=None,
    help="Where the metrics go (default: reports/<study>/probes_posthoc.csv).",
)
@click.option(
    "--device", default="auto", show_default=True, help="cpu, cuda or auto: where the probes run."
)
@click.option(
    "--log",
    "log_runs",
    is_flag=True,
    help="Also record the metrics in each cell's MLflow run at the checkpoint's step (points "
    "the run already has are kept).",
)
@tracking_uri_opt("With --log: the MLflow store of the study's runs (overrides its tracking.uri).")
def probe(
    study_file: str,
    output: str | None,
    max_cells: int,
    checkpoints: tuple[str, ...],
    cells: tuple[str, ...],
    csv_path: str | None,
    device: str,
    log_runs: bool,
    tracking_uri: str | None,
) -> None:
    """Run the study's gradient-fidelity probes post hoc on saved checkpoints of its cells.

    The settings are the study's `probe:` section (the defaults without one). Several checkpoints
    of one cell are probed in step order, so the error-structure metrics (step_cos, sum_ratio) run
    across them. Prints the mean over layers per GEMM; writes every metric to a CSV.

    \b
    Example:
        ablate probe studies/probes.yaml --cell 'mxfp4[fprop,dgrad,wgrad]+dht16/fp8/seed0'
        ablate probe studies/probes.yaml --checkpoint saved/step100 --checkpoint saved/step200
    """
    from ablate.train.config import ProbeConfig
    from ablate.train.device import resolve_device
    from ablate.train.probe import probe_checkpoints

    environment_or_exit()  # the switches the probes' GEMMs read, before any work
    try:
        resolve_device(device)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--device") from None
    study = load(study_file, output, max_cells, tracking_uri)
    out = _csv_target(study, study_file, csv_path)
    chosen = _select(study, cells)
    plan = _plan(study, chosen, checkpoints)
    if not plan:
        raise click.ClickException(
            f"study {study.name}: no checkpoint to probe in {study.output_dir / 'cells'}; run the "
            "study first, or pass --checkpoint"
        )
    cfg = study.file.probe or ProbeConfig()
    run_ids = _run_ids(study) if log_runs else {}
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, int, str, float]] = []
    for cell, paths in plan:
        try:
            results = probe_checkpoints(cell.config, paths, cfg, device=device)
        except (ValueError, OSError) as e:  # OSError: a read the file system failed (I/O error)
            raise click.ClickException(f"{cell.label}: {e}") from None
        for step, metrics in results:
            rows.extend((cell.key, cell.label, step, k, v) for k, v in sorted(metrics.items()))
            click.echo(_summary(cell.label, step, metrics))
            if log_runs:
                _log(study, run_ids.get(cell.key), cell, step, metrics)
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "label", "step", "metric", "value"])
        w.writerows(rows)
    click.echo(f"{len(rows)} values of {len(plan)} cells written to {out}", err=True)


def _csv_target(study: Study, study_file: str, csv_path: str | None) -> Path:
    """The CSV to write (default ``reports/<study>/probes_posthoc.csv``), checked before anything
    runs: not a folder, not the study file, and nowhere in what the study recorded (its store,
    checkpoints and artifacts), which a CSV would replace."""
    from ablate.tracking.places import place_holding, recorded_places

    out = Path(csv_path) if csv_path else Path("reports") / study.name / "probes_posthoc.csv"
    if out.is_dir():
        raise click.BadParameter(f"{out} is a folder; give a file name", param_hint="--csv")
    if out.exists() and out.resolve() == Path(study_file).resolve():
        raise click.BadParameter(f"{out} is the study file", param_hint="--csv")
    held = place_holding(out, recorded_places(study))
    if held is not None:
        raise click.BadParameter(
            f"{out} is inside {held[0]}, {held[1]}, which holds what the study recorded (a "
            "file there would replace or sit among it); give a path outside it (default "
            f"reports/{study.name}/probes_posthoc.csv)",
            param_hint="--csv",
        )
    return out


def _select(study: Study, wanted: tuple[str, ...]) -> list[Cell]:
    if not wanted:
        return list(study.cells)
    names = {c.label: c for c in study.cells} | {c.key: c for c in study.cells}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}: no such cell; cells: "
            + ", ".join(c.label for c in study.cells[:20]),
            param_hint="--cell",
        )
    return [names[w] for w in wanted]


def _config_hash_of(path: Path) -> str | None:
    """The config hash a checkpoint records (its sidecar when there is one)."""
    from ablate.train.checkpoint import CHECKPOINT, load_file

    file = path / CHECKPOINT if path.is_dir() else path
    side = file.with_suffix(".json")
    try:
        return str(json.loads(side.read_text())["config_hash"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        return str(load_file(file, keys=("config_hash",))["config_hash"])
    except CheckpointError as e:  # damaged, or refused unread: a pickle that could run code
        raise click.BadParameter(str(e), param_hint="--checkpoint") from None


def _plan(
    study: Study, cells: list[Cell], checkpoints: tuple[str, ...]
) -> list[tuple[Cell, list[Path]]]:
    """(cell, its checkpoints) to probe, in study order."""
    from ablate.train.checkpoint import CHECKPOINT

    if not checkpoints:
        found = [(c, study.checkpoint_dir(c) / CHECKPOINT) for c in cells]
        missing = [c.label for c, p in found if not p.exists()]
        if missing and len(missing) < len(found):
            click.echo(f"note: no checkpoint yet for {', '.join(missing)}", err=True)
        return [(c, [p]) for c, p in found if p.exists()]
    by_key = {c.key: c for c in cells}
    paths: dict[str, list[Path]] = {}
    for given in checkpoints:
        path = Path(given)
        key = _config_hash_of(path)
        if key is None:
            raise click.BadParameter(f"{given}: not a checkpoint", param_hint="--checkpoint")
        if key not in by_key:
            raise click.BadParameter(
                f"{given}: written by no {'selected ' if len(cells) < len(study.cells) else ''}"
                f"cell of study {study.name} (its configuration hash is {key})",
                param_hint="--checkpoint",
            )
        paths.setdefault(key, []).append(path)
    return [(c, paths[c.key]) for c in cells if c.key in paths]


def _run_ids(study: Study) -> dict[str, str]:
    from ablate.tracking import study_status

    try:
        return {cs.cell.key: cs.run.run_id for cs in study_status(study) if cs.run is not None}
    except AblateError as e:
        raise refuse(e) from None


def _log(
    study: Study, run_id: str | None, cell: Cell, step: int, metrics: dict[str, float]
) -> None:
    from ablate.tracking import MlflowLogger

    if run_id is None:
        click.echo(
            f"note: {cell.label} has no MLflow run; its metrics are in the CSV only", err=True
        )
        return
    logger = MlflowLogger(study.tracking_uri, run_id)
    try:
        logger.log_metrics(metrics, step)
    finally:
        logger.close()


def _summary(label: str, step: int, metrics: dict[str, float]) -> str:
    lines = [f"{label} @ step {step}:"]
    for gemm in GEMMS:
        shown = [
            f"{m}={metrics[k]:.4g}"
            for m in _SUMMARY
            if (k := f"probe.{gemm}.{m}") in metrics and not math.isnan(metrics[k])
        ]
        if shown:
            lines.append(f"  {gemm:6s} " + " ".join(shown))
    return "\n".join(lines)
