"""A stop request during training (``train(..., stop=...)``: a SLURM job about to be requeued): the run
logs the steps it did, checkpoints there and ends ``stopped``; resumed, it recomputes nothing, logs
no step twice and ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import json

import torch
from test_loop import _cfg, _weights

from ablate.train import MemoryLogger, TrainConfig, train
from backends import Recipe

# log_every 4: steps 5 and 6 are not read from the device by themselves; stopping at 6 must read
# and log them before it checkpoints
TRAIN = TrainConfig(
    steps=12, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=3, eval_every=4, eval_batches=2,
    log_every=4, checkpoint_every=4,
)  # fmt: skip


def test_a_stop_request_checkpoints_at_that_step_and_the_resumed_run_is_bit_identical(tmp_path):
    recipe = Recipe.from_shorthand(["wgrad"], "sr+rht")
    whole = MemoryLogger()
    train(_cfg(tmp_path / "a", recipe=recipe, train=TRAIN), whole)
    cfg = _cfg(tmp_path / "b", recipe=recipe, train=TRAIN)
    parts = MemoryLogger()
    asked: list[int] = []

    def stop() -> bool:  # says so after the sixth step
        asked.append(1)
        return len(asked) >= 6

    stopped = train(cfg, parts, stop=stop)
    assert stopped.status == "stopped" and stopped.steps == 6
    assert parts.status == ("stopped", {"step": 6})
    sidecar = json.loads((tmp_path / "b" / "ckpt" / "checkpoint.json").read_text())
    assert sidecar["step"] == 6  # not the checkpoint of step 4: nothing to recompute
    assert [s for s, m in parts.metrics if "train_loss" in m] == [1, 2, 3, 4, 5, 6]
    res = train(cfg, parts, stop=lambda: False)
    assert res.status == "finished" and res.steps == 12
    steps = [s for s, m in parts.metrics if "val_ppl_by_tokens" not in m]
    assert steps == list(range(0, 13))  # each step once, across the stop
    for name in ("train_loss", "grad_norm", "lr", "val_loss"):
        assert parts.series(name) == whole.series(name), name
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_a_stop_request_at_the_last_step_finishes_the_run(tmp_path):
    res = train(_cfg(tmp_path, train=TRAIN), MemoryLogger(), stop=lambda: True)
    assert res.status == "stopped" and res.steps == 1  # asked after the first step
    res = train(_cfg(tmp_path, train=TRAIN), MemoryLogger(), stop=lambda: False)
    assert res.status == "finished" and res.steps == 12
