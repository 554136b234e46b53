"""The ``export`` command: a study cell's weights as a Hugging Face checkpoint folder
(``ablate.export.export_cell``; docs/export.md)."""

from __future__ import annotations

import json

import click

from ablate.cli.common import SpecProblem, load, refuse, study_arg, tracking_uri_opt
from ablate.errors import AblateError, CheckpointError, ExportError


@click.command()
@study_arg
@click.option(
    "--cell", "label", required=True, help="The cell's label (or key), as `ablate status` shows it."
)
@click.option(
    "-o",
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="The folder to write (refused when it exists and is not empty, unless --force, and "
    "inside the study's output folder, always).",
)
@click.option(
    "--output",
    default=None,
    help="The study's output folder (default: its output, runs/<name>).",
)
@click.option(
    "--force", is_flag=True, help="Replace an export's files in a folder that is not empty."
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16"]),
    default="float32",
    show_default=True,
    help="The weights' dtype in model.safetensors (the master weights are float32).",
)
@tracking_uri_opt("The MLflow store of the study's runs, for the run id the export records.")
def export(
    study_file: str,
    label: str,
    out_dir: str,
    output: str | None,
    force: bool,
    dtype: str,
    tracking_uri: str | None,
) -> None:
    """Write a cell's weights as a Hugging Face checkpoint.

    The folder gets config.json, model.safetensors (the high-precision master weights, never FP4
    codes), the tokenizer when it is a Hugging Face one, and ablate_export.json (study, cell, run,
    step, recipe, tokenizer, departures from Llama). A built-in preset loads as LlamaForCausalLM.
    The latest checkpoint is exported: a finished cell's final weights, an interrupted cell's last
    checkpoint.

    \b
    Example:
        ablate export studies/quickstart.yaml --cell 'fp8/seed0' -o exported/quickstart-fp8
    """
    from ablate.export import METADATA, export_cell

    study = load(study_file, output, tracking_uri=tracking_uri)
    try:
        out = export_cell(study, label, out_dir, force=force, dtype=dtype)
    except (ExportError, CheckpointError, ImportError) as e:
        # refused, or failed before the export was in place: nothing written (exit 2)
        raise SpecProblem(str(e)) from None
    except AblateError as e:
        raise refuse(e) from None
    except OSError as e:  # a read or write the file system failed (an I/O error, a full disk)
        raise click.ClickException(f"{label}: not exported: {e}") from None
    meta = json.loads((out / METADATA).read_text())
    click.echo(
        f"{meta['cell']} at step {meta['step']} ({meta['status']}) written to "
        f"{out} as {meta['architecture']}",
        err=True,
    )
    click.echo(str(out))
