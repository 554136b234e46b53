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


# --- warmup-stable-decay ----------------------------------------------------------------------


def wsd(**kw) -> TrainConfig:
    return TrainConfig(
        **{"lr": 2.0, "warmup_steps": 4, "min_lr_ratio": 0.25, "schedule": "wsd"} | kw
    )


def test_wsd_holds_the_peak_then_decays_linearly_to_the_floor_on_its_last_step():
    t = wsd(steps=20, decay_fraction=0.2)  # 4 decay steps: 16..19
    assert t.decay_steps == 4 and t.decay_start == 16
    lrs = [lr_at(s, t) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert lrs[4:16] == [2.0] * 12  # the peak itself, not merely close to it
    assert lrs[16:] == pytest.approx([2.0 - 1.5 * k / 4 for k in (1, 2, 3, 4)])
    assert lrs[19] == 0.5  # the floor exactly
    assert lr_at(20, t) == lr_at(100, t) == 0.5


def test_the_decay_is_max_1_and_round_of_the_fraction_of_steps():
    assert wsd(steps=12, decay_fraction=0.2).decay_steps == 2  # round(2.4)
    assert wsd(steps=10, decay_fraction=0.25).decay_steps == 2  # round(2.5): half to even
    assert wsd(steps=8, decay_fraction=0.01).decay_steps == 1  # at least one step
    one = wsd(steps=8, decay_fraction=0.01)
    assert [lr_at(s, one) for s in range(4, 8)] == [2.0, 2.0, 2.0, 0.5]
    assert wsd(steps=8, warmup_steps=0, decay_fraction=1.0).decay_start == 0
    cos = TrainConfig(steps=20)
    assert (cos.decay_steps, cos.decay_start) == (0, None)


def test_the_stable_stretch_of_wsd_does_not_read_steps():
    # a budget's decay branches off a longer run: up to its decay, every run of the config is
    # the same, float for float
    longest = wsd(steps=64)
    for steps in range(8, 64):
        t = wsd(steps=steps)
        assert t.decay_start is not None
        assert [lr_at(s, t) for s in range(t.decay_start)] == [
            lr_at(s, longest) for s in range(t.decay_start)
        ]


def test_a_wsd_run_past_its_schedule_follows_it_exactly_then_stays_at_the_floor():
    ordinary = wsd(steps=40)
    longer = wsd(steps=60, schedule_steps=40)
    assert longer.decay_steps == ordinary.decay_steps == 8
    assert [lr_at(s, longer) for s in range(40)] == [lr_at(s, ordinary) for s in range(40)]
    assert [lr_at(s, longer) for s in range(40, 60)] == [0.5] * 20
