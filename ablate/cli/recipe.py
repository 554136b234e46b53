"""``ablate recipe``: what a named recipe or a recipe shorthand resolves to, operand by operand, as
an aligned table or as JSON (``Recipe.table()``)."""

from __future__ import annotations

import json

import click

from backends.named import named_recipe
from backends.recipe import GEMMS, Recipe

from ..spec.recipe import select


@click.command()
@click.argument("name", required=False)
@click.option(
    "--fp4",
    "fp4_gemms",
    default="",
    help="Comma-separated GEMMs in FP4: fprop, dgrad, wgrad (empty: none).",
)
@click.option("--intervention", default="none", show_default=True, help="none, sr, rht, dht, ...")
@click.option("--format", "fp4_format", default="mxfp4", show_default=True, help="mxfp4 or nvfp4.")
@click.option("--base", default="bf16", show_default=True, help="Other GEMMs: bf16, fp8, mxfp8.")
@click.option("--keep-first", default=0, type=click.IntRange(min=0), help="First N blocks in BF16.")
@click.option("--keep-last", default=0, type=click.IntRange(min=0), help="Last N blocks in BF16.")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved table as JSON.")
def recipe(
    name: str | None,
    fp4_gemms: str,
    intervention: str,
    fp4_format: str,
    base: str,
    keep_first: int,
    keep_last: int,
    as_json: bool,
) -> None:
    """Show what a named recipe or a recipe shorthand resolves to, operand by operand.

    NAME is a named recipe (nvidia_nvfp4, tseng_mxfp4, amd_mxfp4_h16, quartet); without it the
    shorthand options describe the recipe. --json prints {"gemms": {GEMM: {"a": OPERAND, "b":
    OPERAND, "hadamard": {"size", "signs"} | null}}, "keep_first", "keep_last", "layers"} with
    OPERAND = {"operand", "format", "rounding", "prescale", "block": [rows, cols]}.

    \b
    Example:
        ablate recipe nvidia_nvfp4
        ablate recipe tseng_mxfp4 --base bf16 --json
        ablate recipe --fp4 fprop,dgrad,wgrad --intervention dht --base fp8
    """
    gemms = [g.strip() for g in fp4_gemms.split(",") if g.strip()]
    try:
        if name is not None:
            if gemms or intervention != "none" or fp4_format != "mxfp4":
                raise ValueError(
                    f"recipe: {name!r} is a named recipe; --fp4, --intervention and --format "
                    "describe a shorthand instead (give one or the other)"
                )
            r = select(
                named_recipe(name, base), keep_first=keep_first, keep_last=keep_last, layers=None
            )
        else:
            r = Recipe.from_shorthand(
                gemms,
                intervention,
                fp4_format=fp4_format,
                base=base,
                keep_first=keep_first,
                keep_last=keep_last,
            )
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    if as_json:
        click.echo(json.dumps(r.table(), indent=2))
        return
    click.echo(r.short())
    click.echo(recipe_table_text(r))


def recipe_table_text(r: Recipe) -> str:
    """``Recipe.table()`` as aligned text: one row per GEMM operand, then the layer selection."""
    t = r.table()
    rows = [["gemm", "operand", "format", "rounding", "prescale", "block", "hadamard"]]
    for g in GEMMS:
        row = t["gemms"][g]
        h = row["hadamard"]
        had = "-" if h is None else f"{h['size']} {h['signs']}"
        h_obj = r.gemm(g).hadamard
        if h_obj is not None and h_obj.vector is not None:
            had += " (one vector: " + "".join("+" if v > 0 else "-" for v in h_obj.vector) + ")"
        for op in ("a", "b"):
            o = row[op]
            block = "-" if o["block"] is None else "x".join(map(str, o["block"]))
            rows.append(
                [
                    g,
                    o["operand"],
                    o["format"],
                    o["rounding"] or "-",
                    "3/4" if o["prescale"] else "-",
                    block,
                    had,
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    layers = t["layers"]
    types = "attention+mlp" if layers["types"] is None else "+".join(layers["types"])
    blocks = "all" if layers["blocks"] is None else ",".join(map(str, layers["blocks"]))
    lines.append(
        f"keep_first {t['keep_first']}, keep_last {t['keep_last']} (blocks in BF16); "
        f"layers: {types}, blocks {blocks}"
    )
    return "\n".join(lines)
