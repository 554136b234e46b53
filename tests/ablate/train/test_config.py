"""``config_hash`` (a study cell's key: its values must never change), what it includes and leaves
out, ``run_params`` and ``flatten``."""

from __future__ import annotations

import dataclasses

import pytest

from ablate.data import DataConfig
from ablate.tracking.adopt import legacy_config_hash
from ablate.train.config import (
    RunConfig,
    TrainConfig,
    config_hash,
    flatten,
    resolved_precision,
    run_params,
)


def key1(cfg: RunConfig) -> str:
    """The key as numerics version 1 had it, as pinned here (every key also holds the numerics
    version: ``tests/ablate/test_key.py``)."""
    return config_hash(cfg, numerics=1)


def test_config_hash_values_are_stable():
    # study cells and existing results are looked up by these: a change here orphans them
    assert key1(RunConfig(device="cpu")) == "1f94548535cb9ce6"
    assert config_hash(RunConfig(device="cpu")) == "8ecffaed5be74830"  # numerics 2's
    # seed 3 on the batch order every seed read before the order followed the seed
    order0 = DataConfig(data_seed=0)
    assert (
        key1(RunConfig(device="cpu", seed=3, data=order0, train=TrainConfig(lr=1e-2)))
        == "d2a4e0ab013c6a73"
    )
    # an eager CUDA run keeps the key CUDA runs had before train.compile; a compiled one (auto on
    # CUDA) has its own, and the CPU's auto (eager) changes nothing; log_every is not in the key
    eager = TrainConfig(compile=False)
    assert key1(RunConfig(device="cuda", train=eager)) == "ae297ef2c7e5591f"
    assert key1(RunConfig(device="cuda")) == "46d0ba03ccab5fa9"
    assert key1(RunConfig(device="cpu", train=TrainConfig(compile=True))) != (
        key1(RunConfig(device="cpu"))
    )
    assert key1(RunConfig(device="cpu", train=TrainConfig(log_every=7))) == "1f94548535cb9ce6"


def test_config_hash_of_shorthand_recipes_is_stable():
    # the keys of studies that use only the recipe shorthands; recipe fields added later (2-D
    # blocks, sign vectors, layer selection) enter the hash only when a recipe sets them
    from backends.recipes import Recipe

    full = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "dht", base="fp8")
    assert key1(RunConfig(device="cpu", recipe=full)) == "83a32e5e5266f68e"
    back = Recipe.from_shorthand(["dgrad", "wgrad"], "sr+rht64", fp4_format="nvfp4", keep_last=1)
    assert key1(RunConfig(device="cpu", recipe=back)) == "e54974f0499d98ca"
    wgrad = Recipe.from_shorthand(
        ["wgrad"], "fht32", base="mxfp8", scale_mode="rceil", apply_to=["dgrad", "wgrad"]
    )
    cuda = RunConfig(device="cuda", recipe=wgrad, train=TrainConfig(compile=False))
    assert key1(cuda) == "fbb8a64e7b56b3f0"


def test_the_legacy_key_is_the_key_before_device_and_precision_counted():
    # the values cells had before: `ablate adopt` finds old runs by them
    assert legacy_config_hash(RunConfig()) == "cf1710eca5a47d3d"
    order0 = DataConfig(data_seed=0)  # every seed's batch order then
    assert (
        legacy_config_hash(RunConfig(seed=3, data=order0, train=TrainConfig(lr=1e-2)))
        == "7a18b7f77c876a21"
    )


def test_config_hash_ignores_where_a_run_lives_and_how_often_it_checkpoints():
    base = RunConfig(device="cpu")
    assert config_hash(RunConfig(device="cpu", checkpoint_dir="/x")) == config_hash(base)
    moved = dataclasses.replace(base, train=TrainConfig(checkpoint_every=7))
    assert config_hash(moved) == config_hash(base)
    assert config_hash(RunConfig(device="cuda:0")) == config_hash(RunConfig(device="cuda:3"))
    assert config_hash(RunConfig(device="cpu", seed=1)) != config_hash(base)


def test_config_hash_counts_the_device_kind_and_the_resolved_precision():
    cpu, gpu = RunConfig(device="cpu"), RunConfig(device="cuda")
    assert config_hash(cpu) != config_hash(gpu)  # a GPU bf16 run is not a CPU fp32 run
    # auto resolves: fp32 on the CPU (the same key as saying fp32), bf16 on CUDA
    fp32 = RunConfig(device="cpu", train=TrainConfig(precision="fp32"))
    bf16_cpu = RunConfig(device="cpu", train=TrainConfig(precision="bf16"))
    assert config_hash(fp32) == config_hash(cpu) != config_hash(bf16_cpu)
    bf16 = RunConfig(device="cuda", train=TrainConfig(precision="bf16"))
    assert config_hash(bf16) == config_hash(gpu)
    assert (
        resolved_precision("auto", "cuda") == "bf16" and resolved_precision("auto", "cpu") == "fp32"
    )


def test_run_params_leave_out_what_may_change_between_attempts():
    params = run_params(RunConfig(checkpoint_dir="/somewhere"))
    assert not {"checkpoint_dir", "device", "train.checkpoint_every"} & set(params)
    assert params["train.lr"] == TrainConfig().lr


def test_flatten_joins_nested_keys_with_dots():
    assert flatten({"train": {"lr": 1, "x": {"y": 2}}, "seed": 0}) == {
        "train.lr": 1,
        "train.x.y": 2,
        "seed": 0,
    }
    flat = flatten(RunConfig().to_dict())
    assert flat["train.lr"] == TrainConfig().lr and flat["seed"] == 0


def test_a_run_past_its_schedule_has_its_own_key_and_an_ordinary_run_keeps_its_key():
    ordinary = RunConfig(device="cpu", train=TrainConfig(steps=200))
    same = RunConfig(device="cpu", train=TrainConfig(steps=200, schedule_steps=200))
    longer = RunConfig(device="cpu", train=TrainConfig(steps=300, schedule_steps=200))
    assert key1(ordinary) == key1(same) == "1f94548535cb9ce6"
    assert key1(longer) not in (key1(ordinary), key1(RunConfig(
        device="cpu", train=TrainConfig(steps=300))))  # fmt: skip
    assert legacy_config_hash(RunConfig(train=TrainConfig(schedule_steps=200))) == (
        "cf1710eca5a47d3d"
    )
    # recorded as a param only where set
    assert "train.schedule_steps" not in run_params(ordinary)
    assert run_params(longer)["train.schedule_steps"] == 200
    assert longer.train.schedule_end == 200 and ordinary.train.schedule_end == 200


def test_schedule_steps_beyond_the_run_are_refused_naming_the_field_and_range():
    import pytest

    for bad in (0, 201):
        with pytest.raises(ValueError, match=r"train.schedule_steps: must be in \[1, train.steps"):
            TrainConfig(steps=200, schedule_steps=bad)


def test_the_schedule_is_in_the_key_only_when_wsd_and_its_decay_only_with_it():
    cosine = RunConfig(device="cpu", train=TrainConfig(schedule="cosine", decay_fraction=0.5))
    assert key1(cosine) == "1f94548535cb9ce6"  # every recorded cell trained the cosine

    def wsd(**kw):
        return key1(RunConfig(device="cpu", train=TrainConfig(schedule="wsd", **kw)))

    assert wsd() != key1(cosine)
    assert wsd(decay_fraction=0.3) not in (wsd(), key1(cosine))
    assert wsd() == wsd(decay_fraction=0.2)  # the default decay is in the key too
    assert run_params(cosine)["train.schedule"] == "cosine"
    assert "train.decay_fraction" not in run_params(cosine)  # it means nothing there
    params = run_params(RunConfig(train=TrainConfig(schedule="wsd", decay_fraction=0.3)))
    assert params["train.schedule"] == "wsd" and params["train.decay_fraction"] == 0.3


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"schedule": "linear"}, r"train\.schedule: unknown 'linear'; allowed: cosine, wsd"),
        ({"decay_fraction": 0.0}, r"train\.decay_fraction: must be in \(0, 1\], got 0\.0"),
        ({"decay_fraction": 1.5}, r"train\.decay_fraction: must be in \(0, 1\], got 1\.5"),
        ({"decay_fraction": True}, r"train\.decay_fraction: must be in \(0, 1\], got True"),
        (
            {"steps": 10, "warmup_steps": 5, "decay_fraction": 0.6},
            r"train\.decay_fraction: a decay of 6 steps \(max\(1, round\(0\.6 x train\.steps = 10"
            r"\)\)\) is longer than the 5 steps after warmup .* lower train\.decay_fraction or "
            r"train\.warmup_steps",
        ),
        (
            {"steps": 30, "schedule_steps": 10, "warmup_steps": 5, "decay_fraction": 0.6},
            r"train\.decay_fraction: a decay of 6 steps \(max\(1, round\(0\.6 x "
            r"train\.schedule_steps = 10\)\)\) is longer than the 5 steps after warmup",
        ),
        (
            {"steps": 8, "warmup_steps": 20},
            r"train\.warmup_steps: 20 leaves no step of train\.steps = 8 after warmup for a wsd "
            r"schedule's decay; lower train\.warmup_steps below 8 or raise train\.steps",
        ),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_naming_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{"schedule": "wsd"} | kw)


def test_a_decay_that_fills_every_step_after_warmup_is_allowed():
    t = TrainConfig(schedule="wsd", steps=10, warmup_steps=5, decay_fraction=0.5)
    assert (t.decay_steps, t.decay_start) == (5, 5)


def test_the_quantizer_graph_is_in_the_key_only_where_a_compiled_run_traces_it_inline():
    from ablate.key import key_fields
    from backends.recipes import GEMMS, Recipe

    mx = Recipe.from_shorthand(GEMMS, "sr")

    def graph(device: str, compile: bool | str = "auto", recipe: Recipe = mx, **kw) -> object:
        cfg = RunConfig(device=device, recipe=recipe, train=TrainConfig(compile=compile), **kw)
        return key_fields(cfg, device).get("quantizer_graph")

    assert graph("cuda") == "inline"  # auto: compiled on CUDA, traced inline there
    assert graph("cuda", quantizer_graph="opaque") is None  # the key CUDA cells had before
    assert graph("cuda", compile=False) is None  # nothing is traced
    assert graph("cuda", recipe=Recipe.bf16()) is None  # no quantizer to trace
    assert graph("cpu", compile=True) is None  # auto: the opaque ops on the CPU
    assert graph("cpu", compile=True, quantizer_graph="inline") == "inline"
    with pytest.raises(ValueError, match="quantizer_graph: unknown 'fused'; allowed: auto, opaq"):
        RunConfig(quantizer_graph="fused")  # type: ignore[arg-type]


def test_shared_rank_draws_are_in_the_key_and_refused_without_ranks():
    ddp = TrainConfig(parallel="ddp", workers=2)
    shared = TrainConfig(parallel="ddp", workers=2, rank_draws="shared")
    assert config_hash(RunConfig(train=ddp)) != config_hash(RunConfig(train=shared))
    with pytest.raises(ValueError, match="train.rank_draws: shared is how data-parallel ranks"):
        TrainConfig(rank_draws="shared")
    with pytest.raises(ValueError, match="train.rank_draws: unknown 'all'; allowed: per_rank"):
        TrainConfig(parallel="ddp", workers=2, rank_draws="all")  # type: ignore[arg-type]
