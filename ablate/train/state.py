"""The trainer's progress: ``TrainState``, everything about a run that changes from step to step
apart from the model, optimizer, data position and RNG states (which ``checkpoint`` saves beside it).

``to_dict``/``from_dict`` give the plain dict a checkpoint stores under ``"state"``; its layout is
the one checkpoints have always had, so older checkpoints load and resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from ablate.train.result import EvalPoint, Status


@dataclass(kw_only=True, slots=True)
class TrainState:
    """Progress of one run: counters, evaluation history, the divergence guard and the outcome."""

    step: int = 0
    """Optimizer steps completed."""
    tokens: int = 0
    """Training tokens seen."""
    train_time: float = 0.0
    """Seconds spent in optimizer steps (evaluation and checkpointing excluded)."""
    evals: list[EvalPoint] = field(default_factory=list)
    """Validation history: step 0, every ``eval_every`` steps and the last step."""
    ema: float | None = None
    """Divergence guard: smoothed training loss (0.9 decay); None before the first finite step."""
    best_ema: float = math.inf
    """Divergence guard: lowest ``ema`` after warmup."""
    status: Status | None = None
    """How the run ended (``finished``, ``diverged``, ``stopped``); None while it trains."""
    reason: str = ""
    """Why the divergence guard fired; empty otherwise."""
    diverged_at: int | None = None
    """Step at which the divergence guard fired."""

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's ``"state"`` dict (plain values; evaluations as dicts)."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "train_time": self.train_time,
            "evals": [
                {"step": e.step, "tokens": e.tokens, "val_loss": e.val_loss} for e in self.evals
            ],
            "ema": self.ema,
            "best_ema": self.best_ema,
            "status": self.status,
            "reason": self.reason,
            "diverged_at": self.diverged_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        """Inverse of ``to_dict``; a missing key keeps its default, an unknown one is ignored."""
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["evals"] = [EvalPoint(**e) for e in d.get("evals", [])]
        return cls(**kw)
