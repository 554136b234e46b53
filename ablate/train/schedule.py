"""The learning-rate schedule (``train.schedule``): linear warmup, then either a cosine decay to
``min_lr_ratio * lr`` at the schedule's end (``TrainConfig.schedule_end``), or warmup-stable-decay
(wsd): ``lr`` held, then a linear decay to ``min_lr_ratio * lr`` over the schedule's last
``decay_steps``; past the schedule's end, that floor.

The wsd decay is linear, as in the WSD-S paper (Wen et al. 2024; MiniCPM, Hu et al. 2024, decays
exponentially, and Hägele et al. 2024 find 1-sqrt a little better): the plainest shape with the
same two ends as the cosine, so that a study comparing the two changes one thing. Before its
decay a wsd schedule does not read ``steps``: runs of one config with different budgets share
that stretch step for step, which is what lets one run branch each budget's decay off
(``ablate.study.families``).
"""

from __future__ import annotations

import math

from ablate.train.config import TrainConfig


def lr_at(step: int, train_config: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then the decay of
    ``train.schedule`` over the schedule's steps, then the floor (a run trained past its schedule:
    ``schedule_steps``). A wsd run's last scheduled step trains at the floor."""
    t = train_config
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    floor = t.lr * t.min_lr_ratio
    if t.decay_start is not None:  # wsd
        if step < t.decay_start:
            return t.lr
        done = min(1.0, (step - t.decay_start + 1) / t.decay_steps)
        return floor + (t.lr - floor) * (1.0 - done)
    span = max(1, t.schedule_end - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return floor + (t.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
