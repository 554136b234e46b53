"""A cell's precision schedule in the study's words: ``warmup`` (the first steps under another
recipe) and ``tail`` (the last ones), each a section of a cell like ``train``, so that a grid
varies them by their dotted paths (``warmup.first: [0, 0.02, 0.05]``)::

    warmup: {recipe: fp8, first: 0.05}                # FP8 for the first 5% of train.steps
    tail: {recipe: bf16, gemms: [fprop], last: 0.1}   # BF16 forward GEMMs for the last 10%

``recipe`` is a base format (``bf16``, ``fp8``, ``mxfp8``: every GEMM it replaces in that format)
or a named recipe (``ablate recipe``); ``gemms`` the GEMMs the phase replaces (default all three:
the others keep the cell's recipe), on the layers the cell's recipe selects. ``first`` and
``last`` are lengths: a fraction of ``train.steps`` (a float in [0, 1]) or a number of steps (an
integer); 0 is no phase, and the cell is the one without it (its key too). ``phases`` makes the
trainer's ``ablate.train.phases.Phase`` of them; ``timeline_axes`` describes the segments in the
report's terms, for the speedup model to weigh."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ablate.study.messages import did_you_mean
from ablate.study.speedup import format_name
from ablate.train.phases import Phase, shares
from backends.recipes import GEMMS, NAMED_RECIPES, Gemm, Recipe, named_recipe
from backends.recipes.intervention import label

BASE_WORDS = ("bf16", "fp8", "mxfp8")
"""A phase recipe that is a format: every GEMM the phase replaces in it."""

Length = float | int


class PhaseSection(BaseModel):
    """What a phase trains under: the recipe, and which of the cell's GEMMs it replaces."""

    model_config = ConfigDict(extra="forbid")

    recipe: str
    """bf16, fp8, mxfp8 (every GEMM it replaces in that format) or a named recipe."""
    gemms: list[Gemm] = Field(default_factory=lambda: list(GEMMS))
    """The GEMMs the phase replaces (default all three); the others keep the cell's recipe."""

    @field_validator("recipe")
    @classmethod
    def _known(cls, v: str) -> str:
        allowed = [*BASE_WORDS, *NAMED_RECIPES]
        if v not in allowed:
            hint = did_you_mean(v, allowed)
            raise ValueError(f"unknown recipe {v!r}{hint}; allowed: {', '.join(allowed)}")
        return v

    @field_validator("gemms")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"{v} is not a list of distinct GEMMs; allowed: {', '.join(GEMMS)}")
        return [g for g in GEMMS if g in v]

    def build(self, own: Recipe, base_format: str) -> Recipe:
        """The phase's recipe: ``own`` with the GEMMs it replaces taken from its ``recipe``."""
        if self.recipe == "bf16":
            source = Recipe.bf16()
        elif self.recipe in BASE_WORDS:
            source = Recipe.from_shorthand([], base=self.recipe)
        else:
            source = named_recipe(self.recipe, base_format)
        whole = len(self.gemms) == len(GEMMS)
        gemms: dict[str, Any] = {g: source.gemm(g) for g in self.gemms}
        name = source.short() if whole else f"{source.short()}[{','.join(self.gemms)}]"
        return dataclasses.replace(own, **gemms, label=name)


def _length(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or math.isnan(v):
        raise ValueError(
            f"{v!r} is not a length: a fraction of train.steps (a float in [0, 1]) or a number "
            "of steps (an integer >= 0)"
        )
    if isinstance(v, float) and v > 1:
        raise ValueError(
            f"{v:g} is past the budget: a fraction of train.steps is at most 1.0 (an integer is "
            "a number of steps)"
        )
    return v


class Warmup(PhaseSection):
    """The first steps of a cell under another recipe (an FP8 warmup before MXFP4)."""

    first: Length
    """How long: a fraction of train.steps (0.05) or a number of steps (200)."""

    _check_first = field_validator("first", mode="before")(_length)


class Tail(PhaseSection):
    """The last steps of a cell under another recipe (BF16 forward GEMMs at the end)."""

    last: Length
    """How long: a fraction of train.steps (0.1) or a number of steps (200)."""

    _check_last = field_validator("last", mode="before")(_length)


def steps_of(length: Length, steps: int, path: str) -> int:
    """A length in steps: a float is a fraction of ``steps`` (rounded half up)."""
    n = math.floor(length * steps + 0.5) if isinstance(length, float) else length
    if n > steps:
        raise ValueError(f"{path}: {length} steps is past the budget of train.steps = {steps}")
    return n


def phases(
    warmup: Warmup | None, tail: Tail | None, own: Recipe, base_format: str, steps: int
) -> tuple[Phase, ...]:
    """The trainer's phases of a cell (ValueError naming the field where they do not fit)."""
    out = []
    first = steps_of(warmup.first, steps, "warmup.first") if warmup else 0
    last = steps_of(tail.last, steps, "tail.last") if tail else 0
    if first + last > steps:
        raise ValueError(
            f"tail.last: the warmup's {first} steps and the tail's {last} overlap in "
            f"train.steps = {steps}; shorten warmup.first or tail.last"
        )
    if warmup is not None:
        out.append(Phase(0, first, warmup.build(own, base_format), "warmup"))
    if tail is not None:
        out.append(Phase(steps - last, steps, tail.build(own, base_format), "tail"))
    return tuple(out)


def role_axes(r: Recipe) -> dict[str, dict[str, str]]:
    """Per GEMM, its format's family (``bf16``, ``fp8``, ``mxfp4``...) and, for an FP4 GEMM, its
    intervention's label: what the speedup model charges."""
    out: dict[str, dict[str, str]] = {}
    for g in GEMMS:
        gr = r.gemm(g)
        spec = gr.a or gr.b
        fmt = "bf16" if gr.high_precision or spec is None else format_name(spec.format)
        out[g] = {"format": fmt} | ({"intervention": label(gr.intervention())} if gr.is_fp4 else {})
    return out


def timeline_axes(ps: tuple[Phase, ...], own: Recipe, steps: int) -> str:
    """The cell's segments for the report's speedup model, as JSON: each segment's share of the
    steps and its GEMMs (``role_axes``); "" for a cell without phases."""
    if not ps:
        return ""
    return json.dumps([{"share": s, "gemms": role_axes(r)} for s, r in shares(ps, own, steps)])
