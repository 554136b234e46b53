"""A ladder study's rungs (``ablate.study.ladder``): every cell's rung and configuration across
rungs, and what makes a ladder that cannot be compared or fitted, each problem naming its field."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ablate.study.axes import fmt_value
from ablate.study.cells import Cell
from ablate.study.ladder import LadderSection


def _rung_axes(ladder: LadderSection, axes: Sequence[str]) -> tuple[list[str], list[str]]:
    size = ladder.size if ladder.size is not None else [a for a in axes if a.startswith("model.")]
    return list(size), list(ladder.budget)


def ladder_cells(
    ladder: LadderSection, cells: list[Cell], axes: Sequence[str]
) -> tuple[list[Cell], list[str]]:
    """``cells`` with their rung and ladder configuration set, and the ladder's problems (empty
    when it can be compared and fitted)."""
    size, budget = _rung_axes(ladder, axes)
    errors = []
    for field, names in (("size", size), ("budget", budget)):
        for a in names:
            if a not in axes:
                errors.append(
                    f"ladder.{field}: {a} is not an axis of the grid (axes: {', '.join(axes)})"
                )
    if not size:
        errors.append(
            "ladder.size: the grid varies no model. axis; vary model.preset (or the model's "
            "shape, or model.hf) across at least two sizes, or name the axes here"
        )
    if errors:
        return cells, errors
    rung_axes = [*size, *budget]
    out = []
    for c in cells:
        rung = "/".join(f"{a.rpartition('.')[2]}={fmt_value(c.values[a])}" for a in rung_axes)
        parts = [p for p in c.config_label.split("/") if p not in rung.split("/")]
        out.append(dataclasses.replace(c, rung=rung, ladder_config="/".join(parts) or "all"))
    by_rung: dict[str, list[Any]] = {}
    for c in out:
        by_rung.setdefault(c.rung, []).append(c)
    sizes = {tuple(fmt_value(c.values[a]) for a in size) for c in out}
    budgets = {tuple(fmt_value(c.values[a]) for a in budget) for c in out}
    if len(sizes) < 2:
        errors.append(f"ladder.size: {', '.join(size)} takes one value; a ladder needs two sizes")
    if len(budgets) < 2:
        errors.append(
            f"ladder.budget: {', '.join(budget)} takes one value; Quartet's law needs two "
            "budgets per size"
        )
    for rung, members in sorted(by_rung.items()):
        if not any(c.baseline for c in members):
            errors.append(
                f"ladder: rung {rung} has no baseline cells (baseline: must match a "
                "configuration in every rung)"
            )
        shapes = {
            (repr(c.config.model.to_dict()), c.config.train.steps * c.config.train.tokens_per_step)
            for c in members
        }
        if len(shapes) > 1:
            errors.append(
                f"ladder: rung {rung} holds cells of different sizes or token budgets; add the "
                "axes that change them to ladder.size or ladder.budget"
            )
    return out, errors
