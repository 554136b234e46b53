"""The recipe vocabulary of a study beyond the shorthands: a named recipe (``recipe: NAME``), the
explicit per-GEMM, per-operand form (``gemms:``), the layer selection (``layers:``), how each becomes
a ``backends.Recipe``. The explicit form is the recipe's canonical one (``Recipe.explicit``): any
recipe, a shorthand or a named one, written out in it builds back to the same GEMMs.

A cell's recipe is one of three spellings (never two at once), each over ``base_format`` for the
GEMMs it leaves unquantized, and each selected onto layers by ``keep_first``/``keep_last`` and
``layers``::

    fp4_gemms: [fprop, dgrad, wgrad]       # the shorthands (with intervention, fp4_format, ...)
    intervention: sr+rht64

    recipe: nvidia_nvfp4                   # a named recipe: nvidia_nvfp4, tseng_mxfp4,
                                           # amd_mxfp4_h16, quartet (backends.recipes.named)
    gemms:                                 # the explicit form
      fprop: {format: nvfp4, w: {block: [16, 16]}}
      dgrad: {format: nvfp4, dy: {rounding: sr}, w: {block: [16, 16]}}
      wgrad:
        format: nvfp4
        dy: {rounding: sr}
        hadamard: {size: 16, signs: fixed}  # none | fixed | random; rotates both operands

    layers: {types: [mlp], blocks: [0, -1]}  # attention / mlp linears; block indices (-1: last)

In ``gemms`` a GEMM's own keys (format, rounding, prescale, scale_mode, block, scale_rule,
outer_block) apply to both of its operands, and an operand's keys, under its tensor name (fprop: x,
w; dgrad: dy, w; wgrad: dy, x), override them. The NVFP4 variants of ``backends.quant.variants``:
``scale_rule: mse|mae|abs_max`` (Four Over Six), ``rounding: eden`` (MS-EDEN; its GEMM needs a
``hadamard``), ``outer_block: 128`` (TetraJet-v2's FP32 scale per 128 elements). A named recipe
with some of these keys changed is a partial override (``recipe: {name: ..., wgrad: {...}}``,
``ablate.study.override``). ``format`` is a ``backends.quant.FORMATS`` name or ``bf16`` (high precision);
``block`` is ``[rows, cols]``: ``[1, N]`` for blocks of N along the reduction dimension, ``[N, N]``
for 2-D tiles, which only the weight ``w`` takes (fprop and dgrad then share one quantization of W
when they give it the same spec). ``prescale`` (the 3/4 clip-free scale, undone on the output) is
independent of ``rounding``. A GEMM not listed runs in ``base_format``. Every problem is a
``ValueError`` (a pydantic error at its YAML path) naming the allowed values.
"""

from __future__ import annotations

import typing
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ablate.study.messages import did_you_mean
from backends.quant import BLOCK_SIZES, FORMATS, QuantSpec
from backends.quant.operand import OPTION_NAMES, option_choices
from backends.recipes import (
    GEMMS,
    NAMED_RECIPES,
    OPERANDS,
    GemmRecipe,
    HadamardSpec,
    Recipe,
    named_recipe,
)
from backends.recipes.intervention import label
from backends.recipes.named import USES_BASE
from backends.recipes.recipe import base_gemm

FormatName = Literal[("bf16", *FORMATS)]  # type: ignore[valid-type]
"""What an operand's ``format`` may be: a quantized format (``FORMATS``), or bf16 (high precision)."""


def _option_types() -> dict[str, Any]:
    """The annotation of each operand option of the explicit form, from ``QuantSpec``'s fields:
    their allowed values where the field declares them (``option(choices=...)``), else the
    field's type; ``block`` is ``[rows, cols]``; every key may be left unset (None)."""
    hints = typing.get_type_hints(QuantSpec)
    out: dict[str, Any] = {"format": FormatName | None}
    for name in OPTION_NAMES:
        choices = option_choices(name)
        if name == "block":
            out[name] = list[int] | None
        elif choices is not None:
            out[name] = Literal[choices] | None
        else:
            out[name] = hints[name] | None
    return out


class OperandOptions(BaseModel):
    """How one operand is quantized; unset keys take the GEMM's, then the defaults (rne, no
    prescale, floor, the format's own block). The keys are ``QuantSpec``'s operand options
    (``backends.quant.operand``: what each means and allows), generated from its fields: format
    (``bf16``: high precision), rounding, prescale (a factor in (0, 1] may be written "16/17"),
    scale_mode, block (``[1, N]``, or ``[N, N]`` 2-D tiles for the weight w only), scale_rule,
    outer_block."""

    model_config = ConfigDict(extra="forbid")
    __annotations__ = _option_types()
    locals().update(dict.fromkeys(__annotations__))  # every key unset by default

    @field_validator("prescale", mode="before")
    @classmethod
    def _factor(cls, v: Any) -> Any:
        if v is None or isinstance(v, bool):
            return v
        try:
            if isinstance(v, str) and "/" in v:  # "16/17"
                num, _, den = v.partition("/")
                f = float(num) / float(den)
            else:
                f = float(v)
        except (TypeError, ValueError, ZeroDivisionError):
            f = float("nan")
        if not 0 < f <= 1:
            raise ValueError(
                f"{v!r} is not allowed; allowed: true (3/4), false, or a factor in (0, 1] such "
                "as 16/17"
            )
        return f

    @field_validator("block")
    @classmethod
    def _two_ints(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return None
        sizes = ", ".join(map(str, BLOCK_SIZES))
        if len(v) != 2 or v[1] not in BLOCK_SIZES or v[0] not in (1, v[1]):
            raise ValueError(
                f"{v} is not a block; allowed: [1, N] or [N, N] (2-D, weights only) with N in "
                f"{sizes}"
            )
        return v


class HadamardOptions(BaseModel):
    """A Hadamard transform of both operands along the GEMM's reduction dimension."""

    model_config = ConfigDict(extra="forbid")

    size: Literal[16, 32, 64, 128, 256] = 16
    signs: Literal["none", "fixed", "random"] = "none"
    """none: deterministic; fixed: one sign vector per layer and GEMM (or ``vector``) for the whole
    run; random: redrawn at every call."""
    vector: list[int] | None = None
    """With signs: fixed, this sign vector (``size`` entries of 1 or -1) for every layer."""

    def spec(self) -> HadamardSpec:
        return HadamardSpec(
            size=self.size,
            signs=self.signs,
            vector=None if self.vector is None else tuple(self.vector),
        )


class _GemmOptions(OperandOptions):
    """One GEMM: keys for both operands, per-operand overrides, an optional Hadamard transform."""

    gemm: ClassVar[str]
    hadamard: HadamardOptions | None = None

    def operand(self, name: str) -> OperandOptions | None:
        o: OperandOptions | None = getattr(self, name)
        return o

    def build(self) -> GemmRecipe:
        """The ``GemmRecipe``; ValueError starting with the dotted path of what is wrong."""
        specs: list[QuantSpec | None] = []
        for op in OPERANDS[self.gemm]:
            own = self.operand(op) or OperandOptions()
            given = {
                k: getattr(own, k) if getattr(own, k) is not None else getattr(self, k)
                for k in OperandOptions.model_fields
            }
            given = {k: v for k, v in given.items() if v is not None}

            def at(key: str, own: OperandOptions = own, op: str = op) -> str:
                """The YAML path (below the GEMM) of the key that set ``key`` for this operand."""
                return f"{op}.{key}" if getattr(own, key) is not None else key

            fmt = given.get("format")
            if fmt is None:
                raise ValueError(
                    f"{op}.format: no format for operand {op}; give format for the GEMM or the "
                    f"operand; allowed: bf16, {', '.join(FORMATS)}"
                )
            if fmt == "bf16":
                extra = [k for k in given if k != "format"]
                if extra:
                    raise ValueError(
                        f"{at(extra[0])}: operand {op} is bf16 (high precision) and takes no "
                        f"{extra[0]}; give it a quantized format ({', '.join(FORMATS)})"
                    )
                specs.append(None)
                continue
            block = given.get("block")
            if block is not None and block[0] > 1 and op != "w":
                raise ValueError(
                    f"{at('block')}: 2-D blocks {block} are for the weight operand w only; "
                    f"allowed for {op}: [1, N]"
                )
            try:
                specs.append(QuantSpec.from_options(given))
            except ValueError as e:  # "<option>: ..." -> the YAML key that set it
                key, _, rest = str(e).partition(": ")
                key = key if key in OperandOptions.model_fields else "format"
                raise ValueError(f"{at(key)}: {rest}") from None
        h = None if self.hadamard is None else self.hadamard.spec()
        if h is not None and None in specs:
            raise ValueError(
                "hadamard: a Hadamard transform rotates both operands (the product is exact only "
                "then), so both need a quantized format; this GEMM has a bf16 operand"
            )
        return GemmRecipe(a=specs[0], b=specs[1], hadamard=h)

    @model_validator(mode="after")
    def _builds(self) -> _GemmOptions:
        # messages start with their path below the GEMM (x.block: ...); the GEMM's name in front
        # places them at their YAML path (gemms.fprop.x.block)
        if self.hadamard is not None:
            try:
                self.hadamard.spec()
            except ValueError as e:
                raise ValueError(f"{self.gemm}.hadamard.{e}") from None
        try:
            self.build()
        except ValueError as e:
            raise ValueError(f"{self.gemm}.{e}") from None
        return self


class FpropOptions(_GemmOptions):
    """fprop, Y = X W^T: operands x (activations) and w (weights), reduced over in_features."""

    gemm: ClassVar[str] = "fprop"
    x: OperandOptions | None = None
    w: OperandOptions | None = None


class DgradOptions(_GemmOptions):
    """dgrad, dX = dY W: operands dy (output gradient) and w (weights), reduced over out_features."""

    gemm: ClassVar[str] = "dgrad"
    dy: OperandOptions | None = None
    w: OperandOptions | None = None


class WgradOptions(_GemmOptions):
    """wgrad, dW = dY^T X: operands dy (output gradient) and x (activations), reduced over tokens."""

    gemm: ClassVar[str] = "wgrad"
    dy: OperandOptions | None = None
    x: OperandOptions | None = None


class ExplicitRecipe(BaseModel):
    """The explicit recipe: each GEMM's operands; a GEMM not given runs in the base format."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    """How cells and the report name this recipe (default: derived from the GEMMs)."""
    fprop: FpropOptions | None = None
    dgrad: DgradOptions | None = None
    wgrad: WgradOptions | None = None

    def build(self, base: str) -> Recipe:
        gemms = {}
        for g in GEMMS:
            spec: _GemmOptions | None = getattr(self, g)
            gemms[g] = base_gemm(g, base) if spec is None else spec.build()
        r = Recipe(fprop=gemms["fprop"], dgrad=gemms["dgrad"], wgrad=gemms["wgrad"])
        label = self.name
        if label is None and any(getattr(self, g) is None for g in GEMMS):
            label = r.short() + f"/{base}"  # the base decides the GEMMs not given
        return replace(r, label=label)


class LayerSelection(BaseModel):
    """Which linears of the transformer blocks follow the recipe (the rest: high precision)."""

    model_config = ConfigDict(extra="forbid")

    types: list[Literal["attention", "mlp"]] | None = None
    """attention (the q/k/v/o projections), mlp (the feed-forward linears); default: both."""
    blocks: list[int] | None = None
    """Block indices (negative: from the end, -1 the last); default: every block."""

    @field_validator("types", "blocks")
    @classmethod
    def _distinct(cls, v: list[Any] | None) -> list[Any] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"{v} must be a non-empty list of distinct values; omit it for all")
        return v


def check_recipe_name(v: str) -> str:
    """``v`` if it names a recipe; ValueError with a did-you-mean and the allowed names."""
    if v not in NAMED_RECIPES:
        hint = did_you_mean(v, list(NAMED_RECIPES))
        raise ValueError(f"unknown {v!r}{hint}; allowed: {', '.join(NAMED_RECIPES)}")
    return v


def explicit_recipe(
    recipe: str | None,
    gemms: ExplicitRecipe | None,
    base: str,
    *,
    keep_first: int,
    keep_last: int,
    layers: LayerSelection | None,
) -> Recipe:
    """The ``Recipe`` of a named recipe or an explicit ``gemms`` over ``base``, on the selected
    layers."""
    if recipe is not None:
        r = named_recipe(recipe, base)
    else:
        assert gemms is not None
        r = gemms.build(base)
    return select(r, keep_first=keep_first, keep_last=keep_last, layers=layers)


def select(r: Recipe, *, keep_first: int, keep_last: int, layers: LayerSelection | None) -> Recipe:
    """``r`` with the selection; the very recipe when nothing is selected (keys stay as they were)."""
    types = None if layers is None else layers.types
    blocks = None if layers is None else layers.blocks
    if not (keep_first or keep_last or types is not None or blocks is not None):
        return r
    return r.select(keep_first=keep_first, keep_last=keep_last, layer_types=types, blocks=blocks)


def recipe_axes(r: Recipe, base_format: str) -> dict[str, str]:
    """The recipe in the report's terms (``fp4_gemms``, ``intervention``, ``fp4_format``,
    ``base_format``), derived from the resolved GEMMs: the FP4 GEMMs, the format of their first FP4
    operand, and their intervention (``GemmRecipe.intervention``) as the grammar labels it
    (``backends.recipes.intervention.label``): one label when every FP4 GEMM has the same
    (``sr+rht64``), else one per FP4 GEMM (``fprop:none,dgrad:sr,wgrad:sr+fht16``), which the
    report's speedup model charges GEMM by GEMM."""
    fp4 = [g for g in GEMMS if r.gemm(g).is_fp4]
    fmt = next(
        (s.format for g in fp4 for s in (r.gemm(g).a, r.gemm(g).b) if s and s.fmt.is_fp4),
        "mxfp4",
    )
    return {
        "fp4_gemms": "+".join(fp4),
        "intervention": label({g: r.gemm(g).intervention() for g in fp4}),
        "fp4_format": fmt,
        "base_format": base_format,
    }


def uses_base(recipe: str | None, gemms: ExplicitRecipe | None) -> bool:
    """Whether the base format decides any GEMM of a named or explicit recipe."""
    if recipe is not None:
        return recipe in USES_BASE
    return gemms is not None and any(getattr(gemms, g) is None for g in GEMMS)


__all__ = [
    "DgradOptions",
    "FpropOptions",
    "ExplicitRecipe",
    "HadamardOptions",
    "LayerSelection",
    "OperandOptions",
    "check_recipe_name",
    "WgradOptions",
    "explicit_recipe",
    "recipe_axes",
    "select",
    "uses_base",
]
