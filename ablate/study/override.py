"""Partial overrides of a named recipe: start from one and change any GEMM or operand field.

An ablation changes one thing of a published recipe ("NVIDIA's recipe without its RHT"); instead
of writing the whole ``gemms:`` form, a study names the recipe and what differs::

    recipe: {name: nvidia_nvfp4, wgrad: {hadamard: null}}          # no Hadamard on wgrad
    recipe:
      name: four_over_six
      fprop: {scale_rule: null}                                    # plain NVFP4 forward
      dgrad: {dy: {rounding: rne, prescale: false}}                # one operand
      wgrad: {hadamard: {signs: random}}                           # one key of the transform
      label: fos-rne-dy                                            # optional: the cell's name

The keys are those of ``gemms:`` (``ablate.study.recipe``): under a GEMM, keys for both of its
operands (format, rounding, prescale, scale_mode, block, scale_rule, outer_block), an operand's
own under its tensor name (fprop: x, w; dgrad: dy, w; wgrad: dy, x), and ``hadamard``. The
override is applied to the named recipe written out in that form (``Recipe.explicit``):

- a key replaces the recipe's value (a GEMM key on both operands); ``null`` removes it, so the
  default applies (``scale_rule: null``: no Four Over Six; ``hadamard: null``: no transform);
- a new ``format`` also drops the old format's block, scale mode, scale rule and outer block
  (the operand takes the new format's defaults), and ``format: bf16`` every other key;
- ``hadamard: {...}`` changes only the keys it gives; a new size or sign policy drops the
  recipe's own sign vector (it belongs to one size and to fixed signs).

The result is checked like any ``gemms:`` recipe, and errors name their path under ``recipe``
(``recipe.dgrad.dy.rounding: ...``) and the allowed values. A variant's label says it is one: the recipe's name, ``~``,
then what changed (``nvidia_nvfp4~wgrad.hadamard=none``), unless ``label`` names it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from ablate.study.messages import pydantic_errors
from ablate.study.recipe import ExplicitRecipe, OperandOptions, check_recipe_name
from backends.quant.operand import FORMAT_OPTIONS
from backends.recipes import GEMMS, OPERANDS, Recipe, named_recipe

OPERAND_KEYS = tuple(OperandOptions.model_fields)
FORMAT_KEYS = FORMAT_OPTIONS
"""What belongs to an operand's format and goes when the format changes (``QuantSpec``'s options
declared ``of_format``)."""


class _SetOnly(BaseModel):
    """Dumps only the keys the study gave (an explicit null included): an override's value, as
    labels and cell matching see it, is what was written."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        d: dict[str, Any] = handler(self)
        return {k: v for k, v in d.items() if k in self.model_fields_set}


class OperandPatch(OperandOptions, _SetOnly):
    """Changes to one operand (keys as ``OperandOptions``; null: back to the default)."""


class HadamardPatch(_SetOnly):
    """Changes to a GEMM's Hadamard transform (size, signs, vector; keys not given stay)."""

    size: int | None = None
    signs: str | None = None
    vector: list[int] | None = None


class _GemmPatch(OperandPatch):
    hadamard: HadamardPatch | None = None
    """null: no Hadamard transform; a mapping: change those keys of it."""


class FpropPatch(_GemmPatch):
    x: OperandPatch | None = None
    w: OperandPatch | None = None


class DgradPatch(_GemmPatch):
    dy: OperandPatch | None = None
    w: OperandPatch | None = None


class WgradPatch(_GemmPatch):
    dy: OperandPatch | None = None
    x: OperandPatch | None = None


class RecipeOverride(_SetOnly):
    """A named recipe with some GEMM or operand fields changed (see the module docstring)."""

    name: str
    """The named recipe to start from (``ablate recipe NAME`` shows it)."""
    fprop: FpropPatch | None = None
    dgrad: DgradPatch | None = None
    wgrad: WgradPatch | None = None
    label: str | None = None
    """How cells and the report name the variant (default: the name, ``~``, what changed)."""

    def model_post_init(self, context: Any) -> None:
        try:
            check_recipe_name(self.name)
        except ValueError as e:
            raise ValueError(f"name: {e}") from None
        if not any(getattr(self, g) is not None for g in GEMMS):
            raise ValueError(
                f"a variant of {self.name} changes at least one GEMM: give fprop, dgrad or "
                f"wgrad (or write recipe: {self.name})"
            )

    @classmethod
    def parse(cls, v: Any) -> RecipeOverride:
        """The override of a study's ``recipe:`` mapping; ValueError naming the path of its first
        problem below ``recipe`` and the allowed values."""
        try:
            return cls.model_validate(v)
        except ValidationError as e:
            raise ValueError(_under_recipe(pydantic_errors(e, cls)[0])) from None

    def build(self, base: str) -> Recipe:
        """The variant of ``named_recipe(name, base)``; ValueError starting with the path of what
        is wrong below ``recipe``."""
        named = named_recipe(self.name, base)
        explicit = named.explicit()
        for g in GEMMS:
            patch: _GemmPatch | None = getattr(self, g)
            if patch is not None:
                _apply(explicit[g], patch, g)
        try:
            r = ExplicitRecipe.model_validate(explicit).build(base)
        except ValidationError as e:
            raise ValueError(_under_recipe(pydantic_errors(e, ExplicitRecipe)[0])) from None
        return replace(r, label=self.label or variant_label(named.short(), self))

    def changes(self) -> list[tuple[str, Any]]:
        """(dotted path, value) of every change, in GEMM and operand order."""
        out: list[tuple[str, Any]] = []
        for g in GEMMS:
            patch: _GemmPatch | None = getattr(self, g)
            if patch is None:
                continue
            out += [(f"{g}.{k}", getattr(patch, k)) for k in _given(patch, OPERAND_KEYS)]
            for op in OPERANDS[g]:
                o: OperandPatch | None = getattr(patch, op)
                if o is not None:
                    out += [(f"{g}.{op}.{k}", getattr(o, k)) for k in _given(o, OPERAND_KEYS)]
            if "hadamard" in patch.model_fields_set:
                h = patch.hadamard
                if h is None:
                    out.append((f"{g}.hadamard", None))
                else:
                    keys = _given(h, ("size", "signs", "vector"))
                    out += [(f"{g}.hadamard.{k}", getattr(h, k)) for k in keys]
        return out


def _given(m: BaseModel, keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if k in m.model_fields_set]


def _apply(gemm: dict[str, Any], patch: _GemmPatch, g: str) -> None:
    """Change the explicit form of one GEMM (``Recipe.explicit``'s dict) in place."""
    shared = {k: getattr(patch, k) for k in _given(patch, OPERAND_KEYS)}
    for op in OPERANDS[g]:
        own: OperandPatch | None = getattr(patch, op)
        keys = dict(shared)
        if own is not None:
            keys.update({k: getattr(own, k) for k in _given(own, OPERAND_KEYS)})
        _patch_operand(gemm[op], keys)
    if "hadamard" in patch.model_fields_set:
        h = patch.hadamard
        if h is None:
            gemm.pop("hadamard", None)
        else:
            new = {k: getattr(h, k) for k in _given(h, ("size", "signs", "vector"))}
            had = dict(gemm.get("hadamard") or {})
            if ("size" in new or "signs" in new) and "vector" not in new:
                had.pop("vector", None)
            had.update(new)
            gemm["hadamard"] = {k: v for k, v in had.items() if v is not None}


def _patch_operand(operand: dict[str, Any], keys: dict[str, Any]) -> None:
    fmt = keys.get("format")
    if fmt is not None and fmt != operand.get("format"):
        for k in list(operand):
            if k in FORMAT_KEYS or (fmt == "bf16" and k != "format"):
                del operand[k]
    for k, v in keys.items():
        if v is None:
            operand.pop(k, None)
        else:
            operand[k] = v


def _under_recipe(msg: str) -> str:
    """A message placed at its path below ``recipe`` (``recipe.wgrad.dy.rounding: ...``)."""
    head, sep, _ = msg.partition(": ")
    return f"recipe.{msg}" if sep and " " not in head else f"recipe: {msg}"


def _value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "x".join(_value(x) for x in v)
    return str(v)


def variant_label(name: str, ov: RecipeOverride) -> str:
    """``name~path=value,path=value``: what a variant changed, as its cells are named."""
    return name + "~" + ",".join(f"{p}={_value(v)}" for p, v in ov.changes())


__all__ = ["OPERAND_KEYS", "RecipeOverride", "variant_label"]
