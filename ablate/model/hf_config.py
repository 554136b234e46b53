"""A ``model.hf`` config read and checked before any model is built: what ``ablate validate``, the
study's schema and the memory estimate need of a Hugging Face architecture, in a module that imports
neither torch nor ``transformers`` (which is imported when a config is read, and takes torch where
it is installed): a study of the built-in model loads without either.

``load_config`` reads a ``config.json``, a model folder or a hub name through ``transformers``'
``AutoConfig``; ``check_config`` refuses a family the trainer cannot reproduce, a config past
``SIZE_LIMITS`` or ``MAX_PARAMS``, and a vocabulary or window that does not fit the run;
``check_weights`` looks into a folder's weight files without loading them; ``shape_fields`` and
``config_identity`` give the config's shape and its identity for a run's key. ``ablate.model.hf``
builds the model from the same config."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import zipfile
from pathlib import Path
from typing import Any

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
    _check_shapes(spec, c)
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


POSITIVE = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)
"""The shape fields that must be positive integers (``num_key_value_heads`` and ``head_dim`` may
be left unset: all the heads, and ``hidden_size // num_attention_heads``)."""


def _check_shapes(spec: str, c: Any) -> None:
    """Shapes ``transformers`` accepts but no model can have (a negative width, no heads, more
    key/value heads than heads), and a norm epsilon or RoPE base that turns every loss into NaN:
    a traceback (a division by zero heads) or a failed or diverged cell, refused here instead."""
    for name in POSITIVE:
        v = getattr(c, name, None)
        if v is None and name in ("num_key_value_heads", "head_dim"):
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"model.hf: {spec!r} has {name} {v!r}; allowed: a positive integer")
    heads, kv = c.num_attention_heads, getattr(c, "num_key_value_heads", None)
    if kv is not None and heads % kv:
        raise ValueError(
            f"model.hf: {spec!r} has num_key_value_heads {kv}, which does not divide "
            f"num_attention_heads {heads}; allowed: a divisor of it"
        )
    f = _shapes(c)
    for name, v in (("rms_norm_eps", f["norm_eps"]), ("rope_theta", f["rope_theta"])):
        if not math.isfinite(v) or v <= 0:
            raise ValueError(
                f"model.hf: {spec!r} has {name} {v!r}; allowed: a finite number above 0"
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
