"""``config_hash`` (a study cell's key: its values must never change) and ``flatten``."""

from __future__ import annotations

from ablate.train.config import RunConfig, TrainConfig, config_hash, flatten


def test_config_hash_values_are_stable():
    # study cells and existing results are looked up by these: a change here orphans them
    assert config_hash(RunConfig()) == "cf1710eca5a47d3d"
    assert config_hash(RunConfig(seed=3, train=TrainConfig(lr=1e-2))) == "7a18b7f77c876a21"


def test_config_hash_ignores_where_a_run_lives_and_runs():
    assert config_hash(RunConfig(device="cpu", checkpoint_dir="/x")) == config_hash(RunConfig())
    assert config_hash(RunConfig(seed=1)) != config_hash(RunConfig())


def test_flatten_joins_nested_keys_with_dots():
    assert flatten({"train": {"lr": 1, "x": {"y": 2}}, "seed": 0}) == {
        "train.lr": 1,
        "train.x.y": 2,
        "seed": 0,
    }
    flat = flatten(RunConfig().to_dict())
    assert flat["train.lr"] == TrainConfig().lr and flat["seed"] == 0
