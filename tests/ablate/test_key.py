"""A cell's key (``ablate.key``): every config field declares how it enters it, one function builds
it from those declarations, the keys cells were recorded under never change for a numerics version,
and the numerics version is in every key (``ablate.numerics``)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ablate.data import DataConfig, ValData
from ablate.key import always, key_fields, never, rule_of, unless_default
from ablate.model import ModelConfig
from ablate.numerics import NUMERICS_VERSION
from ablate.study import load_study
from ablate.tracking.adopt import legacy_config_hash
from ablate.train.config import ProbeConfig, RunConfig, TrainConfig, config_hash
from backends.recipes import GEMMS, Recipe, named_recipe

ROOT = Path(__file__).resolve().parents[2]
T = TrainConfig


def _configs() -> set[type]:
    """RunConfig and every config dataclass of the project its fields hold, found from the type
    hints (a config added to RunConfig later is found too)."""
    found: set[type] = set()
    todo: list[type] = [RunConfig]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if rule_of(f) is not None and (rule_of(f).never or rule_of(f).resolve is not None):
                continue  # never walked, or held as something else (the recipe: its to_dict)
            for t in (hints[f.name], *typing.get_args(hints[f.name])):
                if dataclasses.is_dataclass(t) and t.__module__.startswith("ablate."):
                    todo.append(t)
    return found


def test_every_config_field_declares_how_it_enters_the_key():
    configs = _configs()
    assert {RunConfig, TrainConfig, ModelConfig, DataConfig, ValData} <= configs
    missing = [
        f"{c.__name__}.{f.name}"
        for c in configs
        for f in dataclasses.fields(c)
        if rule_of(f) is None
    ]
    assert not missing, f"declare always(), unless_default() or never() on: {missing}"


def test_a_field_without_a_rule_is_refused_naming_it():
    @dataclass
    class Made:
        a: int = field(default=1, metadata=always())
        b: int = 2

    with pytest.raises(TypeError, match=r"Made\.b declares no key rule"):
        key_fields(Made(), "cpu")


def test_a_field_added_at_its_default_leaves_every_key_as_it_was():
    @dataclass
    class Before:
        a: int = field(default=1, metadata=always())
        where: str = field(default="x", metadata=never())

    @dataclass
    class After:
        a: int = field(default=1, metadata=always())
        where: str = field(default="x", metadata=never())
        new: int = field(default=0, metadata=unless_default())

    assert key_fields(After(), "cpu") == key_fields(Before(), "cpu") == {"a": 1}
    assert key_fields(After(new=3), "cpu") == {"a": 1, "new": 3}
    assert key_fields(After(where="y"), "cpu") == key_fields(After(), "cpu")


# Keys as the code before the rules computed them (numerics 1; every rule exercised by at least
# one config): the keys of numerics 1 must stay these, so ``ablate adopt`` finds such cells.
RECORDED = {
    "ac": "3195df54e1629c31",
    "cache": "1f94548535cb9ce6",
    "ckpt": "1f94548535cb9ce6",
    "compile_cpu": "7f7241276ac73625",
    "ddp1": "01f6a2420da10a8d",
    "ddp2": "eca3bd114dd2de54",
    "default_auto": "1f94548535cb9ce6",
    "default_cpu": "1f94548535cb9ce6",
    "default_cuda": "46d0ba03ccab5fa9",
    "eager_cuda": "ae297ef2c7e5591f",
    "fsdp2": "a626d51f4271af2e",
    "fsdp_bf16": "5e84fec22769f81b",
    "fused_cpu": "611b1657ac5db3b3",
    "fused_off_cuda": "669d00a4ae34ad67",
    "fused_on_cuda": "46d0ba03ccab5fa9",
    "head_dim": "fbe678f630d6f048",
    "hf": "13610e916d7d6068",
    "model_fields": "0b408e3e98cd8cdb",
    "named_amd_mxfp4_h16": "f3f1aac0ef8e9cb7",
    "named_four_over_six": "0c06f49929e72257",
    "named_nvidia_nvfp4": "91431f6fb787ea39",
    "named_nvidia_nvfp4_4over6": "4e9358219fab7c61",
    "named_quartet": "5c3824d7d03bfd44",
    "named_quartet_ii": "aaef38d36405eede",
    "named_tetrajet_v2": "bbe1a216d80a29d4",
    "named_tseng_mxfp4": "99ddfd801296f097",
    "prec_bf16": "d1a48d6bdebd7e36",
    "probe": "1f94548535cb9ce6",
    "recipe_full": "5931d10b963167e6",
    "recipe_sel": "11c34dbe84f4c146",
    "sched": "45647918adae148a",
    "sched_eq": "db4e44a1fa77fa9c",
    "seed": "12507b1fc40c8af0",
    "val": "2d578d8750ed2d3c",
    # fields added since (pinned when added, at numerics 1 like the rest)
    "wsd": "541106f6e2a78b13",
    "wsd_sched": "5f3e019cd55c3440",
}
CASES = {
    "default_cpu": lambda: RunConfig(device="cpu"),
    "default_cuda": lambda: RunConfig(device="cuda"),
    "default_auto": lambda: RunConfig(),
    "sched": lambda: RunConfig(device="cpu", train=T(steps=100, schedule_steps=50)),
    "sched_eq": lambda: RunConfig(device="cpu", train=T(steps=100, schedule_steps=100)),
    "wsd": lambda: RunConfig(device="cpu", train=T(schedule="wsd")),
    "wsd_sched": lambda: RunConfig(
        device="cpu", train=T(steps=100, schedule_steps=50, schedule="wsd", decay_fraction=0.3)
    ),
    "ckpt": lambda: RunConfig(device="cpu", train=T(checkpoint_every=5, log_every=3)),
    "prec_bf16": lambda: RunConfig(device="cpu", train=T(precision="bf16")),
    "compile_cpu": lambda: RunConfig(device="cpu", train=T(compile=True)),
    "eager_cuda": lambda: RunConfig(device="cuda", train=T(compile=False)),
    "fused_cpu": lambda: RunConfig(device="cpu", train=T(fused_adamw=True)),
    "fused_off_cuda": lambda: RunConfig(device="cuda", train=T(fused_adamw=False)),
    "fused_on_cuda": lambda: RunConfig(device="cuda", train=T(fused_adamw=True)),
    "ddp2": lambda: RunConfig(device="cpu", train=T(workers=2)),
    "ddp1": lambda: RunConfig(device="cpu", train=T(workers=1, parallel="ddp")),
    "fsdp2": lambda: RunConfig(device="cpu", train=T(workers=2, parallel="fsdp")),
    "fsdp_bf16": lambda: RunConfig(
        device="cpu",
        train=T(workers=2, parallel="fsdp", precision="bf16", fsdp_all_gather="bf16"),
    ),
    "ac": lambda: RunConfig(device="cpu", train=T(activation_checkpointing="blocks")),
    "val": lambda: RunConfig(
        device="cpu", data=DataConfig(val=ValData(corpus="text", path="README.md"))
    ),
    "head_dim": lambda: RunConfig(device="cpu", model=ModelConfig(preset="tiny", head_dim=32)),
    "model_fields": lambda: RunConfig(
        device="cpu", model=ModelConfig(preset="small", dim=384, n_layers=3)
    ),
    "hf": lambda: RunConfig(
        device="cpu", model=ModelConfig(hf=str(ROOT / "studies/qwen3_tiny/config.json"))
    ),
    "probe": lambda: RunConfig(device="cpu", probe=ProbeConfig()),
    "cache": lambda: RunConfig(device="cpu", data_cache="/x", checkpoint_dir="/y"),
    "seed": lambda: RunConfig(device="cpu", seed=7),
    "recipe_full": lambda: RunConfig(
        device="cpu", recipe=Recipe.from_shorthand(GEMMS, "sr+rht64", base="fp8")
    ),
    "recipe_sel": lambda: RunConfig(
        device="cpu",
        recipe=Recipe.from_shorthand(GEMMS, "dht").select(
            keep_first=1, layer_types=["mlp"], blocks=[0, -1]
        ),
    ),
    **{
        f"named_{n}": (lambda n=n: RunConfig(device="cpu", recipe=named_recipe(n)))
        for n in (
            "nvidia_nvfp4",
            "tseng_mxfp4",
            "amd_mxfp4_h16",
            "quartet",
            "four_over_six",
            "nvidia_nvfp4_4over6",
            "quartet_ii",
            "tetrajet_v2",
        )
    },  # fmt: skip
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_keeps_the_key_cells_were_recorded_under(name):
    assert config_hash(CASES[name](), numerics=1) == RECORDED[name], (
        "a cell's key changed: recorded cells would run again. If the numbers really changed, "
        "bump the numerics instead; if a field was added, declare it unless_default()"
    )


# Every cell of the studies with kept reports, keyed as the code before the rules keyed them
# (numerics 1).
STUDY_KEYS = {
    "quickstart": [
        "102bfa95ffa67696",
        "1105cedba6017bb8",
        "262d8e5bb085d50d",
        "3c700967c3db0fbe",
        "4d3ffdf6a96650ec",
        "6598c418a3809cd8",
        "811849d113a16e49",
        "96f068940779384a",
        "9a007da48651ceee",
        "9cd7518d4dcfd8b0",
        "a908ff38e3843e65",
        "bc1b9b8b57c9e91b",
        "ca97318674b60a56",
        "f1e288f86b42749a",
        "f264ce3c6b3f80dc",
        "fd653921c0c15777",
    ],
    "recipes": [
        "06cd4a523f9a09a2",
        "08e5ca6be7d97c7b",
        "0cd2d856ef5732a2",
        "0e3c81f3111e638c",
        "156b7bc51273a3df",
        "1c702f483db6ce51",
        "262d8e5bb085d50d",
        "293b0a5e2d372434",
        "34d5bb64d2f80493",
        "352ad3a325762369",
        "3db7d6a464408caf",
        "40b2f970098d204e",
        "41a31d6d653b2d12",
        "5c52a0ff295ea73f",
        "649707175077a996",
        "6715c95883eadccf",
        "6ed5dcf5c23e94c0",
        "7eec9b87f69144ad",
        "8076b4473678f146",
        "811849d113a16e49",
        "970a8ce78fddcb86",
        "989a902fe24fd17c",
        "a25d5a7199b6ee5b",
        "a9fd5ed96674470d",
        "aaacb17f29e00bdd",
        "befd6a3e50259e49",
        "bf8638965bcaa00d",
        "ca97318674b60a56",
        "cb95030728511c69",
        "d5291e08cb071a9b",
        "e3a8d93cbddf772f",
        "e9d256a4cebb6332",
        "f1e288f86b42749a",
    ],
    "heldout": ["2006814db32ab8b0", "5d313d9f7da0b8da", "77b9988b6e7a4a6c", "8307ed2be962b86d"],
    "probes": [
        "1105cedba6017bb8",
        "4d3ffdf6a96650ec",
        "8407748f10357cf8",
        "8a334791b8851e0e",
        "96f068940779384a",
        "9a007da48651ceee",
        "9cd7518d4dcfd8b0",
        "a908ff38e3843e65",
        "bc1b9b8b57c9e91b",
        "fd653921c0c15777",
    ],
    "qwen3_mxfp4_wgrad": [
        "18ffef25bee43f08",
        "8ac0b4d3d233a147",
        "a13106af747c933b",
        "a8cfc872dd1a324a",
        "e4ac04c461843b99",
        "ee3fe2550864c367",
        "ef0f50893acca922",
        "f19a3ce974f344ac",
        "fcaa2722f456fa03",
    ],
    "mxfp4_wgrad_8b": [
        "4d1b5ba380b2f2c2",
        "508fe54e00c5aec1",
        "6b2533ec0b48017a",
        "74c2b0adf1365ccd",
        "7922dabf37bd9113",
        "7ec896a076732cd5",
        "81aebf9b1273aec8",
        "8499ad9f2ffae33c",
        "8ebad0a1f0f22166",
        "93041c40aa50a568",
        "b952bc5b1c5ce3b2",
        "b9ed58b06678e94d",
        "bc1cacadb44fc7b2",
        "bd6b08a9686a827b",
        "d764593d03e5ec2f",
    ],
}


@pytest.mark.parametrize("name", sorted(STUDY_KEYS))
def test_every_cell_of_a_kept_study_keeps_its_recorded_key(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # studies name their files relative to the repository
    study = load_study(ROOT / "studies" / f"{name}.yaml")
    assert sorted(config_hash(c.config, numerics=1) for c in study.cells) == STUDY_KEYS[name]


def test_every_key_holds_the_numerics_version():
    # a study resumed across a numerics change trains new cells: no key of this version is one of
    # an earlier version, and the key moves with the version
    for name, make in CASES.items():
        cfg = make()
        now = config_hash(cfg)
        assert now == config_hash(cfg, numerics=NUMERICS_VERSION)
        assert now not in {config_hash(cfg, numerics=v) for v in range(1, NUMERICS_VERSION)}, name
        assert config_hash(cfg, numerics=NUMERICS_VERSION + 1) != now


def test_the_legacy_key_reads_only_the_fields_of_its_time():
    # ablate adopt finds stores recorded before keys named the device kind: fields added since
    # (and the device) are in no legacy key, so adding one never hides those stores
    later = T(compile=True, fused_adamw=True, log_every=3, workers=2, parallel="fsdp")
    assert legacy_config_hash(RunConfig(device="cuda", train=later)) == legacy_config_hash(
        RunConfig(device="cpu")
    )
    assert legacy_config_hash(RunConfig(seed=3)) != legacy_config_hash(RunConfig())
