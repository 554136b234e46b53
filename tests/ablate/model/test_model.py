"""The Llama-style decoder: presets and parameter counts, shapes, init, GQA, causality, conversion
to quantized linears, and config validation. CPU only, a few seconds in all."""

import math
import os

import pytest
import torch
from torch import nn

from ablate.model import (
    PRESETS,
    ModelConfig,
    Transformer,
    build_model,
    count_non_embedding,
    count_parameters,
    flops_per_token,
    non_embedding_params,
    num_params,
)
from backends import QuantLinear, Recipe, convert_model

V = 256  # byte vocabulary
LLAMA31_8B_PARAMS = 8_030_261_248
MICRO = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "max_seq_len": 32}


def micro(**kw: object) -> ModelConfig:
    return ModelConfig(**{**MICRO, **kw})  # type: ignore[arg-type]


def batch(b: int = 2, t: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, t), generator=g), torch.randint(0, V, (b, t), generator=g)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_llama3_8b_preset_counts_8_03b_parameters_on_meta_without_allocating():
    """No weight is allocated: the process's resident memory grows by less than 256 MiB, where
    the 8.03B weights alone would take 16 GiB in bf16 (a time limit here measured the machine's
    load, not the allocation)."""
    num_params(micro(), V)  # a process's first meta init imports torch._refs, once
    before = _resident_bytes()
    n = num_params(ModelConfig(preset="llama3_8b"))
    model = build_model(ModelConfig(preset="llama3_8b"), vocab_size=128_256, device="meta")
    assert _resident_bytes() - before < 256 * 2**20
    assert abs(n - LLAMA31_8B_PARAMS) / LLAMA31_8B_PARAMS < 1e-3
    assert n == LLAMA31_8B_PARAMS  # exact: same shapes as Llama 3.1-8B
    assert count_parameters(model) == n
    assert all(p.is_meta for p in model.parameters())


def test_every_preset_builds_a_consistent_config():
    for name in PRESETS:
        cfg = ModelConfig(preset=name).resolved(V)
        assert cfg.preset is None and cfg.vocab_size == V
        assert num_params(cfg) > 0


def test_the_non_embedding_count_of_tiny_is_its_hand_count():
    # tiny: width 128, 4 blocks of 4 query heads and 2 key/value heads of 32, SwiGLU of 384
    wq = wo = 128 * 128
    wk = wv = 128 * (2 * 32)
    w1 = w2 = w3 = 128 * 384
    norms = 2 * 128  # attention_norm, ffn_norm
    n = 4 * (wq + wo + wk + wv + w1 + w2 + w3 + norms) + 128  # and the final norm
    assert n == 787_584
    assert non_embedding_params(ModelConfig(preset="tiny")) == n
    model = build_model(ModelConfig(preset="tiny"), V)
    assert count_non_embedding(model) == n == count_parameters(model) - V * 128  # one (tied) table
    assert non_embedding_params(ModelConfig(preset="small")) == 9_442_176  # "~9.4M" (config.py)


def test_the_non_embedding_count_of_a_config_is_its_models_blocks_and_final_norm():
    for name in PRESETS:
        cfg = ModelConfig(preset=name)
        model = build_model(cfg, 1000, device="meta")
        blocks = sum(p.numel() for p in model.layers.parameters()) + model.norm.weight.numel()
        assert non_embedding_params(cfg) == count_non_embedding(model) == blocks, name
    # no vocabulary enters it, nor an untied head
    untied = micro(vocab_size=300, tie_embeddings=False)
    assert non_embedding_params(untied) == non_embedding_params(micro())
    assert count_non_embedding(build_model(untied, 300)) == non_embedding_params(micro())


def test_tied_embedding_is_counted_once():
    tied = num_params(micro(tie_embeddings=True), V)
    untied = num_params(micro(tie_embeddings=False), V)
    assert untied - tied == V * MICRO["dim"]
    model = build_model(micro(tie_embeddings=True), V)
    assert model.lm_head.weight is model.tok_embeddings.weight


def test_forward_returns_logits_of_shape_batch_seq_vocab():
    model = build_model(ModelConfig(preset="tiny"), V)
    tokens, _ = batch(3, 20)
    logits = model(tokens)
    assert logits.shape == (3, 20, V) and logits.dtype == torch.float32


def test_initial_loss_is_about_ln_vocab():
    model = build_model(ModelConfig(preset="tiny"), V)
    tokens, targets = batch(4, 64)
    loss = model(tokens, targets)
    assert loss.shape == () and loss.dtype == torch.float32
    assert abs(loss.item() - math.log(V)) < 0.1


def test_same_seed_gives_identical_weights_and_another_seed_different_ones():
    a, b = (build_model(micro(), V, seed=7).state_dict() for _ in range(2))
    c = build_model(micro(), V, seed=8).state_dict()
    assert a.keys() == b.keys() == c.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert not torch.equal(a["layers.0.attention.wq.weight"], c["layers.0.attention.wq.weight"])


def test_init_scales_residual_output_projections_by_depth():
    model = build_model(ModelConfig(preset="small"), V)  # 6 layers: wo, w2 std 0.02 / sqrt(12)
    block = model.layers[0]
    assert abs(block.attention.wq.weight.std().item() - 0.02) < 1e-3
    assert abs(block.feed_forward.w2.weight.std().item() - 0.02 / math.sqrt(12)) < 3e-4
    assert torch.equal(block.ffn_norm.weight, torch.ones(384))


def test_grouped_query_attention_equals_mha_with_each_kv_head_shared():
    gqa = build_model(micro(n_kv_heads=2), V, seed=1)  # 4 query heads, 2 kv heads
    mha = build_model(micro(n_kv_heads=4), V, seed=2)
    assert gqa.layers[0].attention.wk.weight.shape == (2 * 16, 64)
    state = gqa.state_dict()
    for i in range(MICRO["n_layers"]):
        for w in ("wk", "wv"):  # (KV*hd, C) -> (H*hd, C): kv head j serves query heads 2j, 2j+1
            key = f"layers.{i}.attention.{w}.weight"
            state[key] = state[key].view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64)
    mha.load_state_dict(state)
    tokens, _ = batch()
    torch.testing.assert_close(gqa(tokens), mha(tokens), rtol=1e-5, atol=1e-5)
    mqa = build_model(micro(n_kv_heads=1), V)  # multi-query attention works too
    assert mqa(tokens).shape == (2, 16, V)


def test_attention_is_causal():
    model = build_model(micro(), V)
    tokens, _ = batch(1, 16)
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % V
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_state_dict_round_trip_reproduces_logits():
    a, b = build_model(micro(), V, seed=0), build_model(micro(), V, seed=1)
    assert not any("rope" in k for k in a.state_dict())  # RoPE tables are recomputed, not saved
    b.load_state_dict(a.state_dict())
    tokens, _ = batch()
    torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)


def test_recipe_converts_every_block_linear_and_keeps_lm_head_plain():
    cfg = micro(tie_embeddings=False)
    model = build_model(cfg, V, recipe=Recipe.from_shorthand(["fprop", "dgrad", "wgrad"]))
    quant = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    assert len(quant) == 7 * MICRO["n_layers"]
    assert {n.rsplit(".", 1)[-1] for n in quant} == {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}
    assert type(model.lm_head) is nn.Linear
    assert type(model.tok_embeddings) is nn.Embedding
    assert count_parameters(model) == num_params(cfg, V)  # conversion shares, never copies


def test_all_high_precision_recipe_leaves_the_model_unconverted():
    model = build_model(micro(), V, recipe=Recipe.bf16())
    assert not any(isinstance(m, QuantLinear) for m in model.modules())


def test_bf16_recipe_through_quantlinear_gives_identical_loss_and_gradients():
    plain, quant = build_model(micro(), V, seed=3), build_model(micro(), V, seed=3)
    assert len(convert_model(quant, Recipe.bf16())) == 7 * MICRO["n_layers"]
    tokens, targets = batch()
    losses = []
    for model in (plain, quant):
        loss = model(tokens, targets)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    grads = dict(quant.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=0, msg=name)


def test_mxfp4_recipe_gives_a_different_but_close_loss():
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"])
    plain = build_model(ModelConfig(preset="tiny"), V, seed=0)
    fp4 = build_model(ModelConfig(preset="tiny"), V, recipe=recipe, seed=0)
    tokens, targets = batch(2, 64)
    ref, got = plain(tokens, targets), fp4(tokens, targets)
    got.backward()
    assert got.item() != ref.item()
    assert abs(got.item() - ref.item()) < 0.05 * ref.item()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fp4.parameters())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"preset": "huge"}, "model.preset"),
        ({"n_heads": 3}, "model.n_heads"),  # 3 does not divide dim 128
        ({"n_heads": 128}, "model.n_heads"),  # head_dim 1 is odd: RoPE needs pairs
        ({"n_kv_heads": 3}, "model.n_kv_heads"),  # 3 does not divide 4 heads
        ({"dim": 0}, "model.dim"),
        ({"n_layers": -1}, "model.n_layers"),
        ({"preset": None, "dim": 64}, "model.n_layers"),  # no preset: shape fields required
    ],
)
def test_bad_config_raises_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ModelConfig(**kwargs)


def test_unknown_preset_error_lists_the_presets():
    with pytest.raises(ValueError, match="tiny, small, 125m, 1b, llama3_8b"):
        ModelConfig(preset="huge")


def test_vocab_smaller_than_tokenizer_raises_naming_model_vocab_size():
    with pytest.raises(ValueError, match=r"model\.vocab_size"):
        ModelConfig(vocab_size=100).resolved(V)


def test_sequence_longer_than_max_seq_len_raises():
    model = build_model(micro(), V)
    with pytest.raises(ValueError, match=r"seq_len: 33 exceeds model\.max_seq_len 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_explicit_fields_override_the_preset():
    cfg = ModelConfig(preset="tiny", dim=64, n_layers=2, max_seq_len=512).resolved(V)
    tiny = PRESETS["tiny"]
    assert (cfg.dim, cfg.n_layers, cfg.max_seq_len) == (64, 2, 512)
    assert (cfg.n_heads, cfg.ffn_dim, cfg.tie_embeddings) == (tiny.n_heads, tiny.ffn_dim, True)
    model = Transformer(cfg)
    assert len(model.layers) == 2 and model.tok_embeddings.weight.shape == (V, 64)
    assert model.rope_cos.shape == (512, 8)  # head_dim 64 / 4 heads = 16, halved


def test_tokenizer_vocab_overrides_the_preset_default():
    assert ModelConfig(preset="llama3_8b").resolved().vocab_size == 128_256
    assert ModelConfig(preset="llama3_8b").resolved(V).vocab_size == V
    assert ModelConfig(preset="tiny", vocab_size=512).resolved(V).vocab_size == 512


def test_flops_per_token_is_6n_plus_attention_term():
    cfg = ModelConfig(preset="llama3_8b")
    n_matmul = num_params(cfg) - 128_256 * 4096  # all but the embedding lookup (norms ~1e-6)
    expected = 6 * n_matmul + 12 * 32 * 4096 * 8192
    assert abs(flops_per_token(cfg) - expected) / expected < 1e-4
    assert flops_per_token(cfg, seq_len=1024) < flops_per_token(cfg)


def test_head_dim_sets_the_heads_width_apart_from_the_models():
    """``model.head_dim`` (Qwen3-0.6B: 16 heads of 128 at width 1024): queries n_heads x head_dim
    wide, keys and values n_kv_heads x head_dim; width / heads need not divide then; odd refused."""
    cfg = ModelConfig(preset="tiny", head_dim=64)  # tiny: width 128, 4 heads, 2 kv heads
    m = build_model(cfg, 257)
    a = m.layers[0].attention
    assert a.wq.weight.shape == (256, 128) and a.wk.weight.shape == (128, 128)
    assert a.wo.weight.shape == (128, 256) and m.rope_cos.shape == (256, 32)
    assert m(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 257)
    odd = dict(dim=100, n_layers=1, n_heads=3, n_kv_heads=1, ffn_dim=64, max_seq_len=16)
    assert ModelConfig(preset=None, head_dim=32, **odd).resolved(257).head_dim == 32
    with pytest.raises(ValueError, match="model.n_heads: 3 does not divide model.dim 100"):
        ModelConfig(preset=None, **odd)
    with pytest.raises(ValueError, match="model.head_dim: 33 must be even"):
        ModelConfig(preset="tiny", head_dim=33)
    assert "head_dim" not in ModelConfig(preset="tiny").to_dict()  # a preset's key as before
