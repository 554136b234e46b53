"""What every ``ablate`` command shares: loading a study, the common options, and how a library
error becomes an exit status (a refusal before anything started: 2; anything else: 1)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ablate.errors import (
    AblateError,
    CannotRunError,
    DamagedStoreError,
    MissingStoreError,
    StudyError,
)
from ablate.study import Study, load_study
from ablate.study.expand import MAX_CELLS

F = TypeVar("F", bound=Callable[..., Any])


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf`` (which pass its bounds: ``nan``
    compares false to both, ``inf`` is above any minimum) with a usage error."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class SpecProblem(click.ClickException):
    """A study that cannot run: exit status 2, like any usage error, before anything starts."""

    exit_code = 2


def refuse(e: AblateError) -> click.ClickException:
    """The CLI's form of a library error: a refusal before anything started exits 2, the rest 1."""
    if isinstance(e, StudyError | CannotRunError | DamagedStoreError | MissingStoreError):
        return SpecProblem(str(e))
    return click.ClickException(str(e))


def load(
    path: str,
    output: str | None = None,
    max_cells: int = MAX_CELLS,
    tracking_uri: str | None = None,
) -> Study:
    """The study at ``path``; ``tracking_uri`` (``--tracking-uri``) overrides its tracking.uri,
    checked first (``check_tracking_uri``); an empty ``output`` is refused (``Path("")`` is the
    current folder: the store and checkpoints would be made among its files)."""
    if output is not None and not output.strip():
        raise click.UsageError(
            f"{_option_of(output)}: an empty path; give the study's output folder, or leave the "
            "option out (default: the study's output, runs/<name>)"
        )
    if output is not None and os.path.lexists(output) and not os.path.isdir(output):
        raise click.UsageError(
            f"{_option_of(output)}: {output} is not a folder; give the study's output folder, or "
            "leave the option out (default: the study's output, runs/<name>)"
        )
    if tracking_uri is not None and not tracking_uri.strip():  # not "unset": the user gave it
        raise click.UsageError(
            "--tracking-uri: an empty URI; give the store's (sqlite:///<file> or "
            "http://<host>:<port>), or leave the option out (default: the study's tracking.uri)"
        )
    try:
        study = load_study(path, output=output, max_cells=max_cells)
    except StudyError as e:
        raise SpecProblem(str(e)) from None
    if tracking_uri:
        check_tracking_uri(tracking_uri)
        study.file.tracking.uri = tracking_uri
    for note in study.notes:
        click.echo(f"note: {note}", err=True)
    return study


def _option_of(value: str) -> str:
    """The option of the running command that was given ``value`` (``-o/--output``, ``--runs``,
    ``--noise-output``...), to name it in an error."""
    ctx = click.get_current_context(silent=True)
    for p in ctx.command.params if ctx is not None else []:
        if isinstance(p, click.Option) and ctx is not None and ctx.params.get(p.name) == value:
            return "/".join(p.opts)
    return "--output"


def check_tracking_uri(uri: str) -> None:
    """Refuse (exit 2) a ``--tracking-uri`` that no command could use, as a study's tracking.uri
    is refused (``check_store``, reading only): an unsupported scheme, a SQLite URI that names no
    file or names a damaged one, a server that does not answer one request in 5 s (MLflow's own
    client would retry it for minutes)."""
    from ablate.errors import TrackingError
    from ablate.tracking.store import check_store

    try:
        check_store(uri, create=False)
    except TrackingError as e:
        raise SpecProblem(f"--tracking-uri: {e}") from None


study_arg = click.argument("study_file", metavar="STUDY.yaml", type=click.Path(dir_okay=False))
output_opt = click.option(
    "-o", "--output", default=None, help="Output folder (default: the study's output, runs/<name>)."
)
max_cells_opt = click.option(
    "--max-cells",
    type=click.IntRange(min=1),
    default=MAX_CELLS,
    show_default=True,
    help="Refuse a grid of more cells than this (checked before it is expanded).",
)


def tracking_uri_opt(
    help: str = "MLflow tracking URI (overrides the study's tracking.uri).",
) -> Callable[[F], F]:
    """``--tracking-uri``: every command that reads or writes a study's MLflow store has it."""
    return click.option("--tracking-uri", default=None, help=help)


address_opt = click.option(
    "--address",
    default=None,
    envvar="RAY_ADDRESS",
    help="An existing Ray cluster (ray://host:10001 or host:6379), whose workers check their own "
    "devices and log to a tracking server (--tracking-uri http://...; a SQLite store is refused); "
    "default: a local Ray of ablate's own on this machine.",
)


def executor_opt(each: str) -> Callable[[F], F]:
    """``--executor ray|local``; ``each`` says what one Ray task runs (a cell, a trial)."""
    return click.option(
        "--executor",
        type=click.Choice(["ray", "local"]),
        default="ray",
        show_default=True,
        help=f"ray: each {each} a Ray task; local: one after another in this process.",
    )


SWITCHES = (
    "ABLATE_EMULATED_GEMM", "ABLATE_COMPILE", "ABLATE_COMPILE_BACKEND", "ABLATE_QUANT_OPS",
    "ABLATE_NO_KERNEL", "ABLATE_NATIVE_CHECK",
)  # fmt: skip
"""The ``ABLATE_*`` switches the readers' ``check_env`` check (``backends.env``; their modules
import torch): a command that needs no torch asks them only where one of these is set (``slurm
submit``). Kept here, not beside the readers, so that naming them changes no code hash."""


def environment_or_exit() -> None:
    """``preflight.check_environment`` (the ``ABLATE_*`` switches hold values they allow), its
    refusal as exit 2: first thing in a command that reads them outside ``preflight`` (``probe``,
    ``native-check``)."""
    from ablate.driver.preflight import check_environment

    try:
        check_environment()
    except AblateError as e:
        raise refuse(e) from None


def preflight_or_exit(study: Study, address: str | None, *, memory: bool = True) -> None:
    """``preflight.preflight`` (what ``run`` checks before it starts), its refusal as exit 2; then the
    target-headroom warning (``planning.target_headroom``) on stderr."""
    from ablate.driver.planning import ladder_brackets, target_headroom
    from ablate.driver.preflight import auto_cpu_cells, preflight

    try:
        preflight(study, address=address, memory=memory)
    except AblateError as e:
        raise refuse(e) from None
    if address and (auto := auto_cpu_cells(study)):
        click.echo(
            f"warning: device: auto with resources.gpus: 0 trains {len(auto)} cell(s) on CPUs; "
            "`ablate run` refuses that if the cluster has GPUs (set resources.gpus: 1, or "
            "device: cpu)",
            err=True,
        )
    warning = target_headroom(study)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    for line in ladder_brackets(study):
        click.echo(f"warning: {line}", err=True)
