"""The learning-rate schedule: linear warmup, then cosine decay to ``min_lr_ratio * lr`` at the
schedule's end (``TrainConfig.schedule_end``), and that floor for any step past it."""

from __future__ import annotations

import math

from ablate.train.config import TrainConfig


def lr_at(step: int, train_config: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine decay over
    the schedule's steps, then the floor (a run trained past its schedule: ``schedule_steps``)."""
    t = train_config
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.schedule_end - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    floor = t.lr * t.min_lr_ratio
    return floor + (t.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
