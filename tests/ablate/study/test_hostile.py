"""Bad input to the newer features is refused by ``ablate validate`` (and so by ``run`` before
anything is recorded): exit 2, the field named, no traceback, nothing written. One test per class
of input (Hugging Face architectures and their weights, tokenizers, corpora, the data cache,
targets, memory, recipe mappings), then a fuzz test over the study schema's newer fields."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ablate.cli import main

ROOT = Path(__file__).resolve().parents[3]
QWEN3 = json.loads((ROOT / "studies" / "qwen3_tiny" / "config.json").read_text())
BOUND_S = 30
"""A refusal that takes longer than this is hanging, not refusing (measured: 0.1-2 s in process)."""


def _study(base: dict | None = None, **top) -> dict:
    b = {
        "model": {"preset": "tiny"},
        "data": {"val_tokens": 4096},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "eval_every": 2},
    }
    for k, v in (base or {}).items():
        b[k] = v
    return {"name": "hostile", "base": b, "grid": {"seed": [0]}, **top}


def _validate(tmp: Path, study: dict) -> tuple[int, str]:
    """``ablate validate`` of ``study`` written under ``tmp``: (exit code, output); the output
    folder must not have been written."""
    p = tmp / "study.yaml"
    p.write_text(yaml.safe_dump(study, sort_keys=False))
    out = tmp / "never-written"
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["validate", str(p), "-o", str(out)])
    assert time.monotonic() - t0 < BOUND_S
    assert not out.exists(), "validate wrote its output folder"
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def _refused(tmp: Path, study: dict, *named: str) -> str:
    code, out = _validate(tmp, study)
    assert code == 2, out
    for n in named:
        assert n in out, f"{n!r} not in: {out}"
    return out


def _hf(tmp: Path, name: str, **changes) -> str:
    d = tmp / name
    d.mkdir()
    cfg = {k: v for k, v in (QWEN3 | changes).items() if v is not ...}
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


# --- Hugging Face architectures ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers 0"),
        ({"num_hidden_layers": -1}, "model.hf"),  # transformers' own validator refuses it
        ({"hidden_act": "swishy"}, "hidden_act 'swishy'"),
        ({"rope_parameters": {"rope_type": "weird", "rope_theta": 1e4}}, "rope_type 'weird'"),
        (
            {"model_type": "llama", "head_dim": ..., "hidden_size": 130},
            "not a multiple of the number of attention heads",
        ),
        ({"vocab_size": 100}, "vocab_size 100 is smaller than the tokenizer's"),
        # these passed validate: a ZeroDivisionError traceback, failed cells, or NaN losses
        # recorded as a diverged cell
        ({"num_key_value_heads": 0}, "num_key_value_heads 0; allowed: a positive integer"),
        ({"hidden_size": -64}, "hidden_size -64; allowed: a positive integer"),
        ({"num_attention_heads": 0}, "num_attention_heads 0; allowed: a positive integer"),
        ({"num_key_value_heads": 8}, "num_key_value_heads 8, which does not divide"),
        ({"rms_norm_eps": math.nan}, "rms_norm_eps nan; allowed: a finite number above 0"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}},
            "rope_theta -1.0; allowed: a finite number above 0",
        ),
    ],
    ids=[
        "no-layers",
        "negative-layers",
        "activation",
        "rope",
        "heads",
        "vocab",
        "no-kv-heads",
        "negative-width",
        "no-heads",
        "kv-not-dividing",
        "nan-eps",
        "negative-rope-theta",
    ],  # fmt: skip
)
def test_an_architecture_that_cannot_train_is_refused(tmp_path, changes, named):
    hf = _hf(tmp_path, "arch", **changes)
    _refused(tmp_path, _study({"model": {"hf": hf}}), "model.hf", named)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_hidden_layers": 100_000}, "num_hidden_layers 100000; allowed: at most 1,024"),
        (
            {"num_hidden_layers": 100_000, "hidden_size": 1 << 20, "intermediate_size": 1 << 22},
            "allowed: at most",
        ),
        (
            {
                "num_hidden_layers": 1024,
                "hidden_size": 65_536,
                "intermediate_size": 262_144,
                "num_attention_heads": 512,
                "num_key_value_heads": 512,
                "head_dim": 128,
            },
            "parameters by its shapes",
        ),
    ],
    ids=["layers", "petabytes", "parameters"],
)
def test_an_architecture_of_absurd_size_is_refused_from_its_numbers(tmp_path, changes, named):
    """Refused by the config's numbers before any model is built: built, the second one would
    need petabytes, and even on the meta device 100,000 layers take minutes (the memory estimate
    used to build it there, and the refusal then named memory, not the field)."""
    hf = _hf(tmp_path, "huge", **changes)
    out = _refused(tmp_path, _study({"model": {"hf": hf}}), "model.hf", named)
    assert "this machine cannot run" not in out


def test_pretrained_weights_missing_or_broken_are_refused(tmp_path):
    bare = _hf(tmp_path, "bare")
    _refused(tmp_path, _study({"model": {"hf": bare, "init": "pretrained"}}), "model.init")
    broken = _hf(tmp_path, "broken")
    (Path(broken) / "model.safetensors").write_bytes(b"\xff" * 64)
    out = _refused(tmp_path, _study({"model": {"hf": broken, "init": "pretrained"}}), "model.init")
    assert "model.safetensors" in out and "cannot be read" in out
    sharded = _hf(tmp_path, "sharded")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (Path(sharded) / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(tmp_path, _study({"model": {"hf": sharded, "init": "pretrained"}}), "model.init")


def test_a_preset_beside_hf_is_refused_not_dropped(tmp_path):
    hf = _hf(tmp_path, "arch")
    _refused(tmp_path, _study({"model": {"hf": hf, "preset": "small"}}), "model.preset", "model.hf")
    # one in the base, the other on an axis: every cell would have both
    study = _study()
    study["grid"] = {"model.hf": [hf], "seed": [0]}
    _refused(tmp_path, study, "model.preset and model.hf")
    # a preset nobody wrote (the default) is no conflict
    del study["base"]["model"]
    code, out = _validate(tmp_path, study)
    assert code == 0, out


# --- tokenizers, corpora, the data cache --------------------------------------------------------


def test_a_tokenizer_file_of_garbage_is_refused(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(b"\x00\xffnot json at all")
    study = _study({"data": {"val_tokens": 4096, "tokenizer": str(bad)}})
    _refused(tmp_path, study, "data.tokenizer", str(bad))


def test_a_model_vocabulary_smaller_than_the_tokenizers_is_refused(tmp_path, train_bpe):
    tok = train_bpe(tmp_path / "tokenizer.json", ["the quick brown fox jumps"] * 50)
    study = _study(
        {
            "model": {"preset": "tiny", "vocab_size": 32},
            "data": {"val_tokens": 4096, "tokenizer": str(tok)},
        }
    )
    _refused(tmp_path, study, "model.vocab_size: 32 is smaller than the vocabulary")


def test_a_parquet_corpus_without_a_text_column_is_refused(tmp_path):
    import pandas as pd

    pd.DataFrame({"text": list(range(100))}).to_parquet(tmp_path / "ints.parquet")
    data = {"val_tokens": 4096, "corpus": "parquet", "path": str(tmp_path / "ints.parquet")}
    _refused(tmp_path, _study({"data": data}), "data.text_field", "holds int64, not text")
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 not really")
    data["path"] = str(tmp_path / "fake.parquet")
    _refused(tmp_path, _study({"data": data}), "data.path", "not a readable Parquet file")


def test_a_data_cache_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "cache").write_text("")
    _refused(tmp_path, _study(data_cache=str(tmp_path / "cache")), "data_cache", "is a file")
    _refused(tmp_path, _study(data_cache=str(tmp_path / "cache" / "sub")), "data_cache")


def test_a_tokenizer_dataset_or_data_cache_that_is_no_file_is_named_as_such(tmp_path):
    """A named pipe (never opened: its read would wait for a writer), a device or a symbolic link
    loop where data.tokenizer, data.hf_dataset or data_cache names a file or a folder."""
    import os

    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "tok").mkdir()
    os.mkfifo(tmp_path / "tok" / "tokenizer.json")
    pipe, loop = str(tmp_path / "pipe"), str(tmp_path / "loop")
    cases = [
        (
            {"tokenizer": pipe},
            {},
            f"data.tokenizer: '{pipe}' is not a regular file or a folder (a named pipe)",
        ),
        (
            {"tokenizer": "/dev/zero"},
            {},
            "data.tokenizer: '/dev/zero' is not a regular file or a folder (a character device)",
        ),
        ({"tokenizer": loop}, {}, f"data.tokenizer: '{loop}' is a symbolic link loop"),
        (
            {"tokenizer": str(tmp_path / "tok")},
            {},
            f"data.tokenizer: '{tmp_path}/tok/tokenizer.json' is not a regular file (a named pipe)",
        ),
        (
            {"corpus": "hf", "hf_dataset": pipe},
            {},
            f"data.hf_dataset: '{pipe}' is not a regular file or a folder (a named pipe)",
        ),
        (
            {"val": {"corpus": "hf", "hf_dataset": loop}},
            {},
            f"data.val.hf_dataset: '{loop}' is a symbolic link loop",
        ),
        ({}, {"data_cache": pipe}, f"data_cache: {pipe} is not a folder (a named pipe)"),
        (
            {},
            {"data_cache": "/dev/null"},
            "data_cache: /dev/null is not a folder (a character device)",
        ),
        ({}, {"data_cache": f"{loop}/sub"}, f"data_cache: {loop} is a symbolic link loop"),
    ]
    for data, top, says in cases:
        study = _study({"data": {"val_tokens": 4096, **data}}, **top)
        out = _refused(tmp_path, study, says)
        assert "does not exist" not in out and "is a file" not in out, out


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_data_cache_that_cannot_be_made_or_is_empty_is_refused(tmp_path, monkeypatch):
    """/proc takes no new folder (even for root); an empty string is no path, not the default."""
    _refused(tmp_path, _study(data_cache="/proc/ablate-cache"), "data_cache", "/proc")
    _refused(tmp_path, _study(data_cache=""), "data_cache", "empty string is not a path")
    monkeypatch.setenv("ABLATE_DATA_CACHE", "/proc/ablate-cache")
    _refused(tmp_path, _study(), "$ABLATE_DATA_CACHE", "/proc")


# --- targets and memory -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        {"val_loss": math.inf},
        {"val_ppl": math.inf},
        {"val_loss": 1000},
        {"val_loss": True},
        {"val_ppl": math.nan},
    ],
    ids=["loss-inf", "ppl-inf", "loss-1000", "loss-bool", "ppl-nan"],
)
def test_a_target_no_run_can_be_compared_at_is_refused(tmp_path, target):
    (field,) = target
    _refused(tmp_path, _study(target=target), f"target.{field}")


@pytest.mark.parametrize(
    "model",
    [
        {"preset": "tiny", "n_layers": 100_000},
        {"preset": "tiny", "dim": 1 << 20},
        {"preset": "tiny", "head_dim": 1 << 18},
    ],
    ids=["layers", "width", "head-dim"],
)
def test_a_cell_whose_memory_estimate_exceeds_this_machine_is_refused(tmp_path, model):
    out = _refused(tmp_path, _study({"model": model}), "this machine cannot run the study")
    assert "by the estimate" in out and "model.n_layers" in out


# --- recipe mappings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["quartet", "--set", "fprop.x.rounding=[sr"],
        ["quartet", "--set", "fprop.x.rounding=*alias"],
        ["quartet", "--set", "fprop.x.rounding=!!python/object/apply:os.system [true]"],
        ["{name: quartet, fprop: ["],
    ],
    ids=["parser", "composer", "constructor", "mapping"],
)
def test_malformed_yaml_in_a_recipe_is_refused(args):
    res = CliRunner().invoke(main, ["recipe", *args])
    assert res.exit_code == 2, res.output
    assert "is not valid YAML" in res.output and "Traceback" not in res.output


# --- fuzz -------------------------------------------------------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["tiny", "pretrained", "random", "byte", "builtin", "quartet", "sr", "auto"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
_FIELDS = {
    "model.hf": _VALUES,
    "model.init": _VALUES,
    "model.vocab_size": _VALUES,
    "model.n_layers": _VALUES,
    "data.tokenizer": _VALUES,
    "data.val": _VALUES,
    "data.token_dtype": _VALUES,
    "train.recompute": _VALUES,
    "train.fused_adamw": _VALUES,
    "train.compile": _VALUES,
    "train.parallel": _VALUES,
    "recipe": _VALUES,
    "gemms": _VALUES,
    "target": _VALUES,
    "target.val_loss": _VALUES,
    "data_cache": _VALUES,
}


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=st.dictionaries(st.sampled_from(sorted(_FIELDS)), _VALUES, min_size=1, max_size=3))
def test_fuzzed_newer_fields_exit_0_or_2_without_a_traceback(tmp_path_factory, changes):
    tmp = tmp_path_factory.mktemp("fuzz")
    study = _study()
    for path, value in changes.items():
        head, _, leaf = path.partition(".")
        if not leaf:
            (study if head in ("target", "data_cache") else study["base"])[head] = value
            continue
        section = study if head == "target" else study["base"]
        if not isinstance(section.get(head), dict):
            section[head] = {}
        section[head][leaf] = value
    try:
        yaml.safe_dump(study)
    except yaml.YAMLError:
        return
    code, out = _validate(tmp, study)
    assert code in (0, 2), out


# --- the hub without a network ------------------------------------------------------------------


@pytest.mark.parametrize("offline", ["closed-port", "HF_HUB_OFFLINE"])
def test_a_hub_name_with_no_network_is_refused_at_once(tmp_path, monkeypatch, offline):
    """Not cached and the hub unreachable: refused by validate without the hub client's retries
    (the endpoint is a closed port on loopback, or the client is told it is offline)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache
    if offline == "closed-port":
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    out = _refused(tmp_path, _study({"model": {"hf": "no-such-org/no-such-model"}}), "model.hf")
    assert "is not in the Hugging Face cache and the hub cannot be reached" in out
    study = _study({"data": {"val_tokens": 4096, "tokenizer": "no-such-org/no-such-tok"}})
    out = _refused(tmp_path, study, "data.tokenizer")
    assert "the hub cannot be reached" in out
    assert time.monotonic() - t0 < 20  # the hub client alone retried 26-27 s for each


@pytest.mark.parametrize("offline", ["closed-port", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_a_hub_validation_set_with_no_network_is_refused_by_validate_and_run(
    tmp_path, monkeypatch, offline
):
    """``data.val`` naming a hub dataset that neither the data cache (prepared) nor the datasets
    cache holds, the hub unreachable: refused by validate, and by run before it writes anything,
    naming the field and what would work (it passed validate, and run failed with a
    ConnectionError traceback after the hub client's retries)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache
    for name in ("HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    if offline == "closed-port":
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    else:
        monkeypatch.setenv(offline, "1")
    val = {"corpus": "hf", "hf_dataset": "allenai/c4", "hf_config": "en", "max_documents": 100}
    study = _study({"data": {"val_tokens": 4096, "val": val}}, data_cache=str(tmp_path / "cache"))
    named = ("data.val.hf_dataset: 'allenai/c4'", "the hub cannot be reached", "local copy")
    out = _refused(tmp_path, study, *named, "ablate data prepare")
    assert (offline if offline != "closed-port" else "127.0.0.1:9") in out
    runs = tmp_path / "runs"
    args = ["run", str(tmp_path / "study.yaml"), "-o", str(runs), "--executor", "local"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert all(n in res.output for n in named) and "Traceback" not in res.output
    assert not runs.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ({"base": {"train": {"steps": True}}}, "base.train.steps: true is a boolean"),
        ({"resources": {"workers": True}}, "resources.workers: true is a boolean"),
        ({"resources": {"cpus": True}}, "resources.cpus: true is a boolean"),
        ({"grid": {"seed": [0], "train.lr": [True, 0.001]}}, "grid.train.lr: a boolean value"),
    ],
)
def test_a_boolean_where_a_number_belongs_is_refused_not_read_as_1(tmp_path, where, says):
    """pydantic's lax mode reads true as 1: ``steps: true`` would train one step."""
    study = _study()
    for k, v in where.items():
        if k == "base":
            study["base"]["train"].update(v["train"])
        else:
            study[k] = v
    code, out = _validate(tmp_path, study)
    assert code == 2 and says in out, out


@pytest.mark.parametrize("device", ["meta", "mps", "cpu:3"])
def test_a_device_no_run_trains_on_is_refused(tmp_path, device):
    """It passed validate, and `run` recorded failed cells (meta: "Cannot copy out of meta
    tensor"; an unknown device type for autocast)."""
    study = _study({"device": device})
    _refused(tmp_path, study, f"device: unknown {device!r}; allowed: auto, cpu, cuda, cuda:N")


def test_booleans_where_the_schema_takes_them_still_pass(tmp_path):
    study = _study(
        {
            "train": {
                "steps": 4,
                "batch_size": 2,
                "seq_len": 16,
                "eval_every": 2,
                "compile": False,
            },
        }
    )
    code, out = _validate(tmp_path, study)
    assert code == 0, out
