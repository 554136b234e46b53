"""Precision schedules (``ablate.train.phases``): a run whose recipe changes at stated steps.

Pinned: the phases' arithmetic (timeline, prefix, shares, the checks and what is dropped); a run
without phases keeps its key; a run with an FP8 warmup trains its warmup bit for bit as the FP8
run does (the prefix two such runs share), and its own recipe after it; a BF16 tail trains the
steps before it as the run without one; the run records each switch's step; and a run resumed
across a switch (checkpoint before it, resumed after) ends bit-identical to the uninterrupted
one, random streams included."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.data import DataConfig
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train
from ablate.train.checkpoint import CHECKPOINT, load_file
from ablate.train.config import config_hash
from ablate.train.phases import Phase, check, normalized, prefix, recipe_at, shares, timeline
from backends import Recipe

TRAIN = TrainConfig(
    steps=6, batch_size=4, seq_len=32, warmup_steps=2, eval_every=2, eval_batches=1, lr=3e-3
)
FULL = ["fprop", "dgrad", "wgrad"]
FP8 = Recipe.from_shorthand([], base="fp8")
MX = Recipe.from_shorthand(FULL, "sr", base="fp8")  # SR: the random streams matter
BF16_FORWARD = dataclasses.replace(MX, fprop=Recipe.bf16().fprop)
SERIES = ("train_loss", "grad_norm", "lr", "val_loss")


def cfg(recipe: Recipe, phases: tuple[Phase, ...] = (), where=None) -> RunConfig:
    return RunConfig(
        train=TRAIN,
        data=DataConfig(val_tokens=2048),
        recipe=recipe,
        phases=phases,
        device="cpu",
        checkpoint_dir=None if where is None else str(where),
    )


def series(log: MemoryLogger, upto: int = 99) -> dict[str, list[tuple[int, float]]]:
    return {n: [(s, v) for s, v in log.series(n) if s <= upto] for n in SERIES}


def test_the_timeline_covers_the_run_and_merges_what_repeats():
    warm, tail = Phase(0, 2, FP8, "warmup"), Phase(8, 10, Recipe.bf16(), "tail")
    assert timeline((warm, tail), MX, 10) == [(0, 2, FP8), (2, 8, MX), (8, 10, Recipe.bf16())]
    assert timeline((), MX, 10) == [(0, 10, MX)]
    assert timeline((Phase(0, 2, FP8), Phase(2, 4, FP8)), MX, 10) == [(0, 4, FP8), (4, 10, MX)]
    assert [recipe_at((warm, tail), MX, s) for s in (0, 1, 2, 7, 8, 9)] == [
        FP8, FP8, MX, MX, Recipe.bf16(), Recipe.bf16()
    ]  # fmt: skip
    assert prefix((warm,), MX, 10, 3) == [(0, 2, FP8.to_dict()), (2, 3, MX.to_dict())]
    assert prefix((warm,), MX, 10, 2) == prefix((), FP8, 10, 2)  # the FP8 run's first 2 steps
    assert shares((warm, tail), MX, 10) == [(0.2, FP8), (0.6, MX), (0.2, Recipe.bf16())]


def test_phases_out_of_order_overlapping_or_past_the_budget_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"phases\[0\] \(warmup\): steps \[0, 12\) do not lie"):
        check((Phase(0, 12, FP8, "warmup"),), 10)
    with pytest.raises(ValueError, match=r"phases\[1\] \(tail\): starts at step 3, before the"):
        check((Phase(0, 4, FP8, "warmup"), Phase(3, 10, FP8, "tail")), 10)
    with pytest.raises(ValueError, match="phases: start must be a step"):
        Phase.from_dict({"start": True, "end": 2, "recipe": FP8.to_dict()})
    with pytest.raises(ValueError, match=r"phases\[0\].*train.steps"):
        cfg(MX, (Phase(4, 7, FP8),))


def test_a_run_without_phases_keeps_its_key_and_one_that_changes_nothing_too():
    plain = config_hash(cfg(MX))
    assert config_hash(cfg(MX, (Phase(0, 0, FP8), Phase(4, 6, MX)))) == plain
    assert normalized((Phase(0, 0, FP8), Phase(4, 6, MX)), MX) == ()
    warm = cfg(MX, (Phase(0, 2, FP8, "warmup"),))
    assert config_hash(warm) != plain
    # the name is a label, not a number: the key does not hold it
    assert config_hash(cfg(MX, (Phase(0, 2, FP8, "other"),))) == config_hash(warm)
    back = RunConfig.from_dict(warm.to_dict())
    assert back.phases == warm.phases and config_hash(back) == config_hash(warm)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """FP8 and MXFP4 for 6 steps; MXFP4 after 2 steps of FP8; MXFP4 with a BF16-forward tail from
    step 4."""
    tmp = tmp_path_factory.mktemp("phases")
    out = {}
    for name, c in {
        "fp8": cfg(FP8),
        "mx": cfg(MX),
        "warm": cfg(MX, (Phase(0, 2, FP8, "warmup"),), tmp / "warm"),
        "tail": cfg(MX, (Phase(4, 6, BF16_FORWARD, "tail"),)),
    }.items():
        log = MemoryLogger()
        out[name] = (train(c, log), log)
    out["tmp"] = tmp
    return out


def test_a_warmup_trains_as_the_warmup_recipe_does_then_as_the_run_own(runs):
    (fp8, fp8_log), (_, mx_log), (warm, warm_log) = runs["fp8"], runs["mx"], runs["warm"]
    assert warm.status == "finished"
    # steps 1-2 (optimizer steps 0 and 1) and the evaluations at 0 and 2: the FP8 run's bits
    assert series(warm_log, 2) == series(fp8_log, 2)
    assert warm.evals[:2] == fp8.evals[:2]
    assert series(warm_log)["train_loss"][2:] != series(fp8_log)["train_loss"][2:]
    assert series(warm_log)["train_loss"][2:] != series(mx_log)["train_loss"][2:]
    assert warm_log.series("recipe_phase") == [(0, 1.0), (2, 0.0)]  # the warmup, then its own
    assert not fp8_log.series("recipe_phase")  # a run without phases records none


def test_a_tail_trains_the_steps_before_it_as_the_run_without_one(runs):
    (mx, mx_log), (tail, tail_log) = runs["mx"], runs["tail"]
    assert series(tail_log, 4) == series(mx_log, 4) and tail.evals[:3] == mx.evals[:3]
    assert series(tail_log)["train_loss"][4:] != series(mx_log)["train_loss"][4:]
    assert tail_log.series("recipe_phase") == [(0, 0.0), (4, 1.0)]


@pytest.mark.parametrize("stop", [1, 2, 3])
def test_a_run_resumed_across_a_switch_is_bit_identical_to_the_uninterrupted_one(
    runs, stop, tmp_path
):
    whole, whole_log = runs["warm"]
    c = dataclasses.replace(
        cfg(MX, (Phase(0, 2, FP8, "warmup"),), tmp_path),
        train=dataclasses.replace(TRAIN, checkpoint_every=1),
    )
    log = MemoryLogger()
    assert train(c, log, stop_after=stop).status == "stopped"
    res = train(c, log)  # resumed from step `stop`: before, at or after the switch at 2
    assert res.status == "finished" and res.evals == whole.evals
    assert series(log) == series(whole_log)
    assert log.series("recipe_phase") == whole_log.series("recipe_phase")
    a, b = load_file(tmp_path / CHECKPOINT)["model"], load_file(runs["tmp"] / "warm" / CHECKPOINT)
    assert a.keys() == b["model"].keys() and all(torch.equal(a[k], b["model"][k]) for k in a)


@pytest.mark.slow
def test_a_compiled_run_switches_its_recipe_and_trains_as_the_eager_one(monkeypatch):
    """The switch changes the layers' recipe under a compiled model (``aot_eager`` here: Dynamo's
    guards and recompiles are the backend's and the device's alike): the graphs of the new recipe
    compile once, no more than the run without phases compiles, and the losses follow the eager
    run's."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", "aot_eager")
    phases = (Phase(0, 2, FP8, "warmup"),)
    eager, compiled = MemoryLogger(), MemoryLogger()
    train(cfg(MX, phases), eager)

    def compiled_run(ps: tuple[Phase, ...], log: MemoryLogger) -> int:
        c = dataclasses.replace(cfg(MX, ps), train=dataclasses.replace(TRAIN, compile=True))
        before = counters["stats"]["unique_graphs"]
        assert train(c, log).status == "finished"
        return counters["stats"]["unique_graphs"] - before

    plain = compiled_run((), MemoryLogger())
    switched = compiled_run(phases, compiled)
    assert plain < switched <= 2 * plain  # the FP8 graphs, then MXFP4's once
    got, want = series(compiled)["train_loss"], series(eager)["train_loss"]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-4)
    assert compiled.series("recipe_phase") == eager.series("recipe_phase")
