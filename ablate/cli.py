"""The ``ablate`` command line: a thin click layer over the library.

Status goes to stderr, results to stdout, ``--json`` where a machine reads the output.
"""

from __future__ import annotations

import json

import click

from backends.recipe import GEMMS, OPERANDS, Recipe

from . import __version__


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
