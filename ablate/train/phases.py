"""Precision schedules: a run whose recipe changes at stated steps (``Phase``), as the 2026 FP4
runs train (an FP8 warmup before MXFP4, a BF16 tail after NVFP4).

A run has its own recipe (``RunConfig.recipe``, the one a study compares) and, optionally, phases:
half-open step ranges ``[start, end)`` of optimizer steps trained under another recipe. Step ``i``
(the ``i``-th optimizer step, counted from 0) trains under the phase that holds ``i``, else under
the run's recipe; an evaluation after step ``i`` runs under the recipe that trained it. A run
without phases is today's run and keeps its key; a phase that is empty or repeats the run's own
recipe is dropped (``normalized``), so spelling one that changes nothing changes no key.

``timeline`` is the whole run as segments, ``prefix`` what a run trains before a step: two runs
whose prefixes agree, and whose configs agree but for their recipes and phases, are the same run
step for step, bits included, up to that step (``ablate.driver.branching`` trains such a shared
prefix once). Only the standard library and ``backends.recipes`` here: the study imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.recipes import Recipe


@dataclass(frozen=True, slots=True)
class Phase:
    """Optimizer steps ``[start, end)`` trained under ``recipe`` instead of the run's own."""

    start: int
    end: int
    recipe: Recipe
    name: str = ""
    """What the study called it (``warmup``, ``tail``): labels and records only, not the key."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "recipe": self.recipe.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Phase:
        unknown = sorted(set(d) - {"name", "start", "end", "recipe"})
        if unknown:
            raise ValueError(f"phases: unknown key(s) {unknown}; allowed: name, start, end, recipe")
        return cls(
            start=_step(d.get("start"), "start"),
            end=_step(d.get("end"), "end"),
            recipe=Recipe.from_dict(d["recipe"]),
            name=str(d.get("name", "")),
        )

    def key(self) -> dict[str, Any]:
        """What a run's key holds of this phase."""
        return {"start": self.start, "end": self.end, "recipe": self.recipe.to_dict()}


def _step(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"phases: {what} must be a step (an integer), got {v!r}")
    return v


def check(phases: Sequence[Phase], steps: int) -> None:
    """ValueError unless the phases lie within the run's ``steps``, in order, without overlap."""
    for i, p in enumerate(phases):
        where = f"phases[{i}]" + (f" ({p.name})" if p.name else "")
        if not 0 <= p.start <= p.end <= steps:
            raise ValueError(
                f"{where}: steps [{p.start}, {p.end}) do not lie within the run's "
                f"{steps} steps (0 <= start <= end <= train.steps)"
            )
        if i and p.start < phases[i - 1].end:
            before = phases[i - 1]
            raise ValueError(
                f"{where}: starts at step {p.start}, before the phase ahead of it "
                f"({before.name or f'phases[{i - 1}]'}) ends at {before.end}; phases are in "
                "order and do not overlap"
            )


def normalized(phases: Iterable[Phase], own: Recipe) -> tuple[Phase, ...]:
    """The phases that change something: empty ones and those under the run's own recipe
    dropped."""
    return tuple(p for p in phases if p.end > p.start and p.recipe != own)


def recipe_at(phases: Sequence[Phase], own: Recipe, step: int) -> Recipe:
    """The recipe that trains optimizer step ``step`` (counted from 0)."""
    for p in phases:
        if p.start <= step < p.end:
            return p.recipe
    return own


def timeline(phases: Sequence[Phase], own: Recipe, steps: int) -> list[tuple[int, int, Recipe]]:
    """The run as ``(start, end, recipe)`` segments covering ``[0, steps)``, adjacent segments of
    one recipe merged."""
    out: list[tuple[int, int, Recipe]] = []
    at = 0
    for p in (*phases, Phase(steps, steps, own)):
        for a, b, r in ((at, p.start, own), (p.start, p.end, p.recipe)):
            if b <= a:
                continue
            if out and out[-1][2] == r and out[-1][1] == a:
                out[-1] = (out[-1][0], b, r)
            else:
                out.append((a, b, r))
        at = max(at, p.end)
    return out


def switches(phases: Sequence[Phase], own: Recipe, steps: int) -> list[int]:
    """The steps where the recipe changes (a segment's start, past step 0)."""
    return [a for a, _, _ in timeline(phases, own, steps)[1:]]


def prefix(
    phases: Sequence[Phase], own: Recipe, steps: int, upto: int
) -> list[tuple[int, int, dict[str, Any]]]:
    """What the run trains before step ``upto``: its segments cut there, recipes as their
    canonical dicts (the part of a key two runs share when they agree up to ``upto``)."""
    out = []
    for a, b, r in timeline(phases, own, steps):
        if a >= upto:
            break
        out.append((a, min(b, upto), r.to_dict()))
    return out


def quantizes(phases: Sequence[Phase], own: Recipe) -> Recipe | None:
    """A recipe of the run that quantizes (its own first), or None: the run never does and its
    model stays plain."""
    for r in (own, *(p.recipe for p in phases)):
        if not r.high_precision:
            return r
    return None


def shares(phases: Sequence[Phase], own: Recipe, steps: int) -> list[tuple[float, Recipe]]:
    """Each segment's share of the run's steps, with its recipe (the plan and the report weigh
    a schedule's step time by them)."""
    return [((b - a) / steps, r) for a, b, r in timeline(phases, own, steps)] if steps else []
