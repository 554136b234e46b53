"""``TrainState``: a typed run state whose dict form is the checkpoint's ``"state"`` layout."""

from __future__ import annotations

import math

from ablate.train.result import EvalPoint
from ablate.train.state import TrainState

# the checkpoint's "state" dict as checkpoints have always stored it (keys in this order)
OLD_LAYOUT = {
    "step": 8,
    "tokens": 4096,
    "train_time": 1.25,
    "evals": [
        {"step": 0, "tokens": 0, "val_loss": 5.5},
        {"step": 4, "tokens": 2048, "val_loss": 4.0},
    ],
    "ema": 4.2,
    "best_ema": 4.1,
    "status": None,
    "reason": "",
    "diverged_at": None,
}


def test_a_fresh_state_is_what_a_new_run_starts_from():
    s = TrainState()
    assert s.to_dict() == {
        "step": 0,
        "tokens": 0,
        "train_time": 0.0,
        "evals": [],
        "ema": None,
        "best_ema": math.inf,
        "status": None,
        "reason": "",
        "diverged_at": None,
    }


def test_round_trip_through_the_dict():
    s = TrainState(
        step=7,
        tokens=3584,
        train_time=2.5,
        evals=[
            EvalPoint(step=0, tokens=0, val_loss=5.5),
            EvalPoint(step=4, tokens=2048, val_loss=4),
        ],
        ema=4.3,
        best_ema=4.2,
        status="diverged",
        reason="loss 9 exceeds 3 ln(vocab) = 16.6",
        diverged_at=7,
    )
    assert TrainState.from_dict(s.to_dict()) == s
    assert TrainState.from_dict(TrainState().to_dict()) == TrainState()


def test_the_dict_has_the_old_checkpoint_layout():
    s = TrainState.from_dict(OLD_LAYOUT)
    assert s.step == 8 and s.tokens == 4096 and s.train_time == 1.25
    assert s.evals == [
        EvalPoint(step=0, tokens=0, val_loss=5.5),
        EvalPoint(step=4, tokens=2048, val_loss=4.0),
    ]
    assert s.ema == 4.2 and s.best_ema == 4.1 and s.status is None and s.diverged_at is None
    d = s.to_dict()
    assert d == OLD_LAYOUT and list(d) == list(OLD_LAYOUT)


def test_a_missing_key_keeps_its_default():
    s = TrainState.from_dict({"step": 3, "tokens": 12})
    assert s == TrainState(step=3, tokens=12)
