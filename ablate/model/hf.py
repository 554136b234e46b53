"""Hugging Face architectures in the trainer: ``model: {hf: <config.json | model folder | hub name>}``.

The model is built by ``transformers`` (``AutoModelForCausalLM.from_config``, or ``from_pretrained``
with ``model.init: pretrained``) in float32, and every linear of its decoder layers becomes a
``backends.QuantLinear`` under the cell's recipe (``backends.layer.convert``: the architecture's table says
which linears are attention and which MLP, the block is the layer's index). ``HFCausalLM`` gives it
the shape the rest of the trainer relies on, the one of ``model.Transformer``:

- ``forward(tokens, targets=None)``: the embedding, the architecture's rotary embedding, each decoder
  layer, then ``output`` (final norm, LM head, float32 cross-entropy), as the family's own
  ``forward`` does (``hf_config.TRAINABLE`` lists the families whose forward is exactly that; the suite checks
  each one's logits against ``transformers``' own forward);
- ``layers``: the decoder layers, each given ``Block``'s interface in place (its class becomes a
  subclass with ``forward(x, cos, sin)`` and ``checkpointing``), so compile, activation checkpointing
  and FSDP2 (one unit per decoder layer) treat them as blocks; their parameter names do not change.

Parameter names are ``transformers``' own (``model.layers.0.self_attn.q_proj.weight``,
``lm_head.weight``): an export is the state dict as it is. Attention is SDPA with its causal flag
and no mask (the trainer's sequences are packed windows without padding); an architecture with
sliding-window layers is refused when ``train.seq_len`` is longer than the window. A random
initialization is ``transformers``' own (its ``initializer_range``), drawn on the CPU from the global
generator seeded with the cell's seed inside ``torch.random.fork_rng``: the same seed gives the same
weights, and the caller's random state is left as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.hf_config import check_config, transformers_module
from ablate.model.recompute import CheckpointedBlock
from backends import Recipe
from backends.layer import convert


class _BlockLayer(CheckpointedBlock):
    """The interface of ``model.Block`` on a ``transformers`` decoder layer (a mixin: a layer's class
    becomes ``type(name, (_BlockLayer, its class), {})``)."""

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # the decoder layer's own forward: the class after CheckpointedBlock in the layer's MRO
        out = super(CheckpointedBlock, self).forward(
            x, attention_mask=None, position_embeddings=(cos, sin)
        )
        return out[0] if isinstance(out, tuple) else out  # transformers 4.x returns a tuple


_BLOCK_CLASSES: dict[type, type] = {}


def _block_class(cls: type) -> type:
    """``cls`` with ``_BlockLayer``'s interface (one class per decoder layer class)."""
    if cls not in _BLOCK_CLASSES:
        _BLOCK_CLASSES[cls] = type(
            f"Block{cls.__name__}", (_BlockLayer, cls), {"__module__": __name__}
        )
    return _BLOCK_CLASSES[cls]


class HFCausalLM(nn.Module):
    """A ``transformers`` causal LM with ``model.Transformer``'s interface (module docstring). Its
    children are the LM's own (``model``, ``lm_head``), so are its parameter names."""

    model: Any  # the LM's decoder (embed_tokens, rotary_emb, layers, norm): transformers' module
    lm_head: Any

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.model = lm.model
        self.lm_head = lm.lm_head
        self.config = lm.config  # model_type and shapes: backends.layer.convert reads them
        self.__dict__["lm"] = lm  # the LM itself, unregistered (its modules are ours)
        for layer in self.model.layers:
            layer.__class__ = _block_class(type(layer))

    @property
    def layers(self) -> nn.ModuleList:
        layers: nn.ModuleList = self.model.layers
        return layers

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for ``tokens`` (B, T); with ``targets`` the mean cross-entropy (float32;
        -100 ignored), as ``Transformer.forward``."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected shape (batch, seq_len), got {tuple(tokens.shape)}")
        h = self.model.embed_tokens(tokens)  # (B, T, C)
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None]  # (1, T)
        cos, sin = self.model.rotary_emb(h, positions)  # (1, T, hd) each
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(h, targets)

    def output(self, h: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm, LM head, and with ``targets`` the loss (compiled as one graph)."""
        logits: torch.Tensor = self.lm_head(self.model.norm(h))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))

    def tie_weights(self) -> None:
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight


def meta_count(spec: str, count: Callable[[nn.Module], int], *, vocab_size: int | None) -> int:
    """``count`` (a sum over parameters) of ``spec``'s model, without building all its layers: the
    model built on the meta device with one decoder layer and with two gives the rest and one
    layer's share, times ``num_hidden_layers``. Exact for ``TRAINABLE``'s families (their decoder
    layers are alike), and as quick for a thousand layers as for one."""
    cfg = check_config(spec, vocab_size=vocab_size, seq_len=None)
    one, two = (count(_meta_model(cfg, n)) for n in (1, 2))
    return one + (int(cfg.num_hidden_layers) - 1) * (two - one)


def _meta_model(cfg: Any, layers: int) -> HFCausalLM:
    """The model of the config ``cfg`` cut to ``layers`` decoder layers, on the meta device."""
    tf = transformers_module()
    c = copy.deepcopy(cfg)
    c.num_hidden_layers = layers
    if isinstance(getattr(c, "layer_types", None), list):
        c.layer_types = c.layer_types[:layers]
    with torch.device("meta"):
        lm = tf.AutoModelForCausalLM.from_config(c, attn_implementation="sdpa", dtype=torch.float32)
    return HFCausalLM(lm)


def build_hf_model(
    spec: str,
    init: str,
    *,
    vocab_size: int | None,
    device: torch.device,
    recipe: Recipe | None = None,
    backend: str = "emulated",
    seed: int = 0,
    seq_len: int | None = None,
) -> HFCausalLM:
    """The float32 model of ``spec`` on ``device`` (meta: shapes only), randomly initialized from
    ``seed`` or loaded (``init: pretrained``), its decoder linears converted to ``recipe``
    (``backends.layer.convert``, random streams from ``seed``) unless it quantizes nothing."""
    tf = transformers_module()
    cfg = check_config(spec, vocab_size=vocab_size, seq_len=seq_len)
    kw: dict[str, Any] = {"attn_implementation": "sdpa", "dtype": torch.float32}
    if device.type == "meta":
        with torch.device("meta"):
            lm = tf.AutoModelForCausalLM.from_config(cfg, **kw)
    elif init == "pretrained":
        path = Path(spec).expanduser()
        source = str(path.parent if path.suffix == ".json" else path) if path.exists() else spec
        try:
            lm = tf.AutoModelForCausalLM.from_pretrained(source, config=cfg, **kw)
        except OSError as e:
            raise ValueError(
                f"model.init: pretrained, but no weights could be loaded from {source!r} "
                f"({str(e).splitlines()[0][:200]}); give a model folder with its weights, or "
                "model.init: random"
            ) from e
        lm = lm.to(device)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            lm = tf.AutoModelForCausalLM.from_config(cfg, **kw)
        lm = lm.to(device)
    lm.config.use_cache = False
    model = HFCausalLM(lm)
    if recipe is not None and not recipe.high_precision:
        convert(model, recipe, backend=backend, seed=seed)
    return model


__all__ = ["HFCausalLM", "build_hf_model", "meta_count"]
