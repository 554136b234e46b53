"""The ``recipe`` command: what a named recipe, a variant of one (a partial override) or a recipe
shorthand resolves to, operand by operand, as a table or as JSON."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import click
import yaml

from ablate.study.override import RecipeOverride
from ablate.study.recipe import select
from ablate.study.schedules import NAMED_SCHEDULES, NamedSchedule
from backends.recipes import GEMMS, OPERANDS, Recipe, named_recipe


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
@click.option(
    "--set",
    "changes",
    multiple=True,
    metavar="PATH=VALUE",
    help="Change a field of the named recipe (a partial override), e.g. wgrad.hadamard=null or "
    "dgrad.dy.rounding=rne; repeatable. VALUE is YAML.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the resolved table as JSON.")
def recipe(
    name: str | None,
    fp4_gemms: str,
    intervention: str,
    fp4_format: str,
    base: str,
    keep_first: int,
    keep_last: int,
    changes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Show what a named recipe, a variant of one, or a recipe shorthand resolves to, operand by
    operand.

    NAME is a named recipe (nvidia_nvfp4, tseng_mxfp4, amd_mxfp4_h16, quartet, four_over_six,
    nvidia_nvfp4_4over6, quartet_ii, tetrajet_v2), a named precision schedule (its phases, its
    source and what the source leaves open, then its recipe), or a variant written as a study writes it
    ('{name: nvidia_nvfp4, wgrad: {hadamard: null}}'); --set changes fields of it the same way.
    Without NAME the shorthand options describe the recipe. --json prints {"gemms": {GEMM: {"a":
    OPERAND, "b": OPERAND, "hadamard": {"size", "signs"} | null}}, "keep_first", "keep_last",
    "layers"} with OPERAND = {"operand", "format", "rounding", "prescale", "block": [rows, cols]}
    and "scale_rule", "outer_block" where set.

    \b
    Example:
        ablate recipe nvidia_nvfp4
        ablate recipe nvidia_nvfp4 --set wgrad.hadamard=null
        ablate recipe '{name: quartet_ii, fprop: {scale_rule: null}}' --json
        ablate recipe tseng_mxfp4 --base bf16 --json
        ablate recipe --fp4 fprop,dgrad,wgrad --intervention dht --base fp8
    """
    gemms = [g.strip() for g in fp4_gemms.split(",") if g.strip()]
    twice = sorted({g for g in gemms if gemms.count(g) > 1})
    if twice:
        raise click.BadParameter(
            f"{', '.join(twice)} listed twice in {fp4_gemms!r}", param_hint="--fp4"
        )
    if name is not None and name in NAMED_SCHEDULES:
        _echo_schedule(NAMED_SCHEDULES[name], base, as_json)
        return
    try:
        if name is not None:
            if gemms or intervention != "none" or fp4_format != "mxfp4":
                raise ValueError(
                    f"recipe: {name!r} is a named recipe; --fp4, --intervention and --format "
                    "describe a shorthand instead (give one or the other)"
                )
            r = select(
                _named_or_variant(name, changes, base),
                keep_first=keep_first,
                keep_last=keep_last,
                layers=None,
            )
        elif changes:
            raise ValueError("--set: changes a named recipe; give its NAME first")
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
    for note in recipe_notes(r):
        click.echo(note)


def _echo_schedule(sched: NamedSchedule, base: str, as_json: bool) -> None:
    """A named precision schedule: its description, source and phases, then its recipe's table."""
    r = named_recipe(str(sched.keys["recipe"]), base)
    if as_json:
        doc = {
            "name": sched.name,
            "description": sched.description,
            "source": sched.source,
            "keys": dict(sched.keys),
            "open": list(sched.open),
            "recipe": r.table(),
        }
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"{sched.name}: {sched.description}")
    click.echo(f"source: {sched.source}")
    for phase in ("warmup", "tail"):
        if (p := sched.keys.get(phase)) is not None:
            length = p.get("first", p.get("last"))
            gemms = ", ".join(p.get("gemms", GEMMS))
            click.echo(f"{phase}: {p['recipe']} on {gemms} for {length} (of train.steps)")
    if sched.open:
        what = ", ".join(sched.open)
        click.echo(f"set by the run more than by the recipe (the value above stands in): {what}")
    click.echo(f"recipe: {r.short()}")
    click.echo(recipe_table_text(r))


def recipe_notes(r: Recipe) -> list[str]:
    """What a user of this recipe should know that its table does not show: Four Over Six under
    stochastic rounding with the candidates compared as they round is biased."""
    biased = [
        f"{g}.{op}"
        for g in GEMMS
        for op, s in zip(OPERANDS[g], (r.gemm(g).a, r.gemm(g).b), strict=True)
        if s is not None and s.scale_rule and s.rounding == "sr" and s.scale_pick == "rounded"
    ]
    if not biased:
        return []
    return [
        f"note: {', '.join(biased)}: Four Over Six compares its two scales as they round "
        "stochastically (scale_pick: rounded, the published recipe's choice), which makes the "
        "gradient estimate biased: some elements' means stay off their values over many draws "
        "(docs/recipes.md gives the measurement, `python -m ablate.bench.bias` repeats it). "
        "scale_pick: nearest is unbiased, e.g. --set dgrad.dy.scale_pick=nearest"
    ]


def _named_or_variant(name: str, changes: tuple[str, ...], base: str) -> Recipe:
    """The named recipe ``name`` (or a variant mapping written in YAML) with the ``--set``
    changes; ValueError at the path of what is wrong."""
    spec: Any = _yaml("NAME", name) if name.lstrip().startswith("{") else name
    if not changes and isinstance(spec, str):
        return named_recipe(spec, base)
    tree: dict[str, Any] = dict(spec) if isinstance(spec, dict) else {"name": spec}
    for item in changes:
        path, sep, value = item.partition("=")
        keys = path.strip().split(".")
        if not sep or not all(keys):  # an empty name: `wgrad..x`, `.x`, `x.`
            raise ValueError(f"--set: {item!r} is not PATH=VALUE, e.g. wgrad.hadamard=null")
        node = tree
        for k in keys[:-1]:
            child = node.get(k)
            node = node.setdefault(k, {}) if child is None else child
            if not isinstance(node, dict):
                raise ValueError(f"--set: {path} goes below {k}, which is not a mapping")
        node[keys[-1]] = _yaml(f"--set {path.strip()}", value)
    return RecipeOverride.parse(tree).build(base)


def _yaml(where: str, text: str) -> Any:
    """``text`` parsed as YAML (safe: plain values only), within a study's limits (nesting,
    aliases: ``check_yaml_limits``); ValueError naming ``where``."""
    from ablate.study.loader import check_yaml_limits

    shown = repr(text if len(text) <= 80 else text[:77] + "...")
    try:
        check_yaml_limits(text)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        what = str(getattr(e, "problem", None) or e).splitlines()[0]
        raise ValueError(f"{where}: {shown} is not valid YAML ({what})") from None
    except ValueError as e:  # a limit: nested too deeply, too many aliases
        raise ValueError(f"{where}: {shown} is refused: {e}") from None


def _prescale_text(p: bool | float) -> str:
    if p is True:
        return "3/4"
    if not p:
        return "-"
    f = Fraction(p).limit_denominator(64)
    return f"{f.numerator}/{f.denominator}" if abs(float(f) - p) < 1e-12 else f"{p:.4g}"


def _scale_text(o: dict[str, Any]) -> str:
    """The scaling of an operand row where it is not the format's own: ceil (a scale mode other
    than OCP's floor), 4/6-mse, o128, or -."""
    parts = []
    if o.get("scale_mode"):
        parts.append(o["scale_mode"])
    if o.get("scale_rule"):
        pick = "-nearest" if o.get("scale_pick") == "nearest" else ""
        parts.append(f"4/6-{o['scale_rule']}{pick}")
    if o.get("outer_block"):
        parts.append(f"o{o['outer_block']}")
    return "+".join(parts) or "-"


def recipe_table_text(r: Recipe) -> str:
    """``Recipe.table()`` as aligned text: one row per GEMM operand, then the layer selection. A
    ``scale`` column (a scale mode other than floor, Four Over Six, outer blocks) appears where an
    operand has one."""
    t = r.table()
    ops = [t["gemms"][g][op] for g in GEMMS for op in ("a", "b")]
    scale = any(_scale_text(o) != "-" for o in ops)
    rows = [["gemm", "operand", "format", "rounding", "prescale", "block", "hadamard"]]
    if scale:
        rows[0].insert(6, "scale")
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
            row_text = [
                g,
                o["operand"],
                o["format"],
                o["rounding"] or "-",
                _prescale_text(o["prescale"]),
                block,
                had,
            ]
            if scale:
                row_text.insert(6, _scale_text(o))
            rows.append(row_text)
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
