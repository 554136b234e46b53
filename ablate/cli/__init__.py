"""The ``ablate`` command line: a thin click layer over the library.

Status goes to stderr, results to stdout, ``--json`` where a machine reads the output. The library
raises ``ablate.errors.AblateError``s; here a ``StudyError`` exits with status 2 (a usage error,
before anything starts) and any other with status 1, its message printed as it is.
"""

from __future__ import annotations

import click

from ablate import __version__
from ablate.cli import data, export, plan, probe, recipe, results, slurm, study


@click.group()
@click.version_option(__version__, prog_name="ablate")
def main() -> None:
    """Controlled ablation studies of FP4 (MXFP4, NVFP4) and FP8 training recipes."""


for command in (
    recipe.recipe,
    plan.validate,
    plan.schema,
    plan.plan,
    data.data,
    study.run,
    study.status,
    study.adopt,
    study.ui,
    results.report,
    results.tune,
    probe.probe,
    export.export,
    slurm.slurm,
):
    main.add_command(command)
