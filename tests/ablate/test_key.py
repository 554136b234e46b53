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
    "seed_order": "f41c923187c82610",  # 2026-11-26: the batch order follows the seed
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
    # a seed on the one batch order every seed read then (a seed's own order is another cell)
    "seed": lambda: RunConfig(device="cpu", seed=7, data=DataConfig(data_seed=0)),
    "seed_order": lambda: RunConfig(device="cpu", seed=7),
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
# (numerics 1). Re-pinned on 2026-11-26 where a study lets the batch order follow the seed: its cells
# of seeds 1 and up are new cells (their runs recorded before are kept and named by `ablate status`).
# The quickstart's re-pinned on 2026-11-27: a new study (sequential seeds of two interventions);
# mxfp4_wgrad_cpu pinned on 2026-11-27, as its kept report was trained.
STUDY_KEYS = {
    "mxfp4_wgrad_cpu": [
        "09860cdbfcaccb98",
        "152cba1c91333c27",
        "183e5756b5885bb7",
        "1e1884b620cb7b5a",
        "1fbd974d608d2bde",
        "2002fdda6eac8c16",
        "2288b8024b4849e2",
        "23c7c59bcf163acd",
        "25028361549d74b3",
        "30556b2c31a7c34f",
        "310a1129329e32fd",
        "345b434707e293f1",
        "3689224af3e0751d",
        "37f2b1a9fa2547c5",
        "42b06201feea82da",
        "4460716777e1aebc",
        "465112f38e7e3a78",
        "46a5c70e85b80317",
        "47613a519ef84b7d",
        "484fc4a44d814d56",
        "491bc0df8c26579a",
        "49521b925677536d",
        "4b83ea7a1212d9ac",
        "5b2e69f5a1f4c2b8",
        "6384c42a11ac8877",
        "659aaf898743e6a0",
        "673ebd7320763b4a",
        "676c66506d9637d6",
        "6a50603f6b1488f5",
        "6dd7a7ecb1afe68b",
        "6ea32de5e917df07",
        "6f93e310e2e3171f",
        "70289abac57011cd",
        "747fb50aef11d737",
        "7752706a5944367b",
        "7878a5ec1393d977",
        "7c9fc3fe0312a619",
        "7cdbb1683e9dab24",
        "83d637fa8f86ec95",
        "86bec8491f270761",
        "8d4c7c39d5691551",
        "9288608902a1675f",
        "98afc45e0f1cb560",
        "9ba0dda37303daf6",
        "9c1cb9d621fe1ce0",
        "a411b5fcbae5da02",
        "a91309d1de5089b8",
        "b6768eaba5b8b701",
        "b7704e9cae878976",
        "b8857771ba44b8b3",
        "b8e3f6f0d76d6b5c",
        "b96df7d7e67c7d1d",
        "b9c58e07c730e365",
        "c18ce77d83148f78",
        "c25418db08867b8c",
        "d01e7bea9104f9f0",
        "d9d565882b1db155",
        "dee70bfea134998a",
        "e108810a760bf008",
        "e2b24ec760ed5047",
        "e3c62e8fd9d7b64b",
        "e4242045dcd396e4",
        "e49c253df9cff72d",
        "f2b1f9460831c1e2",
        "f2eda3e449ebc065",
        "f7bfac01bae77c0e",
        "f8b29f933294bf96",
        "fa1f532413b2b1b3",
        "fa680b998759315e",
        "fe2d3841f79e4dd7",
    ],
    "quickstart": [
        "1678b9623b960cfc",
        "1c57882d2b2a67cc",
        "2e04b3133c411a9e",
        "4cecaa072c51e60f",
        "5ffc0142c6cc410c",
        "6f3a76552a519529",
        "7fc1791576cbd31d",
        "94b94ffd28094f69",
        "9c3dfaf59ef25c00",
        "a8e2d531ef8a6af5",
        "bc1b64d4af7d16b4",
        "c8a478376f28b2b2",
        "cb50ecabc33ed3ff",
        "cc2f25434098dae1",
        "d4929d7da6ab2b23",
        "e2f203c89e0b264c",
        "f93c91341dce26db",
        "fb4c2a7a469dd992",
    ],
    "recipes": [
        "0367599c4dca26ab",
        "06cd4a523f9a09a2",
        "08e5ca6be7d97c7b",
        "0e3c81f3111e638c",
        "11746e5b438a397c",
        "1c702f483db6ce51",
        "1e1999f58030e013",
        "262d8e5bb085d50d",
        "2a90c99ef4f4d63b",
        "2afa144c5a2d9079",
        "34d5bb64d2f80493",
        "426153f26729c3cb",
        "5c52a0ff295ea73f",
        "6f81a23c22878a6c",
        "7128fb778d6a5fe5",
        "82accbbf1ee42905",
        "8d362405ccd7ffac",
        "92923535473fb682",
        "989a902fe24fd17c",
        "99c4769cf091d2de",
        "9e16c37262a68fb9",
        "a70cd887acdb14f6",
        "aaacb17f29e00bdd",
        "b85fe608237a764b",
        "dafc0df7cb2e21d1",
        "dcf909581547271c",
        "e0582d14262ee203",
        "e3a8d93cbddf772f",
        "e9f2c77d1dcccce2",
        "eae3ae219027ebc9",
        "ec039f9d6717b2a6",
        "f1e288f86b42749a",
        "f449c246846eead3",
    ],
    "heldout": [
        "2006814db32ab8b0",
        "77b9988b6e7a4a6c",
        "8048adf91004a01c",
        "83b3f460220709f8",
    ],
    "probes": [
        "1105cedba6017bb8",
        "37fe97658b0af5f8",
        "45dca528b70a9528",
        "4d3ffdf6a96650ec",
        "51a86d82c081d640",
        "8407748f10357cf8",
        "96f068940779384a",
        "a8c478404112af1b",
        "b048c42ad79ad2a8",
        "bc1b9b8b57c9e91b",
    ],
    "qwen3_mxfp4_wgrad": [
        "0a9a8b5ccf012863",
        "11f5721f36624785",
        "18ffef25bee43f08",
        "289cfa034f61a935",
        "dac9efb3c6284a31",
        "e1f7ddbd2d9a2e52",
        "e4ac04c461843b99",
        "e5d5bcd15279d04b",
        "f19a3ce974f344ac",
    ],
    "mxfp4_wgrad_8b": [
        "08e52c3bd96f663d",
        "2559674d0cf772d9",
        "3eebca281c61d677",
        "54082744f89398ff",
        "5b6cfa975d38e0c2",
        "74c2b0adf1365ccd",
        "7d5778c4ad8bd09b",
        "81aebf9b1273aec8",
        "8499ad9f2ffae33c",
        "849d85aba1418b3d",
        "8ebad0a1f0f22166",
        "acb0a89e902255ec",
        "b952bc5b1c5ce3b2",
        "bb4b36f5ab096dd8",
        "bc6711b75900f94e",
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
