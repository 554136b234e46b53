"""Sequential seeds as a study writes them: ``seeds: {initial, step, max, margin}`` instead of a
seed axis. ``SeedPlan`` is the section, ``plan_problems`` what a study with one must also satisfy,
and ``with_seed_axis`` the study as expanded: every seed up to ``max`` is a cell with the key it
would have on a written ``seed`` axis (``ablate run`` trains them in waves: ``ablate.driver.waves``
trains them, ``ablate.report.waves`` replays them and ``ablate.report.sequential`` judges each)."""

from __future__ import annotations

import copy
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

N_MIN = 3
"""The fewest pairs a comparison is judged on (two degrees of freedom; ``report.sequential``)."""
MAX_SEEDS = 100


class SeedPlan(BaseModel):
    """Seeds trained in waves until each comparison with the baseline is decided."""

    model_config = ConfigDict(extra="forbid")

    initial: int = Field(default=3, ge=N_MIN, le=MAX_SEEDS, strict=True)
    """Seeds of every configuration in the first wave (at least 3: a comparison is judged on
    three or more pairs)."""
    step: int = Field(default=2, ge=1, le=MAX_SEEDS, strict=True)
    """Seeds added to each configuration still open after a wave."""
    max: int = Field(default=10, ge=N_MIN, le=MAX_SEEDS, strict=True)
    """The most seeds a configuration gets; the error is controlled over every look up to it."""
    margin: float = Field(default=0.05, gt=0, lt=1, allow_inf_nan=False)
    """Token costs within this fraction of each other are *equivalent* (0.05: +-5%)."""

    @field_validator("margin", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        if isinstance(v, bool):  # pydantic reads true as 1
            raise ValueError(f"a fraction in (0, 1), not {v!r}")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> SeedPlan:
        if self.initial > self.max:
            raise ValueError(f"initial: {self.initial} is more than max ({self.max})")
        return self

    @property
    def log_margin(self) -> float:
        return math.log1p(self.margin)

    def looks(self) -> list[int]:
        """Seeds per configuration at each look: ``initial``, then ``step`` more up to ``max``."""
        return [*range(self.initial, self.max, self.step), self.max]


def _grids(raw: dict[str, Any]) -> list[dict[str, Any]]:
    g = raw.get("grid")
    return [x for x in (g if isinstance(g, list) else [g]) if isinstance(x, dict)]


def plan_problems(raw: dict[str, Any]) -> list[str]:
    """What a study with ``seeds:`` must not write (its seeds come from the plan: no seed in
    ``base``, a grid, ``exclude`` or ``baseline``), and what it must: a baseline to compare with,
    and a target of its own (a target derived from the baseline's seeds would move as the waves
    add them, and every look's pairs with it)."""
    if not isinstance(raw.get("seeds"), dict):
        return []
    out = []
    base = raw.get("base")
    if isinstance(base, dict) and "seed" in base:
        out.append("base.seed: a study with seeds: trains seeds 0 to seeds.max - 1; remove it")
    for g in _grids(raw):
        if "seed" in g or any(isinstance(z, dict) and "seed" in z for z in [g.get("zip")]):
            out.append("grid.seed: a study with seeds: sets its seeds itself; remove the seed axis")
            break
    exclude = raw.get("exclude")
    for i, x in enumerate(exclude if isinstance(exclude, list) else []):
        if isinstance(x, dict) and "seed" in x:
            out.append(
                f"exclude[{i}].seed: a study with seeds: trains seeds 0 to seeds.max - 1 of "
                "every configuration in waves, each seed a pair with the baseline's; a seed left "
                "out would be a missing pair; remove it (or write a seed axis instead of seeds:)"
            )
    baseline = raw.get("baseline")
    if baseline is None:
        out.append("baseline: a study with seeds: compares each configuration with a baseline")
    elif isinstance(baseline, dict) and "seed" in baseline:
        out.append(
            "baseline.seed: a study with seeds: pairs every seed of a configuration with the "
            "baseline's seed of the same number; remove it (the baseline gets every seed)"
        )
    target = raw.get("target")
    if not (isinstance(target, dict) and ("val_ppl" in target or "val_loss" in target)):
        out.append(
            "target: a study with seeds: needs val_ppl or val_loss (a target from the baseline "
            "would move as each wave adds baseline seeds)"
        )
    if raw.get("ladder") is not None or raw.get("tune") is not None:
        out.append("seeds: not with ladder or tune")
    return out


def with_seed_axis(raw: dict[str, Any], plan: SeedPlan) -> dict[str, Any]:
    """``raw`` with ``seed: [0, ..., max - 1]`` on every grid mapping."""
    out = copy.deepcopy(raw)
    seeds = list(range(plan.max))
    if isinstance(out.get("grid"), list):
        out["grid"] = [{**g, "seed": seeds} if isinstance(g, dict) else g for g in out["grid"]]
    elif isinstance(out.get("grid"), dict):
        out["grid"] = {**out["grid"], "seed": seeds}
    return out
