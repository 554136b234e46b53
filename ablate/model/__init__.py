"""The models a cell trains: the built-in Llama-style decoder and Hugging Face architectures.

    from ablate.model import ModelConfig, build_model
    model = build_model(ModelConfig(preset="tiny"), vocab_size=257, recipe=recipe, seed=0)

- ``config``: ``ModelConfig`` (a preset, explicit shape fields, or a Hugging Face config) and the
  presets (``PRESETS``), with the widths the memory estimate and the FLOP count read;
- ``decoder``: the built-in decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention), its builder
  and its parameter and FLOP counts (N, the non-embedding count of scaling laws:
  ``non_embedding_params`` of a config, ``count_non_embedding`` of a built model);
- ``hf``: a ``transformers`` causal LM behind the same interface, its decoder linears converted by
  ``backends.layer.convert``; ``hf_config``: its config read and checked (family, sizes,
  vocabulary, window, weight files) before a model is built;
- ``recompute``: per-block activation checkpointing that keeps every random stream.

Every block linear is a ``backends`` ``QuantLinear``; the embedding and the LM head stay in high
precision. It imports torch and ``backends`` (``transformers`` only for a Hugging Face model).

This ``__init__`` loads its modules on first attribute access: ``ModelConfig`` and a ``model.hf``
config's checks (``hf_config``) import no torch, so a study of the built-in model loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
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

_LAZY = {
    "PRESETS": "ablate.model.config",
    "ModelConfig": "ablate.model.config",
    "EMBEDDING_MODULES": "ablate.model.decoder",
    "Transformer": "ablate.model.decoder",
    "build_model": "ablate.model.decoder",
    "count_non_embedding": "ablate.model.decoder",
    "count_parameters": "ablate.model.decoder",
    "flops_per_token": "ablate.model.decoder",
    "non_embedding_params": "ablate.model.decoder",
    "num_params": "ablate.model.decoder",
    "HFCausalLM": "ablate.model.hf",
    "build_hf_model": "ablate.model.hf",
    "set_checkpointing": "ablate.model.recompute",
}

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


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
