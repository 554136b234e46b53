"""``ablate data``: a study's data prepared before it runs (``prepare``) and what is prepared
(``show``); ``ablate run`` and ``ablate tune`` prepare it too, before any cell starts."""

from __future__ import annotations

import json
from typing import Any

import click

from ablate.cli.common import load, max_cells_opt, output_opt, refuse, study_arg
from ablate.errors import AblateError


def _at_most_usable_cpus(ctx: click.Context, param: click.Parameter, value: int | None) -> Any:
    from ablate.data.tokenizing import usable_cpus

    if value is not None and value > (cpus := usable_cpus()):
        raise click.BadParameter(
            f"{value} tokenizing processes, but this process may use {cpus} CPUs (its CPU "
            f"affinity, as SLURM or taskset set it); give at most {cpus}",
            ctx,
            param,
        )
    return value


@click.group()
def data() -> None:
    """Prepare a study's data (each data configuration tokenized once) and show it."""


@data.command()
@study_arg
@output_opt
@max_cells_opt
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    callback=_at_most_usable_cpus,  # each one a forked process
    default=None,
    help="Processes that tokenize with a Hugging Face tokenizer (default: half the CPUs this "
    "process may use, at most 8; at most those CPUs; the byte tokenizer always runs in one).",
)
def prepare(study_file: str, output: str | None, max_cells: int, workers: int | None) -> None:
    """Tokenize each distinct data configuration of a study once into its data cache (the study's
    data_cache, else $ABLATE_DATA_CACHE, else ~/.cache/ablate/data), and verify the checksums of
    sets prepared before; a damaged set is rebuilt.

    \b
    Example:
        ablate data prepare studies/recipes_gpu.yaml --workers 8
    """
    from ablate.driver.preparing import prepare_study

    study = load(study_file, output, max_cells)
    try:
        sets = prepare_study(study, workers=workers)
    except AblateError as e:
        raise refuse(e) from None
    for s in sets:
        assert s.prepared is not None
        click.echo(f"{s.key}  {len(s.cells)} cells  {s.prepared.path}")


@data.command()
@study_arg
@output_opt
@max_cells_opt
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(study_file: str, output: str | None, max_cells: int, as_json: bool) -> None:
    """The study's data configurations: their prepared-set keys, whether each is prepared (sizes
    checked, not checksums), token counts and the cells that read it. Writes nothing.

    \b
    Example:
        ablate data show studies/heldout.yaml
    """
    from ablate.driver.preparing import study_data

    study = load(study_file, output, max_cells)
    rows: list[dict[str, Any]] = []
    for s in study_data(study):
        m = s.prepared.manifest if s.prepared is not None else None
        rows.append(
            {
                "key": s.key,
                "prepared": m is not None,
                "path": str(study.data_cache() / s.key),
                "corpus": m["corpus"] if m else None,
                "val_corpus": m["val_corpus"] if m else None,
                "tokenizer": m["tokenizer"] if m else s.config.tokenizer,
                "tokens": {n[:-4]: f["tokens"] for n, f in m["files"].items()} if m else None,
                "cells": [c.label for c in s.cells],
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        state = "prepared" if r["prepared"] else "not prepared (ablate data prepare, or run)"
        click.echo(f"{r['key']}  {state}  {r['path']}")
        if r["tokens"]:
            counts = ", ".join(f"{n:,} {k}" for k, n in r["tokens"].items())
            val = f", validation {r['val_corpus']}" if r["val_corpus"] else ""
            click.echo(f"  {r['corpus']}{val}, {r['tokenizer']}: {counts} tokens")
        more = f" ... ({len(r['cells'])})" if len(r["cells"]) > 4 else ""
        click.echo(f"  cells: {', '.join(r['cells'][:4])}{more}")
