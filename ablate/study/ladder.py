"""A study's ``ladder:`` section: a grid that varies model size and token budget is compared rung by
rung, and its fits predict each configuration's token ratio at the user's scale.

A rung is one (size, budget): the cells whose size axes and budget axes hold the same values. Each
rung has its own baseline cells and its own target; a configuration is the cell's label without
its rung and seed (``Cell.ladder_config``; ``ablate.study.rungs`` sets both).

    ladder:
      size: model.preset            # the axes that set the model's size (default: every model. axis)
      budget: train.steps           # the axes that set the token budget (default: train.steps)
      predict: {params: 8.0e9, tokens: 1.0e12}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MIN_BOOT, MAX_BOOT = 200, 20_000


class PredictAt(BaseModel):
    """The scale at which the ladder predicts each configuration's token ratio."""

    model_config = ConfigDict(extra="forbid")

    params: float = Field(gt=0, allow_inf_nan=False)
    """Non-embedding parameters N* of the model the prediction is for (e.g. 8.0e9)."""
    tokens: float = Field(gt=0, allow_inf_nan=False)
    """Tokens D* that model trains on (e.g. 1.0e12)."""


class LadderSection(BaseModel):
    """Compare rung by rung; fit and predict (``ablate.report.ladder.predict``)."""

    model_config = ConfigDict(extra="forbid")

    size: list[str] | None = None
    """Grid axes that set the model's size (default: every grid axis under ``model.``)."""
    budget: list[str] = Field(default_factory=lambda: ["train.steps"])
    """Grid axes that set the token budget (default: ``train.steps``)."""
    predict: PredictAt | None = None
    """Where to predict (no prediction without it: the rungs, the trend and the back-test)."""
    boot: int = Field(default=1000, ge=MIN_BOOT, le=MAX_BOOT)
    """Bootstrap replicates of the prediction's interval."""
    seed: int = Field(default=0, ge=0)
    """Seed of the bootstrap."""

    @field_validator("size", "budget", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v
