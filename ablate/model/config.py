"""The decoder's shape: ``ModelConfig`` (a preset, explicit fields, or a Hugging Face architecture's
config) and the presets (``PRESETS``). ``resolved()`` gives the fully specified shape the model, the
memory estimate and the FLOP count read; the modules that use it are in ``model`` (built-in) and
``hf`` (Hugging Face architectures)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ablate.key import always, unless_default
from ablate.model.hf_config import INITS, config_identity, shape_fields

_SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len")
# used when ``preset`` is None and the field is not given
_FALLBACKS: dict[str, float] = {"rope_theta": 10_000.0, "norm_eps": 1e-5}


def _identity(hf: str | None, model: ModelConfig, kind: str) -> str | None:
    """An architecture in a cell's key: its config's contents, not its path."""
    return None if hf is None else config_identity(hf)


def _no_hf(model: ModelConfig, kind: str) -> bool:
    return model.hf is None


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Shape of the decoder. Every field but ``preset`` defaults to None: "take it from the preset"."""

    preset: str | None = field(default="tiny", metadata=always())
    """One of ``PRESETS`` (tiny, small, 125m, 1b, llama3_8b), or None to give every shape field."""
    dim: int | None = field(default=None, metadata=always())
    """Model width C (embedding and residual stream)."""
    n_layers: int | None = field(default=None, metadata=always())
    """Number of transformer blocks."""
    n_heads: int | None = field(default=None, metadata=always())
    """Query heads; must divide ``dim``, and head_dim = dim / n_heads must be even (RoPE)."""
    n_kv_heads: int | None = field(default=None, metadata=always())
    """Key/value heads (grouped-query attention); must divide ``n_heads``. None: the preset's, else
    ``n_heads`` (multi-head attention)."""
    head_dim: int | None = field(default=None, metadata=unless_default())
    """Width of each attention head; even (RoPE rotates pairs of channels). None: dim / n_heads
    (which must then divide). Queries are n_heads x head_dim wide, keys and values n_kv_heads x
    head_dim (Qwen3-0.6B: 16 heads of 128 at width 1024)."""
    ffn_dim: int | None = field(default=None, metadata=always())
    """Hidden width of the SwiGLU feed-forward (w1, w3: C -> ffn_dim; w2: ffn_dim -> C)."""
    vocab_size: int | None = field(default=None, metadata=always())
    """Embedding rows. None: the tokenizer's vocabulary at build time (the preset's default only when
    no tokenizer is given, e.g. to count parameters). Must be >= the tokenizer's vocabulary."""
    max_seq_len: int | None = field(default=None, metadata=always())
    """Longest sequence; RoPE tables are precomputed for it."""
    rope_theta: float | None = field(default=None, metadata=always())
    """RoPE base frequency (10000 for Llama 2 style, 500000 for Llama 3)."""
    norm_eps: float | None = field(default=None, metadata=always())
    """RMSNorm epsilon."""
    tie_embeddings: bool | None = field(default=None, metadata=always())
    """Share the LM head's weight with the token embedding. None: the preset's, else False."""
    hf: str | None = field(default=None, metadata=unless_default(resolve=_identity))
    """A Hugging Face architecture instead of a preset: a ``config.json``, a local model folder or a
    hub name (``ablate.model.hf``; needs ``pip install 'ablate[hf]'``). Its config sets every shape."""
    init: str = field(default="random", metadata=always(omit=_no_hf))
    """With ``hf``: ``random`` (transformers' initialization, from the seed) or ``pretrained`` (the
    folder's or hub model's weights, for continued-pretraining ablations)."""

    def __post_init__(self) -> None:
        if self.hf is not None or self.init != "random":
            self._check_hf()
            return
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(
                f"model.preset: unknown preset {self.preset!r}; allowed: {', '.join(PRESETS)}"
            )
        self._merged()._validate(check_required=self.preset is None)

    def _check_hf(self) -> None:
        if not isinstance(self.hf, str) or not self.hf.strip():
            raise ValueError(
                f"model.init: {self.init!r} needs model.hf (a Hugging Face config.json, model "
                "folder or hub name)"
                if self.hf is None
                else f"model.hf: must be a config.json, a model folder or a hub name, got {self.hf!r}"
            )
        if self.init not in INITS:
            raise ValueError(f"model.init: unknown {self.init!r}; allowed: {', '.join(INITS)}")
        for f in fields(self):
            if f.name not in ("preset", "hf", "init") and getattr(self, f.name) is not None:
                raise ValueError(
                    f"model.{f.name}: not allowed with model.hf (the architecture's config sets "
                    "every shape); remove it, or change the config"
                )
        self.preset = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (a run's ``config.json`` and params); ``hf``, ``init`` and
        ``head_dim`` only when set."""
        d = asdict(self)
        if self.hf is None:
            del d["hf"], d["init"]
        if self.head_dim is None:  # dim / n_heads
            del d["head_dim"]
        return d

    def _merged(self) -> ModelConfig:
        """Explicit fields over the preset's, without validation or vocabulary resolution."""
        base = PRESETS[self.preset] if self.preset is not None else None
        values = {}
        for f in fields(self):
            mine = getattr(self, f.name)
            values[f.name] = mine if mine is not None or base is None else getattr(base, f.name)
        values["preset"] = None
        out = object.__new__(ModelConfig)  # skips __post_init__: a partial config is allowed here
        for k, v in values.items():
            object.__setattr__(out, k, v)
        return out

    def _validate(self, *, check_required: bool) -> None:
        """Check the fields present (all shape fields when ``check_required``)."""
        if check_required:
            missing = [n for n in _SHAPE_FIELDS if getattr(self, n) is None]
            if missing:
                raise ValueError(
                    f"model.{missing[0]}: required when model.preset is null (missing: "
                    f"{', '.join(missing)}); set it or pick a preset ({', '.join(PRESETS)})"
                )
        for name in (*_SHAPE_FIELDS, "n_kv_heads", "head_dim", "vocab_size"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"model.{name}: must be a positive integer, got {v!r}")
        for name in ("rope_theta", "norm_eps"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"model.{name}: must be > 0, got {v!r}")
        dim, n_heads, n_kv = self.dim, self.n_heads, self.n_kv_heads
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError(
                f"model.head_dim: {self.head_dim} must be even (RoPE rotates pairs of channels)"
            )
        if dim is not None and n_heads is not None and self.head_dim is None:
            if dim % n_heads:
                divisors = [h for h in range(1, dim + 1) if dim % h == 0 and (dim // h) % 2 == 0]
                raise ValueError(
                    f"model.n_heads: {n_heads} does not divide model.dim {dim}; allowed for this "
                    f"dim: {', '.join(map(str, divisors[:12]))}{' ...' if len(divisors) > 12 else ''}"
                )
            if (dim // n_heads) % 2:
                raise ValueError(
                    f"model.n_heads: head_dim = model.dim / model.n_heads = {dim // n_heads} must "
                    "be even (RoPE rotates pairs of channels); change model.dim or model.n_heads"
                )
        if n_heads is not None and n_kv is not None and n_heads % n_kv:
            allowed = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
            raise ValueError(
                f"model.n_kv_heads: {n_kv} does not divide model.n_heads {n_heads}; allowed: "
                f"{', '.join(map(str, allowed))}"
            )

    def resolved(self, vocab_size: int | None = None) -> ModelConfig:
        """A fully specified copy (``preset=None``, every field set) for a tokenizer of
        ``vocab_size`` tokens. Precedence: explicit field > tokenizer > preset default. With ``hf``:
        the architecture's shapes as a preset-like config (``hf_config.shape_fields``; ``hf`` not kept)."""
        if self.hf is not None:
            return ModelConfig(preset=None, **shape_fields(self.hf)).resolved(vocab_size)
        m = self._merged()
        explicit_vocab = self.vocab_size
        if explicit_vocab is not None:
            if vocab_size is not None and explicit_vocab < vocab_size:
                raise ValueError(
                    f"model.vocab_size: {explicit_vocab} is smaller than the tokenizer's "
                    f"vocabulary ({vocab_size}); set it >= {vocab_size} or leave it null"
                )
            vocab = explicit_vocab
        elif vocab_size is not None:
            if vocab_size <= 0:
                raise ValueError(f"vocab_size: must be a positive integer, got {vocab_size}")
            vocab = vocab_size
        elif m.vocab_size is not None:
            vocab = m.vocab_size
        else:
            raise ValueError(
                "model.vocab_size: not set and no tokenizer vocabulary given; "
                "pass vocab_size or set model.vocab_size"
            )
        return replace(
            m,
            vocab_size=vocab,
            n_kv_heads=m.n_kv_heads if m.n_kv_heads is not None else m.n_heads,
            head_dim=m.head_dim or resolved_int(m.dim) // resolved_int(m.n_heads),
            rope_theta=float(
                m.rope_theta if m.rope_theta is not None else _FALLBACKS["rope_theta"]
            ),
            norm_eps=float(m.norm_eps if m.norm_eps is not None else _FALLBACKS["norm_eps"]),
            tie_embeddings=bool(m.tie_embeddings),
        )


def _preset(**kw: int | float | bool) -> ModelConfig:
    cfg = object.__new__(ModelConfig)  # PRESETS is not defined yet: skip __post_init__
    for f in fields(ModelConfig):
        object.__setattr__(cfg, f.name, kw.get(f.name))
    cfg._validate(check_required=True)
    return cfg


# fmt: off
PRESETS: dict[str, ModelConfig] = {
    # trains on a 2-core CPU in seconds; byte vocabulary by default
    "tiny": _preset(
        dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=384, vocab_size=256,
        max_seq_len=256, rope_theta=10_000.0, norm_eps=1e-5, tie_embeddings=True,
    ),
    # ~9.4M non-embedding parameters: a laptop CPU or one small GPU
    "small": _preset(
        dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024, vocab_size=256,
        max_seq_len=512, rope_theta=10_000.0, norm_eps=1e-5, tie_embeddings=True,
    ),
    # GPT-3 125M width/depth with Llama blocks (SwiGLU 8/3 C, untied head), 32k vocabulary default
    "125m": _preset(
        dim=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048, vocab_size=32_000,
        max_seq_len=2048, rope_theta=10_000.0, norm_eps=1e-5, tie_embeddings=False,
    ),
    # the Llama 3.2-1B shape (without its long-context RoPE scaling)
    "1b": _preset(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128_256,
        max_seq_len=8192, rope_theta=500_000.0, norm_eps=1e-5, tie_embeddings=True,
    ),
    # the Llama 3.1-8B shape: 8,030,261,248 parameters with its 128,256-token vocabulary
    "llama3_8b": _preset(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14_336, vocab_size=128_256,
        max_seq_len=8192, rope_theta=500_000.0, norm_eps=1e-5, tie_embeddings=False,
    ),
}
# fmt: on


def resolved_int(v: int | float | bool | None) -> int:
    """A field of a resolved config (narrows ``int | None`` for the type checker)."""
    if v is None:
        raise ValueError("ModelConfig is not resolved; call cfg.resolved(vocab_size) first")
    return int(v)


def head_widths(c: ModelConfig) -> tuple[int, int]:
    """(Q, KV) of a resolved config: the widths of the queries (n_heads x head_dim; C unless
    ``model.head_dim`` says otherwise) and of the keys and values (n_kv_heads x head_dim each)."""
    hd = resolved_int(c.head_dim)
    return resolved_int(c.n_heads) * hd, resolved_int(c.n_kv_heads) * hd


def block_linear_params(c: ModelConfig) -> int:
    """Weights of one block's linears (wq, wo, wk, wv, w1, w2, w3) of a resolved config."""
    dim, ffn, (q, kv) = resolved_int(c.dim), resolved_int(c.ffn_dim), head_widths(c)
    return 2 * dim * q + 2 * dim * kv + 3 * dim * ffn


def resolved_float(v: float | None) -> float:
    if v is None:
        raise ValueError("ModelConfig is not resolved; call cfg.resolved(vocab_size) first")
    return float(v)
