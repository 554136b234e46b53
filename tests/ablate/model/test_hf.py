"""Hugging Face architectures in the trainer (``model: {hf: ...}``, ablate.model.hf) and
``backends.layer.convert``: the trainer's forward is each family's own, bit for bit; conversion places every
decoder linear by the family's table and refuses what it does not know; a converted plain
``transformers`` model draws the trainer's random streams; the cell trains in one process, with
checkpointed layers (bit-identical), across a resume (bit-identical), compiled, with probes, and with
2 DDP or FSDP2 workers; bad configurations name their field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from test_recompute import _run, _same, _two_ranks  # noqa: E402
from test_recompute import cfg as _cfg  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from ablate.model import (  # noqa: E402
    HFCausalLM,  # noqa: E402
    ModelConfig,
    build_model,
    count_non_embedding,
    count_parameters,
    non_embedding_params,
    num_params,
)
from ablate.model.hf_config import SIZE_LIMITS, TRAINABLE, check_config
from ablate.train import RunConfig  # noqa: E402
from ablate.train.config import config_hash  # noqa: E402
from backends import (  # noqa: E402
    ARCHITECTURES,
    GEMMS,
    QuantLinear,
    Recipe,
    UnknownArchitectureError,
    convert,
)

ROOT = Path(__file__).resolve().parents[3]
QWEN3 = str(ROOT / "studies" / "qwen3_tiny" / "config.json")
RECIPE = Recipe.from_shorthand(GEMMS, "sr+rht16")


def _small(model_type: str, folder: Path, **kw: Any) -> str:
    """A two-layer config of ``model_type`` saved in ``folder``; its path."""
    cfg = AutoConfig.for_model(
        model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=257, max_position_embeddings=64,
        pad_token_id=None, bos_token_id=None, eos_token_id=256, **kw,
    )  # fmt: skip
    cfg.save_pretrained(folder)
    return str(folder / "config.json")


@pytest.mark.parametrize("model_type", TRAINABLE)
def test_the_trainers_forward_is_the_architectures_own_bit_for_bit(tmp_path, model_type):
    path = _small(model_type, tmp_path)
    ours = build_model(ModelConfig(hf=path), 257, seed=5)
    assert isinstance(ours, HFCausalLM)
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    ref.load_state_dict(ours.state_dict())  # the same names: an export is the state dict as it is
    tokens = torch.randint(0, 257, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(tokens), ref(tokens).logits)
    assert num_params(ModelConfig(hf=path), 257) == sum(p.numel() for p in ref.parameters())


def test_the_same_seed_builds_the_same_weights_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = (build_model(ModelConfig(hf=QWEN3), 257, seed=1) for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), before)
    c = build_model(ModelConfig(hf=QWEN3), 257, seed=2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(
        sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"]
    )


def _recipes(model: nn.Module) -> dict[str, Recipe]:
    return {n: m.recipe for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def test_convert_places_every_decoder_linear_by_the_table_and_selects_like_a_study():
    model = build_model(ModelConfig(hf=QWEN3), 257)  # 4 layers
    names = convert(model, RECIPE, select={"layers": ["mlp"], "keep_first": 1})
    assert len(names) == 4 * 7 and isinstance(model.lm_head, nn.Linear)
    assert type(model.lm_head) is nn.Linear  # the LM head stays high precision
    rec = _recipes(model)
    for name, r in rec.items():
        block = int(name.split(".")[2])
        quantized = ".mlp." in name and block >= 1
        assert r.high_precision != quantized, name
    assert [m.layer_id for m in model.modules() if isinstance(m, QuantLinear)] == list(range(28))


def test_an_unknown_architecture_or_linear_is_refused_with_what_is_known(tmp_path):
    gpt2 = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2)
    )
    with pytest.raises(UnknownArchitectureError, match=r"'gpt2' .* known: gemma, gemma2, llama"):
        convert(gpt2, RECIPE)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(QWEN3))
    model.model.layers[1].self_attn.gate = nn.Linear(128, 128)
    with pytest.raises(UnknownArchitectureError, match=r"layer 1 has a linear 'self_attn.gate'"):
        convert(model, RECIPE)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # nothing half-converted
    with pytest.raises(ValueError, match=r"model.hf: architecture 'gpt2' .* allowed: llama"):
        AutoConfig.for_model("gpt2").save_pretrained(tmp_path)
        ModelConfig(hf=str(tmp_path / "config.json")).resolved(257)
    assert set(TRAINABLE) <= set(ARCHITECTURES)


def test_a_converted_transformers_model_draws_the_trainers_random_streams():
    """``backends.layer.convert`` on a plain ``transformers`` model (the README's use) quantizes as the
    trainer's cell does: same layer ids, same keys, so the same loss and gradients."""
    cell = build_model(ModelConfig(hf=QWEN3), 257, recipe=RECIPE, seed=7)
    plain = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(QWEN3))
    plain.load_state_dict(
        {k: v for k, v in cell.state_dict().items() if "weight" in k}, strict=False
    )
    convert(plain, RECIPE, seed=7)
    tokens = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(1))
    a = cell(tokens[:, :-1], tokens[:, 1:])
    b = nn.functional.cross_entropy(
        plain(tokens[:, :-1]).logits.flatten(0, 1), tokens[:, 1:].flatten()
    )
    a.backward()
    b.backward()
    assert torch.equal(a, b)
    ga = cell.model.layers[2].self_attn.k_proj.weight.grad
    gb = plain.model.layers[2].self_attn.k_proj.weight.grad
    assert ga is not None and gb is not None and torch.equal(ga, gb)


def cfg(ac: str = "none", **kw: Any) -> dict[str, Any]:
    d = _cfg(ac, **kw)
    d["model"] = {"hf": QWEN3}
    return d


def test_a_cell_trains_and_checkpointing_and_resume_are_bit_identical(tmp_path):
    ref = _run(cfg("none"))
    assert ref[1]["model.layers.0.self_attn.q_proj.calls"] == 3
    assert ref[0][-1] < ref[0][0]  # it learns
    _same(_run(cfg("blocks")), ref)
    d = cfg("blocks", checkpoint_dir=str(tmp_path / "ckpt"))
    _run(d, stop_after=2)
    _same(_run(d), ref)


@pytest.mark.slow
def test_a_compiled_cell_trains_like_the_eager_one(monkeypatch):
    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", "aot_eager")
    eager, compiled = _run(cfg(steps=2)), _run(cfg(steps=2, compile=True))
    assert compiled[0] == pytest.approx(eager[0], rel=5e-3)
    _same(_run(cfg("blocks", steps=2, compile=True)), compiled)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_workers_train_a_cell_bit_identically_with_checkpointed_layers(mode):
    ref = _two_ranks(cfg("none", parallel=mode, workers=2, steps=2))
    ours = _two_ranks(cfg("blocks", parallel=mode, workers=2, steps=2))
    assert ours.keys() == ref.keys() and "model.layers.3.mlp.down_proj.weight" in ref
    for k in ref:
        assert ours[k] == ref[k] if k == "__evals__" else torch.equal(ours[k], ref[k]), k


def test_a_bf16_all_gather_of_a_cells_linears_is_bit_identical_to_the_fp32_one():
    def fsdp(all_gather: str) -> dict[str, Any]:
        d = cfg("blocks", parallel="fsdp", grad_accum=2)
        d["train"] |= {"precision": "bf16", "fsdp_all_gather": all_gather}
        return d

    _same(_run(fsdp("bf16")), _run(fsdp("fp32")))


def test_probes_measure_a_cells_layers_by_block():
    from ablate.train.probe import make_prober

    config = RunConfig.from_dict(cfg(steps=2) | {"probe": {"every": 2, "layers": [0, 3]}})
    model = build_model(config.model, 257, recipe=config.recipe, seed=0)
    val = torch.randint(0, 257, (4096,), generator=torch.Generator().manual_seed(0))
    prober = make_prober(config, model, val)
    assert prober is not None and {n.split(".")[2] for n in prober.layers} == {"0", "3"}
    metrics = prober.run()
    assert any(k.endswith(".L3") for k in metrics) and not any(k.endswith(".L1") for k in metrics)
    assert all(v == v for v in metrics.values())  # no NaN


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "olmo2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_memory_estimate_counts_what_an_architecture_saves(tmp_path, model_type, precision):
    """``ablate plan``'s activation estimate against the bytes autograd saves in one forward (as
    tests/ablate/train/test_memory.py checks the presets), heads wider than width / heads, and
    Qwen3's per-head and OLMo 2's full-width q/k norms; the parameter count is the model's own."""
    from test_memory import _saved_bytes

    from ablate.train.memory import activation_parts, estimate

    path = _small(model_type, tmp_path, head_dim=32, tie_word_embeddings=True)
    mc = ModelConfig(hf=path)
    model = build_model(mc, 257)
    b, t = 4, 48
    tokens = torch.randint(0, 257, (b, t), generator=torch.Generator().manual_seed(0))
    measured = _saved_bytes(model, tokens, precision)
    est = estimate(mc, 257, batch_size=b, grad_accum=1, seq_len=t, precision=precision)
    transient = activation_parts(mc.resolved(257), b, t, precision)["loss_transient"]
    predicted = est.activations - transient + est.weight_copies
    assert predicted == pytest.approx(measured, rel=0.01)
    assert est.n_params == sum(p.numel() for p in model.parameters())


def test_the_non_embedding_count_of_an_architecture_is_its_blocks_and_final_norm():
    # qwen3_tiny is the tiny preset's shape (787,584 without embeddings) plus each block's q and k
    # norms of head_dim 32
    assert non_embedding_params(ModelConfig(hf=QWEN3)) == 787_584 + 4 * 2 * 32
    model = build_model(ModelConfig(hf=QWEN3), 257)
    blocks = sum(p.numel() for p in model.layers.parameters()) + model.model.norm.weight.numel()
    assert count_non_embedding(model) == blocks == 787_840


@pytest.mark.parametrize("model_type", TRAINABLE)
def test_counts_from_two_built_layers_equal_the_whole_models(tmp_path, model_type):
    """``num_params`` and ``non_embedding_params`` build one and two decoder layers on the meta
    device (``hf.meta_count``), not all of them: the same counts as the model of five layers."""
    path = Path(_small(model_type, tmp_path))
    d = json.loads(path.read_text())
    d["num_hidden_layers"] = 5
    if d.get("layer_types"):
        d["layer_types"] = [d["layer_types"][0]] * 5
    path.write_text(json.dumps(d))
    mc = ModelConfig(hf=str(path))
    model = build_model(mc, 257)
    assert len(model.layers) == 5
    assert num_params(mc, 257) == count_parameters(model)
    assert non_embedding_params(mc) == count_non_embedding(model)


LLAMA_405B = {
    "hidden_size": 16_384,
    "intermediate_size": 53_248,
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "vocab_size": 128_256,
}


def test_a_config_past_the_size_limits_is_refused_and_the_largest_real_shapes_are_not(tmp_path):
    def saved(name: str, **shape: int) -> str:
        AutoConfig.for_model("llama", **shape).save_pretrained(tmp_path / name)
        return str(tmp_path / name)

    check_config(saved("405b", **LLAMA_405B), vocab_size=None, seq_len=None)
    for field, limit in SIZE_LIMITS.items():
        over = saved(field, **(LLAMA_405B | {field: limit + 256}))
        with pytest.raises(ValueError, match=f"model.hf: .* has {field} {limit + 256}; allowed"):
            check_config(over, vocab_size=None, seq_len=None)
    wide = saved("wide", **(LLAMA_405B | {"hidden_size": 65_536, "num_hidden_layers": 1024}))
    with pytest.raises(ValueError, match="parameters by its shapes .*allowed: at most 1e\\+13"):
        check_config(wide, vocab_size=None, seq_len=None)


def test_a_pretrained_folder_loads_its_weights(tmp_path):
    src = build_model(ModelConfig(hf=QWEN3), 257, seed=11)
    src.__dict__["lm"].save_pretrained(tmp_path)
    loaded = build_model(ModelConfig(hf=str(tmp_path), init="pretrained"), 257, seed=0)
    a, b = src.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="model.init: pretrained, but no weights"):
        build_model(ModelConfig(hf=QWEN3, init="pretrained"), 257)


def test_bad_configurations_name_their_field(tmp_path):
    with pytest.raises(ValueError, match="model.dim: not allowed with model.hf"):
        ModelConfig(hf=QWEN3, dim=64)
    with pytest.raises(ValueError, match="model.init: 'pretrained' needs model.hf"):
        ModelConfig(init="pretrained")
    with pytest.raises(
        ValueError, match="model.init: unknown 'zeros'; allowed: random, pretrained"
    ):
        ModelConfig(hf=QWEN3, init="zeros")
    with pytest.raises(ValueError, match="model.hf: .*missing.json' does not exist"):
        ModelConfig(hf=str(tmp_path / "missing.json")).resolved()
    with pytest.raises(
        ValueError, match="train.seq_len: 512 is longer than model.hf's max_position"
    ):
        RunConfig.from_dict(cfg() | {"train": {"seq_len": 512}})
    slide = _small("mistral", tmp_path / "m", sliding_window=16)
    with pytest.raises(ValueError, match="sliding attention window \\(16\\).*train.seq_len <= 16"):
        RunConfig.from_dict(cfg() | {"model": {"hf": slide}})
    with pytest.raises(
        ValueError, match="vocab_size 257 is smaller than the tokenizer's vocabulary"
    ):
        build_model(ModelConfig(hf=QWEN3), 1000)


def test_the_architecture_is_in_the_key_by_its_contents_and_a_presets_key_is_as_before(tmp_path):
    preset = RunConfig.from_dict(_cfg("none"))
    assert "hf" not in preset.to_dict()["model"]  # a preset cell's key and params as ever
    a = RunConfig.from_dict(cfg())
    weights = tmp_path / "weights"  # pretrained needs a folder with weights (its header is read)
    weights.mkdir()
    (weights / "config.json").write_text(Path(QWEN3).read_text())
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(weights / "model.safetensors"))
    b = RunConfig.from_dict(cfg() | {"model": {"hf": str(weights), "init": "pretrained"}})
    assert len({config_hash(preset), config_hash(a), config_hash(b)}) == 3
    assert RunConfig.from_dict(a.to_dict()) == a
    assert a.to_dict()["model"]["hf"] == QWEN3 and a.to_dict()["model"]["init"] == "random"
    raw = json.loads(Path(QWEN3).read_text())
    moved = tmp_path / "moved"  # the same architecture elsewhere, written differently: same key
    moved.mkdir()
    (moved / "config.json").write_text(json.dumps(dict(reversed(raw.items())), indent=4))
    assert config_hash(RunConfig.from_dict(cfg() | {"model": {"hf": str(moved)}})) == config_hash(a)
    edited = tmp_path / "edited.json"  # an edited architecture under any path: another key
    edited.write_text(json.dumps(raw | {"rms_norm_eps": 1e-5}))
    assert config_hash(RunConfig.from_dict(cfg() | {"model": {"hf": str(edited)}})) != config_hash(
        a
    )


def test_the_guides_convert_example_runs_and_quantizes_what_it_says():
    """docs/models.md's ``backends.layer.convert`` example, as written, on a plain transformers model."""
    text = (ROOT / "docs" / "models.md").read_text()
    block = text.split("## From Python")[1].split("```python\n")[1].split("```")[0]
    scope: dict[str, Any] = {}
    exec(compile(block, "docs/models.md", "exec"), scope)
    model = scope["model"]
    fp4 = {n for n, r in _recipes(model).items() if not r.high_precision}
    assert fp4 == {
        f"model.layers.{b}.mlp.{p}" for b in range(3) for p in ("gate_proj", "up_proj", "down_proj")
    }
    grad = model.model.layers[0].mlp.up_proj.weight.grad
    assert grad is not None and torch.isfinite(grad).all()
