"""From the trainer's weights to a Hugging Face checkpoint's: ``hf_checkpoint`` is the single
dispatch point that turns a run's configuration and model state dict into (the ``transformers``
config as a dict, the state dict under ``transformers``' names).

Two sources of weights plug in here:

- the built-in decoder (``ablate.model.decoder.Transformer``) becomes ``LlamaForCausalLM``
  (``llama_checkpoint``): the keys are renamed, and the rows of ``wq`` and ``wk`` are permuted per
  head, because the built-in model rotates the interleaved channel pairs (2i, 2i+1) of each head
  (Meta's RoPE) where ``transformers``' Llama rotates the halves (i, i + head_dim/2). The functions
  are equal: the permuted projections feed the same rotations to the same dot products;
- a Hugging Face architecture (``model: {hf: ...}``) keeps ``transformers``' own parameter names, so
  its mapping is the identity (``hf_source_checkpoint``).

Either way the quantized layers' random-stream buffers (``backends.QuantLinear``'s ``sr_seed``,
``calls``, ``hadamard_signs``) are dropped: a ``QuantLinear`` keeps its high-precision master
``weight`` and quantizes it in each GEMM, so the export holds the master weights, never FP4 or FP8
codes. Any other key the mapping does not know is an error, never silently left out.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from ablate.errors import ExportError

if TYPE_CHECKING:
    from ablate.model import ModelConfig
    from ablate.train.config import RunConfig

QUANT_BUFFERS = ("sr_seed", "calls", "hadamard_signs")
"""The persistent buffers a ``backends.QuantLinear`` adds beside its ``weight`` (random-stream
state of training, nothing a forward in high precision reads): never exported."""

DEPARTURES = (
    "no RoPE scaling: the 1b and llama3_8b presets have the Llama 3.2-1B and 3.1-8B shapes but "
    "not their long-context 'llama3' RoPE scaling (rope_type default, same rope_theta)",
    "no BOS token: the training stream separates documents by the tokenizer's EOS only",
    "RMSNorm under bf16 autocast multiplies by its weight in float32 before the cast back, "
    "transformers' Llama after it (identical in float32)",
)
"""Where the built-in model is not Llama 3 as ``transformers`` runs it; recorded in every export of
it (``ablate_export.json``). The RoPE convention is no departure: the export permutes it away."""

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_BLOCK_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def hf_checkpoint(
    config: RunConfig, state: dict[str, torch.Tensor], *, eos_id: int | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json's dict, the ``transformers`` state dict) for a run of ``config`` whose model
    state dict is ``state``: the one place that picks the mapping of the run's kind of model."""
    if config.model.hf is not None:
        return hf_source_checkpoint(config.model.hf, state)
    vocab = int(state["tok_embeddings.weight"].shape[0])
    return llama_checkpoint(config.model.resolved(vocab), state, eos_id=eos_id)


def without_quant_buffers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the ``QuantLinear`` buffers (``QUANT_BUFFERS``)."""
    return {k: v for k, v in state.items() if k.rpartition(".")[2] not in QUANT_BUFFERS}


def permute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a query or key projection (n_heads * head_dim, dim) reordered per head from the
    interleaved pairs (2i, 2i+1) to the halves (i, i + head_dim/2) of ``transformers``' RoPE."""
    rows, dim = w.shape
    hd = rows // n_heads
    return w.view(n_heads, hd // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


def llama_checkpoint(
    cfg: ModelConfig, state: dict[str, torch.Tensor], *, eos_id: int | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The built-in decoder of resolved shape ``cfg`` as ``LlamaForCausalLM`` (module docstring).
    A tied LM head is written once, as the embedding (``tie_word_embeddings``)."""
    assert cfg.dim and cfg.n_heads and cfg.n_kv_heads and cfg.n_layers
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, w in without_quant_buffers(state).items():
        m = _LAYER.match(key)
        if m and m.group(2) in _BLOCK_NAMES:
            i, rest = m.groups()
            if rest == "attention.wq.weight":
                w = permute_rotary(w, cfg.n_heads)
            elif rest == "attention.wk.weight":
                w = permute_rotary(w, cfg.n_kv_heads)
            out[f"model.layers.{i}.{_BLOCK_NAMES[rest]}"] = w
        elif key in _TOP_NAMES:
            if key == "lm_head.weight" and cfg.tie_embeddings:
                continue  # the embedding's own tensor
            out[_TOP_NAMES[key]] = w
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"export: the checkpoint holds {', '.join(unknown[:5])}, which the built-in model's "
            "mapping to LlamaForCausalLM does not know"
        )
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers 4.x
        "rope_parameters": rope,  # transformers 5.x
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": None,
    }
    return hf_config, out


def hf_source_checkpoint(
    spec: str, state: dict[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face architecture's run (``model: {hf: spec}``): its config as ``transformers``
    reads it from ``spec``, its weights under their own names (the identity mapping, without the
    quantization buffers; a tied head written once, as ``save_pretrained`` does)."""
    from ablate.export.weights import transformers_module

    tf = transformers_module()
    conf = tf.AutoConfig.from_pretrained(spec)
    out = without_quant_buffers(state)
    if getattr(conf, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    d = conf.to_dict()
    if not d.get("architectures"):  # e.g. a config saved from Qwen3Config(...) itself: null
        d["architectures"] = [causal_lm_class(conf.model_type)]
    return d, out


def causal_lm_class(model_type: str) -> str:
    """The name of ``transformers``' causal-LM class for ``model_type`` (what ``AutoModelForCausalLM``
    builds), for a config that names no ``architectures``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ExportError(
            f"model.hf: its config names no architectures and transformers has no causal-LM "
            f"class for model_type {model_type!r}"
        )
    return str(name)
