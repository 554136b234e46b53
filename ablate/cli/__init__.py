"""The ``ablate`` command line: a thin click layer over the library.

Status goes to stderr, results to stdout, ``--json`` where a machine reads the output. The library
raises ``ablate.errors.AblateError``s; here a ``StudyError`` exits with status 2 (a usage error,
before anything starts) and any other with status 1, its message printed as it is.

Modules, one per group of commands (``main`` gathers them):

    common   what every command shares: loading a study, the options, exit statuses
    plan     ``validate``, ``plan`` and ``schema``: a study looked at before it runs
    seeds    ``plan``'s seed section: the seeds each comparison needs, from a noise model
    study    ``run``, ``status``, ``adopt`` and ``ui``: running a study, looking at its runs
    recipe   ``recipe``: what a recipe resolves to, operand by operand
    native   ``native-check``: the native GEMMs' self-check on this machine
    data     ``data prepare`` and ``data show``: a study's data prepared before it runs
    results  ``report`` and ``tune``
    probe    ``probe``: gradient-fidelity probes on saved checkpoints
    export   ``export``: a cell's weights as a Hugging Face checkpoint
    slurm    ``slurm run`` and ``slurm submit``
"""

from __future__ import annotations

import click

from ablate import __version__
from ablate.cli import data, export, native, plan, probe, recipe, results, slurm, study


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
    native.native_check,
):
    main.add_command(command)
