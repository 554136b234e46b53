"""Hugging Face architectures in the trainer: ``model: {hf: <config.json | model folder | hub name>}``.

The model is built by ``transformers`` (``AutoModelForCausalLM.from_config``, or ``from_pretrained``
with ``model.init: pretrained``) in float32, and every linear of its decoder layers becomes a
``backends.QuantLinear`` under the cell's recipe (``backends.layer.convert``: the architecture's table says
which linears are attention and which MLP, the block is the layer's index). ``HFCausalLM`` gives it
the shape the rest of the trainer relies on, the one of ``model.Transformer``:

- ``forward(tokens, targets=None)``: the embedding, the architecture's rotary embedding, each decoder
  layer, then ``output`` (final norm, LM head, float32 cross-entropy), as the family's own
  ``forward`` does (``TRAINABLE`` lists the families whose forward is exactly that; the suite checks
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
import functools
import hashlib
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.recompute import CheckpointedBlock
from backends import Recipe
from backends.layer import convert

TRAINABLE = ("llama", "mistral", "olmo2", "qwen2", "qwen3")
"""Families whose model forward is embedding -> decoder layers -> norm -> LM head, nothing else (no
embedding scale, no logit soft-capping): ``HFCausalLM`` reproduces them exactly."""
INITS = ("random", "pretrained")
SIZE_LIMITS = {
    "num_hidden_layers": 1024,
    "hidden_size": 65_536,
    "intermediate_size": 262_144,
    "vocab_size": 1 << 21,
}
"""The largest value of each shape field a ``model.hf`` config may hold: 16x to 32x the presets'
largest, the Llama 3.1-8B shape of ``llama3_8b`` and the 8B ladder (32 layers, width 4,096, FFN
14,336, vocabulary 128,256), and still 4x to 8x Llama 3.1-405B's (126 layers, width 16,384, FFN
53,248). Past them a config is a mistake or hostile: refused from its numbers before any model is
built (building even on the meta device takes about a millisecond per layer)."""
MAX_PARAMS = 10**13
"""The most parameters a ``model.hf`` config may have by its shapes (counted as a Llama-style
decoder: ``_shape_params``): 1,250x the 8B preset, 25x Llama 3.1-405B."""


def transformers_module() -> Any:
    """``transformers``, or an error that says how to install it."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "model.hf: needs the transformers package; pip install 'ablate[hf]'"
        ) from e
    return transformers


@functools.lru_cache(maxsize=32)
def _read_config(spec: str) -> Any:
    tf = transformers_module()
    path = Path(spec).expanduser()
    if path.suffix == ".json" and not path.is_file():
        raise ValueError(f"model.hf: {spec!r} does not exist")
    source = str(path) if path.exists() else spec
    if not path.exists():  # a hub name: the cache first; the network only when it answers
        from ablate.data.tokenizer import hub_unreachable

        try:
            return tf.AutoConfig.from_pretrained(source, local_files_only=True)
        except Exception:  # noqa: BLE001 (not cached)
            if (why := hub_unreachable()) is not None:
                raise ValueError(
                    f"model.hf: {spec!r} is not in the Hugging Face cache and the hub cannot be "
                    f"reached ({why}); give a config.json or a local model folder"
                ) from None
    try:
        return tf.AutoConfig.from_pretrained(source)
    except Exception as e:  # noqa: BLE001 (transformers' and its validators' errors, any class)
        raise ValueError(
            f"model.hf: no architecture config could be read from {spec!r} ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}); give a config.json, a local model folder or a "
            "hub name (with network access, or already in the Hugging Face cache)"
        ) from e


def config_identity(spec: str) -> str:
    """What a cell's key holds of ``model.hf``: the sha256 of the architecture's ``config.json``
    (its JSON, keys sorted: neither the path nor the formatting count) for a local file or folder;
    a hub name as written (with the network it may change under the same name)."""
    path = Path(spec).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        return spec
    canonical = json.dumps(json.loads(file.read_text()), sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def load_config(spec: str) -> Any:
    """The ``transformers`` config ``spec`` names (a copy: callers may change it), of a family the
    trainer runs; errors name ``model.hf``."""
    cfg = copy.deepcopy(_read_config(spec))
    if cfg.model_type not in TRAINABLE:
        raise ValueError(
            f"model.hf: architecture {cfg.model_type!r} of {spec!r} is not one the trainer runs; "
            f"allowed: {', '.join(TRAINABLE)}"
        )
    return cfg


def shape_fields(spec: str) -> dict[str, Any]:
    """The architecture's shapes as ``ModelConfig`` fields (the memory estimate's and FLOP
    count's view of it: a Llama-style decoder of those shapes; q/k norms are not counted)."""
    return _shapes(load_config(spec))


def _shapes(c: Any) -> dict[str, Any]:
    """``shape_fields`` of a loaded ``transformers`` config."""
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta") or getattr(
        c, "rope_theta", 10_000.0
    )
    return {
        "dim": c.hidden_size,
        "n_layers": c.num_hidden_layers,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "ffn_dim": c.intermediate_size,
        "vocab_size": c.vocab_size,
        "max_seq_len": c.max_position_embeddings,
        "rope_theta": float(theta or 10_000.0),
        "norm_eps": float(getattr(c, "rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(getattr(c, "tie_word_embeddings", False)),
    }


def _shape_params(f: dict[str, Any]) -> int:
    """Parameters of a Llama-style decoder of ``_shapes`` ``f`` (q/k norms and biases left out)."""
    dim, hd, heads, kv = f["dim"], f["head_dim"], f["n_heads"], f["n_kv_heads"]
    layer = dim * hd * (2 * heads + 2 * kv) + 3 * dim * f["ffn_dim"] + 2 * dim
    embed = f["vocab_size"] * dim * (1 if f["tie_embeddings"] else 2)
    return int(f["n_layers"] * layer + embed + dim)


def qk_norm_bytes(spec: str, precision: str) -> int:
    """Bytes per token and decoder layer that the architecture's q/k norms save for the backward,
    beyond a Llama-style layer (``memory.activation_parts``; measured in the suite): Qwen3 normalizes
    each head of q and k (fp32 input and rsqrt, and the normalized q/k in fp32, or under autocast
    in bf16), OLMo 2 all of q and all of k (fp32 input, normalized and rsqrt); 0 for the others."""
    c = load_config(spec)
    f = _shapes(c)
    heads, kv_heads, hd = f["n_heads"], f["n_kv_heads"], f["head_dim"]
    if c.model_type == "qwen3":
        normed = 4 if precision == "fp32" else 2
        return sum((4 + normed) * n * hd + 4 * n for n in (heads, kv_heads))
    if c.model_type == "olmo2":
        return sum(4 * (2 * n * hd + 1) for n in (heads, kv_heads))
    return 0


def check_config(spec: str, *, vocab_size: int | None, seq_len: int | None) -> Any:
    """``load_config(spec)``, refused where it cannot train (no decoder layer, an activation or a
    RoPE type ``transformers`` does not have) or cannot train these data: a vocabulary smaller than
    the tokenizer's, sequences longer than its positions or than a sliding attention window."""
    c = load_config(spec)
    _check_parts(spec, c)
    if vocab_size is not None and c.vocab_size < vocab_size:
        raise ValueError(
            f"model.hf: the architecture's vocab_size {c.vocab_size} is smaller than the "
            f"tokenizer's vocabulary ({vocab_size}); use a config with vocab_size >= {vocab_size} "
            "or the tokenizer it was made for (data.tokenizer)"
        )
    if seq_len is not None:
        if seq_len > c.max_position_embeddings:
            raise ValueError(
                f"train.seq_len: {seq_len} is longer than model.hf's max_position_embeddings "
                f"({c.max_position_embeddings}); shorten it"
            )
        window = getattr(c, "sliding_window", None)
        types = getattr(c, "layer_types", None) or []
        slides = "sliding_attention" in types or (c.model_type == "mistral" and window)
        if slides and window and seq_len > window:
            raise ValueError(
                f"train.seq_len: {seq_len} is longer than model.hf's sliding attention window "
                f"({window}); the trainer runs full causal attention, equal to the window's only "
                f"up to {window} tokens: set train.seq_len <= {window}"
            )
    return c


def _check_parts(spec: str, c: Any) -> None:
    """What ``transformers`` accepts in a config but cannot build or train with."""
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    layers = getattr(c, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(
            f"model.hf: {spec!r} has num_hidden_layers {layers!r}: the recipe would quantize no "
            "decoder layer; give a config with at least one"
        )
    _check_size(spec, c)
    act = getattr(c, "hidden_act", None)
    if act is not None and act not in ACT2FN:
        raise ValueError(
            f"model.hf: {spec!r} has hidden_act {act!r}, which transformers does not have; "
            f"allowed: {', '.join(sorted(ACT2FN))}"
        )
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
    allowed = {"default", *ROPE_INIT_FUNCTIONS}
    if kind not in allowed:
        raise ValueError(
            f"model.hf: {spec!r} has rope_type {kind!r}, which transformers does not have; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _check_size(spec: str, c: Any) -> None:
    """An absurd size (``SIZE_LIMITS``, ``MAX_PARAMS``), refused from the config's numbers."""
    for name, limit in SIZE_LIMITS.items():
        v = getattr(c, name, None)
        if isinstance(v, int) and v > limit:
            raise ValueError(
                f"model.hf: {spec!r} has {name} {v}; allowed: at most {limit:,} (16x to 32x the "
                "llama3_8b preset's shapes: no model the trainer is meant for comes near it)"
            )
    try:
        n = _shape_params(_shapes(c))
    except (AttributeError, TypeError, ZeroDivisionError):  # a field left unset: its own checks
        return
    if n > MAX_PARAMS:
        raise ValueError(
            f"model.hf: {spec!r} has about {n:.3g} parameters by its shapes (hidden_size "
            f"{c.hidden_size}, num_hidden_layers {c.num_hidden_layers}, intermediate_size "
            f"{c.intermediate_size}, num_attention_heads {c.num_attention_heads}); allowed: at "
            f"most {MAX_PARAMS:.0e} (1,250x the llama3_8b preset)"
        )


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_weights(spec: str) -> None:
    """``model.init: pretrained`` of a local ``spec``: its folder holds weights ``transformers``
    can read (a safetensors file or index whose shards exist, each with a readable header, or a
    ``pytorch_model.bin`` archive). A hub name is checked when its weights are fetched."""
    path = Path(spec).expanduser()
    if not path.exists():
        return
    folder = path.parent if path.is_file() else path
    found = [folder / n for n in WEIGHT_FILES if (folder / n).is_file()]
    if not found:
        raise ValueError(
            f"model.init: pretrained, but {folder} holds no weights ({', '.join(WEIGHT_FILES)}); "
            "give a model folder with its weights, or model.init: random"
        )
    for f in found:
        try:
            if f.name.endswith(".index.json"):
                shards = sorted(set(json.loads(f.read_text())["weight_map"].values()))
                files = [folder / str(n) for n in shards]
            else:
                files = [f]
            for w in files:
                if w.suffix == ".safetensors":
                    from safetensors import safe_open

                    with safe_open(str(w), framework="pt") as st:
                        st.keys()
                elif not zipfile.is_zipfile(w):
                    raise ValueError("not a torch archive")
        except Exception as e:  # noqa: BLE001 (a damaged file: any of the readers' errors)
            raise ValueError(
                f"model.init: pretrained, but the weights in {folder} cannot be read ({f.name}: "
                f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); give a "
                "model folder with its weights, or model.init: random"
            ) from None


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


__all__ = [
    "INITS",
    "TRAINABLE",
    "HFCausalLM",
    "build_hf_model",
    "check_config",
    "config_identity",
    "load_config",
    "meta_count",
    "qk_norm_bytes",
    "shape_fields",
    "transformers_module",
]
