"""``ablate slurm``: a study on a SLURM allocation, ``run`` inside one and ``submit`` to get one
(``ablate.slurm``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ablate.cli.common import (
    SWITCHES,
    SpecProblem,
    environment_or_exit,
    load,
    max_cells_opt,
    output_opt,
    refuse,
    study_arg,
    tracking_uri_opt,
)
from ablate.errors import AblateError
from ablate.study.expand import MAX_CELLS

rerun_stale_opt = click.option(
    "--rerun-stale",
    is_flag=True,
    help="As `ablate run --rerun-stale`: run again, in new runs, finished cells that other "
    "training code produced and interrupted ones whose data now prepare to other tokens.",
)


@click.group()
def slurm() -> None:
    """Run a study on a SLURM allocation: `run` inside one, `submit` to get one.

    The job starts Ray across its nodes (ports and folders of its own, so jobs sharing a node do
    not collide), serves the study's MLflow store from its first node, runs the study and stops
    everything at the end. Ahead of the time limit, and when SLURM requeues or preempts the job,
    the running cells checkpoint and the requeued job resumes them. See docs/slurm.md.
    """


def _run_args(
    output: str | None, tracking_uri: str | None, max_cells: int | None, rerun_failed: bool,
    rerun_stale: bool, no_report: bool, quiet: bool, max_concurrent: int | None,
) -> list[str]:  # fmt: skip
    """The options of ``ablate slurm run`` as words, to run it again elsewhere."""
    args = ["-o", output] if output else []
    args += ["--tracking-uri", tracking_uri] if tracking_uri else []
    args += ["--max-cells", str(max_cells)] if max_cells is not None else []
    args += ["--max-concurrent", str(max_concurrent)] if max_concurrent else []
    args += [f for f, on in (("--rerun-failed", rerun_failed), ("--rerun-stale", rerun_stale),
                             ("--no-report", no_report), ("--quiet", quiet)) if on]  # fmt: skip
    return args


@slurm.command("run")
@study_arg
@output_opt
@max_cells_opt
@tracking_uri_opt(
    "MLflow tracking URI (overrides the study's tracking.uri). A SQLite store (the default) is "
    "written directly on one node and through the job's own MLflow server on several; an "
    "http(s) server is used as it is."
)
@click.option("--rerun-failed", is_flag=True, help="Run cells that failed before again.")
@rerun_stale_opt
@click.option("--max-concurrent", type=int, default=None, help="At most N cells at once.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--no-report", is_flag=True, help="Do not write the report when the study ends.")
@click.option(
    "--object-store-mb",
    type=click.IntRange(min=80),
    default=256,
    show_default=True,
    help="Ray's object store on each node, in MiB (cells pass it little).",
)
def run(
    study_file: str, output: str | None, max_cells: int, tracking_uri: str | None,
    rerun_failed: bool, rerun_stale: bool, max_concurrent: int | None, quiet: bool,
    no_report: bool, object_store_mb: int,
) -> None:  # fmt: skip
    """Run a study on the SLURM allocation this command runs in.

    From the job's first node (the batch script's), it starts Ray on every node of the job, serves
    the study's store from the job's MLflow server, runs the cells that need it and stops it all
    at the end. In an salloc shell on a login node it moves itself to the first node (srun).
    SIGUSR1 (the time limit nears) or SIGTERM (requeue, preemption): the running cells checkpoint
    and it exits 130; run it again (the requeued job does) to resume them.

    \b
    Example:
        salloc --nodes 2 --ntasks-per-node 1 --cpus-per-task 8 --gpus-per-node 8
        ablate slurm run studies/mxfp4_wgrad.yaml -o /shared/runs/mxfp4_wgrad
    """
    from ablate.slurm import read_allocation
    from ablate.slurm.sbatch import INTERRUPTED
    from ablate.slurm.session import relaunch_command, run_on_allocation

    try:
        alloc = read_allocation(os.environ)
    except AblateError as e:
        raise refuse(e) from None
    if alloc.this_node is None:  # an salloc shell on the login node
        cmd = relaunch_command(
            alloc,
            ["slurm", "run", str(Path(study_file).resolve()),
             *_run_args(str(Path(output).resolve()) if output else None, tracking_uri, max_cells,
                        rerun_failed, rerun_stale, no_report, quiet, max_concurrent),
             f"--object-store-mb={object_store_mb}"],
        )  # fmt: skip
        click.echo(
            f"slurm: not on a node of job {alloc.job_id}; on {alloc.head}: srun ...", err=True
        )
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            raise SpecProblem(f"cannot run srun to reach node {alloc.head} ({e})") from None
    study = load(study_file, output, max_cells, tracking_uri)
    try:
        res = run_on_allocation(
            study,
            alloc,
            rerun_failed=rerun_failed,
            rerun_stale=rerun_stale,
            max_concurrent=max_concurrent,
            progress=not quiet,
            report=not no_report,
            object_store_mb=object_store_mb,
        )
    except AblateError as e:
        from ablate.slurm.signals import Stopped

        if isinstance(e, Stopped):
            click.echo(f"slurm: {e}", err=True)
            sys.exit(INTERRUPTED)
        raise refuse(e) from None
    if res.report:
        click.echo(f"report: {res.report}", err=True)
    if res.interrupted:
        click.echo(
            f"slurm: stopped ({res.stopped_by or 'Ctrl-C'}); the cells resume from their "
            "checkpoints when the study runs again",
            err=True,
        )
        sys.exit(INTERRUPTED)
    if res.failed or res.left_failed:
        click.echo(
            f"slurm: {res.failed} cell(s) failed, {res.left_failed} failed before and were left as "
            f"they are; see `ablate status {study_file}` and rerun them with --rerun-failed",
            err=True,
        )
        sys.exit(1)


@slurm.command("submit")
@study_arg
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Nodes of the job.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per node.",
)
@click.option(
    "--cpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="CPUs per node (default: resources.cpus times the cells a node's GPUs hold; one cell's "
    "for a CPU study).",
)
@click.option(
    "--time", "time_limit", required=True, help="Time limit, as sbatch takes it: 4:00:00."
)
@click.option("--partition", default=None, help="SLURM partition.")
@click.option(
    "--signal-lead",
    type=click.IntRange(min=10),
    default=300,
    show_default=True,
    metavar="SECONDS",
    help="SIGUSR1 this long before the time limit: room for a step and a checkpoint (SLURM may "
    "send it up to a minute early).",
)
@click.option(
    "--sbatch-arg", "sbatch_args", multiple=True, metavar="OPTION",
    help="One more sbatch option (--account=..., --qos=...); repeatable.",
)  # fmt: skip
@output_opt
@max_cells_opt
@tracking_uri_opt()
@click.option("--rerun-failed", is_flag=True, help="Run cells that failed before again.")
@rerun_stale_opt
@click.option("--no-report", is_flag=True, help="Do not write the report when the study ends.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script; submit nothing.")
def submit(
    study_file: str, nodes: int, gpus_per_node: int, cpus_per_node: int | None,
    time_limit: str, partition: str | None, signal_lead: int, sbatch_args: tuple[str, ...],
    output: str | None, max_cells: int, tracking_uri: str | None, rerun_failed: bool,
    rerun_stale: bool, no_report: bool, dry_run: bool,
) -> None:  # fmt: skip
    """Submit a study as a requeueable SLURM batch job running `ablate slurm run`.

    The job asks for SIGUSR1 --signal-lead seconds before its time limit; then, and when SLURM
    requeues or preempts it (SIGTERM), the running cells checkpoint, the job ends and the requeued
    job resumes them. The script goes to stdout with --dry-run; the job's output to
    <output>/slurm/job-<id>.out. Prints the job id.

    \b
    Example:
        ablate slurm submit studies/mxfp4_wgrad.yaml --nodes 2 --gpus-per-node 8 \\
            --time 12:00:00 --partition gpu -o /shared/runs/mxfp4_wgrad
        ablate slurm submit studies/quickstart.yaml --nodes 2 --time 30 --dry-run
    """
    from ablate.slurm.sbatch import Submission, sbatch_script, submit

    # the job inherits this environment: a bad switch would fail it only once it left the queue
    # (checked where one is set: the readers import torch, seconds a start)
    if any(os.environ.get(name) for name in SWITCHES):
        environment_or_exit()
    study = load(study_file, output, max_cells, tracking_uri)
    sub = Submission(
        study_file=Path(study_file).resolve(),
        output=study.output_dir.resolve(),
        nodes=nodes,
        time=time_limit,
        gpus_per_node=gpus_per_node,
        cpus_per_node=cpus_per_node,
        partition=partition,
        signal_lead=signal_lead,
        sbatch_args=list(sbatch_args),
        run_args=_run_args(
            None,
            tracking_uri,
            max_cells if max_cells != MAX_CELLS else None,
            rerun_failed,
            rerun_stale,
            no_report,
            False,
            None,
        ),  # fmt: skip
    )
    try:
        script = sbatch_script(study, sub, cwd=Path.cwd(), pythonpath=os.environ.get("PYTHONPATH"))
        if dry_run:
            click.echo(script, nl=False)
            return
        job = submit(script, sub.output)
    except AblateError as e:
        raise refuse(e) from None
    click.echo(
        f"submitted job {job}: its output goes to {sub.output}/slurm/job-{job}.out", err=True
    )
    click.echo(job)
