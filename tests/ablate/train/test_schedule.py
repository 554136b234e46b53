"""The learning-rate schedule: linear warmup to ``lr``, cosine decay to ``min_lr_ratio * lr``."""

from __future__ import annotations

import pytest

from ablate.train.config import TrainConfig
from ablate.train.schedule import lr_at


def test_warmup_is_linear_and_reaches_the_peak_on_its_last_step():
    t = TrainConfig(steps=50, lr=2.0, warmup_steps=4, min_lr_ratio=0.25)
    assert [lr_at(s, t) for s in range(4)] == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_cosine_starts_at_the_peak_and_ends_at_the_floor():
    t = TrainConfig(steps=50, lr=2.0, warmup_steps=10, min_lr_ratio=0.25)
    assert lr_at(10, t) == pytest.approx(2.0)
    assert lr_at(30, t) == pytest.approx(0.5 + 1.5 * 0.5)  # halfway: mean of peak and floor
    assert lr_at(50, t) == pytest.approx(0.5)
    assert lr_at(500, t) == pytest.approx(0.5)  # past the end it stays at the floor
    lrs = [lr_at(s, t) for s in range(10, 51)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_no_warmup_starts_at_the_peak():
    t = TrainConfig(steps=10, lr=1.0, warmup_steps=0, min_lr_ratio=0.0)
    assert lr_at(0, t) == pytest.approx(1.0)
    assert lr_at(10, t) == pytest.approx(0.0)


def test_a_run_past_its_schedule_follows_it_exactly_then_stays_at_the_floor():
    ordinary = TrainConfig(steps=50, lr=2.0, warmup_steps=10, min_lr_ratio=0.25)
    longer = TrainConfig(steps=75, schedule_steps=50, lr=2.0, warmup_steps=10, min_lr_ratio=0.25)
    # the same floats, not merely close: the first 50 steps are an ordinary run's
    assert [lr_at(s, longer) for s in range(50)] == [lr_at(s, ordinary) for s in range(50)]
    assert [lr_at(s, longer) for s in range(50, 75)] == [0.5] * 25
    # a cosine stretched over 75 steps would be a different run: still above the floor at 50
    assert lr_at(50, TrainConfig(steps=75, lr=2.0, warmup_steps=10, min_lr_ratio=0.25)) > 0.6
