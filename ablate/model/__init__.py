"""The models a cell trains: the built-in Llama-style decoder and Hugging Face architectures.

    from ablate.model import ModelConfig, build_model
    model = build_model(ModelConfig(preset="tiny"), vocab_size=257, recipe=recipe, seed=0)

- ``config``: ``ModelConfig`` (a preset, explicit shape fields, or a Hugging Face config) and the
  presets (``PRESETS``), with the widths the memory estimate and the FLOP count read;
- ``decoder``: the built-in decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention), its builder
  and its parameter and FLOP counts (N, the non-embedding count of scaling laws:
  ``non_embedding_params`` of a config, ``count_non_embedding`` of a built model);
- ``hf``: a ``transformers`` causal LM behind the same interface, its decoder linears converted by
  ``backends.layer.convert``;
- ``recompute``: per-block activation checkpointing that keeps every random stream.

Every block linear is a ``backends`` ``QuantLinear``; the embedding and the LM head stay in high
precision. It imports torch and ``backends`` (``transformers`` only for a Hugging Face model).
"""

from ablate.model.config import PRESETS, ModelConfig
from ablate.model.decoder import (
    EMBEDDING_MODULES,
    Transformer,
    build_model,
    count_non_embedding,
    count_parameters,
    flops_per_token,
    non_embedding_params,
    num_params,
)
from ablate.model.hf import HFCausalLM, build_hf_model
from ablate.model.recompute import set_checkpointing

__all__ = [
    "EMBEDDING_MODULES",
    "PRESETS",
    "HFCausalLM",
    "ModelConfig",
    "Transformer",
    "build_hf_model",
    "build_model",
    "count_non_embedding",
    "count_parameters",
    "flops_per_token",
    "non_embedding_params",
    "num_params",
    "set_checkpointing",
]
