"""What a run returns: ``RunResult`` (how it ended, its validation history as ``EvalPoint``s, its
throughput) and ``Status``, the ways a run ends."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Status = Literal["finished", "diverged", "stopped"]


@dataclass(kw_only=True)
class EvalPoint:
    step: int
    tokens: int
    val_loss: float

    @property
    def val_ppl(self) -> float:
        return math.exp(min(self.val_loss, 700.0))


@dataclass(kw_only=True)
class RunResult:
    """What a run returns (and what a study records per cell)."""

    status: Status
    steps: int
    """Optimizer steps completed."""
    tokens: int
    """Training tokens seen."""
    evals: list[EvalPoint]
    """Validation history (step 0, every eval_every steps, and the end)."""
    tokens_per_s: float
    """Training throughput (evaluation excluded)."""
    fingerprint: str
    """Data fingerprint: corpus and tokenizer identity."""
    diverged_at: int | None = None
    """Step at which the divergence guard fired."""
    reason: str = ""
    wall_time_s: float = 0.0
    n_params: int = 0

    @property
    def final_val_loss(self) -> float:
        return self.evals[-1].val_loss if self.evals else math.nan

    @property
    def final_val_ppl(self) -> float:
        return self.evals[-1].val_ppl if self.evals else math.nan

    @property
    def best_val_loss(self) -> float:
        return min((e.val_loss for e in self.evals), default=math.nan)
