"""The Llama-style decoder the trainer runs: model, builder and counting helpers (its shape and
presets: ``model_config``).

Shapes follow the Llama 3 architecture as torchtitan writes it (``models/llama3/model.py``):

    tokens (B, T) -> tok_embeddings -> (B, T, C)
      -> n_layers x Block:  h = x + attention(attention_norm(x))      grouped-query attention, RoPE
                            out = h + feed_forward(ffn_norm(h))        SwiGLU: w2(silu(w1 x) * w3 x)
      -> norm -> lm_head -> logits (B, T, V)

Every linear inside a block is a bias-free ``nn.Linear`` at ``layers.{i}.attention.wq/wk/wv/wo`` and
``layers.{i}.feed_forward.w1/w2/w3``, so ``backends.convert_model`` finds them by path (and knows the
block index from ``i``). The token embedding is not a linear and the LM head is excluded by its name
``lm_head``: both stay in high precision, as every published FP4 recipe keeps them.

Weights are created on the meta device and then materialized and initialized on the target device
from a ``torch.Generator`` seeded by the caller (``build_model(..., seed=...)``): the same seed on the
same device type gives bit-identical weights, and nothing depends on the global RNG state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.config import (
    PRESETS,
    ModelConfig,
    block_linear_params,
    head_widths,
    resolved_float,
    resolved_int,
)
from ablate.model.hf import HFCausalLM, build_hf_model, meta_count
from ablate.model.recompute import CheckpointedBlock
from backends import Recipe, convert_model

# ---------------------------------------------------------------------------------------------------
# modules


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (as Llama does) and cast back to x's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_seq_len, head_dim // 2): angle t * theta^(-2i / head_dim)."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (hd/2,)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (T, hd/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of x (B, T, H, hd) by the angles of cos/sin (T, hd/2).

    The interleaved-pair convention of Meta's Llama (``torch.view_as_complex`` in torchtitan),
    written with real tensors so it runs on every device and dtype, meta included.
    """
    xf = x.float().unflatten(-1, (-1, 2))  # (B, T, H, hd/2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]  # (B, T, H, hd/2)
    c, s = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, hd/2)
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)  # (B, T, H, hd/2, 2)
    return out.flatten(-2).to(x.dtype)  # (B, T, H, hd)


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE on queries and keys."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim, self.n_heads, self.n_kv_heads = (
            resolved_int(cfg.dim),
            resolved_int(cfg.n_heads),
            resolved_int(cfg.n_kv_heads),
        )
        self.head_dim = resolved_int(cfg.head_dim)
        self.wq = nn.Linear(dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, C)
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)  # (B, T, H, hd)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim)  # (B, T, KV, hd)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)  # (B, T, KV, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd), k, v (B, KV, T, hd)
        # each key/value head serves H / KV query heads inside the kernel: no (B, H, T, hd) copy
        # of K and V is made (and kept for the backward), as repeating them would
        gqa = self.n_kv_heads != self.n_heads
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, C)
        out: torch.Tensor = self.wo(y)
        return out


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, F) -> (B, T, C)
        return out


class Block(CheckpointedBlock):
    """Pre-norm transformer block: x + attention(norm(x)), then h + feed_forward(norm(h))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim, eps = resolved_int(cfg.dim), resolved_float(cfg.norm_eps)
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(dim, resolved_int(cfg.ffn_dim))
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)  # (B, T, C)
        return h + self.feed_forward(self.ffn_norm(h))  # (B, T, C)


class Transformer(nn.Module):
    """The decoder. Build it with ``build_model``; a ``cfg`` that is not resolved is resolved here
    with the preset's default vocabulary (``cfg.resolved()``). Constructed directly it keeps
    PyTorch's default init: call ``init_weights(generator)`` for the documented one."""

    rope_cos: torch.Tensor  # (max_seq_len, head_dim / 2) float32, not saved (recomputed)
    rope_sin: torch.Tensor  # (max_seq_len, head_dim / 2) float32, not saved (recomputed)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg = self.cfg = cfg.resolved()  # a no-op copy when already resolved
        dim, vocab = resolved_int(cfg.dim), resolved_int(cfg.vocab_size)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(resolved_int(cfg.n_layers)))
        self.norm = RMSNorm(dim, resolved_float(cfg.norm_eps))
        # high precision by its name: convert_model excludes "lm_head" (logits feed the softmax)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.tie_weights()
        cos, sin = self._rope()
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when ``tie_embeddings`` (again after ``to_empty``,
        which materializes each module's parameters separately)."""
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight

    def _rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        return rope_tables(
            resolved_int(c.head_dim), resolved_int(c.max_seq_len), resolved_float(c.rope_theta)
        )

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Initialize every parameter (and recompute the RoPE tables) in a fixed order.

        Linears and the embedding: normal(0, 0.02); the output projections of each residual branch
        (``wo``, ``w2``) additionally scaled by 1/sqrt(2 * n_layers) so the residual stream's variance
        does not grow with depth (GPT-2); RMSNorm weights: ones. Draws come from ``generator`` (on the
        parameters' device), or from the global RNG when None.
        """
        std, n_layers = 0.02, resolved_int(self.cfg.n_layers)
        out_std = std / math.sqrt(2 * n_layers)
        nn.init.normal_(self.tok_embeddings.weight, 0.0, std, generator=generator)
        for layer in self.layers:
            assert isinstance(layer, Block)
            a, f = layer.attention, layer.feed_forward
            for lin, s in ((a.wq, std), (a.wk, std), (a.wv, std), (a.wo, out_std)):
                nn.init.normal_(lin.weight, 0.0, s, generator=generator)
            for lin, s in ((f.w1, std), (f.w3, std), (f.w2, out_std)):
                nn.init.normal_(lin.weight, 0.0, s, generator=generator)
            layer.attention_norm.reset_parameters()
            layer.ffn_norm.reset_parameters()
        self.norm.reset_parameters()
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, 0.0, std, generator=generator)
        cos, sin = self._rope()
        self.rope_cos = cos.to(self.rope_cos.device)
        self.rope_sin = sin.to(self.rope_sin.device)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for ``tokens`` (B, T) int64; with ``targets`` (B, T), the mean
        cross-entropy in float32 instead (targets equal to -100 are ignored)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected shape (batch, seq_len), got {tuple(tokens.shape)}")
        t = tokens.shape[1]
        max_len = resolved_int(self.cfg.max_seq_len)
        if t > max_len:
            raise ValueError(
                f"seq_len: {t} exceeds model.max_seq_len {max_len}; shorten the sequences "
                "(data.seq_len) or raise model.max_seq_len"
            )
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]  # (T, hd/2)
        h = self.tok_embeddings(tokens)  # (B, T, C)
        for layer in self.layers:
            h = layer(h, cos, sin)  # (B, T, C)
        return self.output(h, targets)

    def output(self, h: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The head: final norm, LM head, and with ``targets`` the loss (a method of its own so
        that ``ablate.train.compiling`` compiles it as one graph)."""
        logits: torch.Tensor = self.lm_head(self.norm(h))  # (B, T, V)
        if targets is None:
            return logits
        # float32 softmax: bf16 logits lose the small differences the loss is made of
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


# ---------------------------------------------------------------------------------------------------
# building and counting


def build_model(
    cfg: ModelConfig,
    vocab_size: int,
    recipe: Recipe | None = None,
    backend: str = "emulated",
    seed: int = 0,
    device: str | torch.device = "cpu",
    seq_len: int | None = None,
) -> Transformer | HFCausalLM:
    """The model for ``cfg`` and a tokenizer of ``vocab_size`` tokens, on ``device``.

    Created on the meta device, then (unless ``device`` is meta) materialized on ``device`` and
    initialized from ``torch.Generator(device).manual_seed(seed)``: same seed, same device type ->
    identical weights. With a ``recipe`` that quantizes anything, every block linear becomes a
    ``backends.QuantLinear`` (``convert_model`` with the same ``seed`` for its random streams); the
    embedding and ``lm_head`` stay high precision. A meta model has shapes only (for counting).
    ``seq_len``: checked against a ``model.hf`` architecture's positions (a preset's in RunConfig).
    """
    dev = torch.device(device)
    if cfg.hf is not None:  # built by transformers, converted by backends.layer.convert
        return build_hf_model(
            cfg.hf, cfg.init, vocab_size=vocab_size, recipe=recipe, backend=backend, seed=seed,
            device=dev, seq_len=seq_len,
        )  # fmt: skip
    with torch.device("meta"):
        model = Transformer(cfg.resolved(vocab_size))
    if dev.type != "meta":
        model = model.to_empty(device=dev)
        model.tie_weights()
        gen = torch.Generator(device=dev).manual_seed(seed)
        model.init_weights(gen)
    if recipe is not None and not recipe.high_precision:
        convert_model(model, recipe, backend=backend, seed=seed)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, each shared tensor (tied embedding and LM head) counted once."""
    return sum(p.numel() for p in model.parameters())  # parameters() yields shared ones once


EMBEDDING_MODULES = ("tok_embeddings", "embed_tokens", "lm_head")
"""The modules that the non-embedding count N leaves out, by their names: the token embedding and
the LM head, as the built-in decoder and ``transformers``' causal LMs name them."""


def count_non_embedding(model: nn.Module) -> int:
    """N of a built model: its parameters outside the modules named in ``EMBEDDING_MODULES``, each
    shared tensor once; for the decoders the trainer builds, the blocks and the final norm."""
    left_out = {
        id(p)
        for name, module in model.named_modules()
        if name.rpartition(".")[2] in EMBEDDING_MODULES
        for p in module.parameters()
    }
    return sum(p.numel() for p in model.parameters() if id(p) not in left_out)


def non_embedding_params(cfg: ModelConfig) -> int:
    """N, the non-embedding parameter count of scaling laws (Kaplan et al. 2020): the decoder
    blocks' parameters (the linears and two RMSNorm weights each) and the final norm's, neither
    the token embedding nor the LM head, so no vocabulary enters it. A built-in shape by formula;
    a ``model.hf`` architecture built on the meta device and counted by module names
    (``count_non_embedding``: its q/k norms, where it has them, count; ``hf.meta_count`` builds
    two of its layers, not all)."""
    if cfg.hf is not None:
        return meta_count(cfg.hf, count_non_embedding, vocab_size=None)
    c = cfg.resolved(1)  # any vocabulary: N has none (an explicit model.vocab_size is kept)
    dim = resolved_int(c.dim)
    return resolved_int(c.n_layers) * (block_linear_params(c) + 2 * dim) + dim


def num_params(cfg: ModelConfig, vocab_size: int | None = None) -> int:
    """Parameters of ``cfg`` (tokenizer vocabulary ``vocab_size``, else the config's or preset's),
    counted on the meta device: nothing is allocated, so the 8B shape counts in milliseconds (a
    ``model.hf`` architecture: two of its layers built, ``hf.meta_count``)."""
    if cfg.hf is not None:
        return meta_count(cfg.hf, count_parameters, vocab_size=vocab_size)
    with torch.device("meta"):
        return count_parameters(Transformer(cfg.resolved(vocab_size)))


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward): 6 N + 12 L C T (PaLM, appendix B).

    N counts the matmul weights: the block linears and the LM head (the embedding is a lookup, not
    a matmul; a tied head still costs its matmul). 12 L C T is the attention score and value
    matmuls (C: the queries' width) for a context of T = ``seq_len`` (default ``max_seq_len``),
    counted over the full T x T square as is conventional (a causal kernel does about half). ``cfg`` with ``vocab_size`` unset
    uses the preset default; pass ``cfg.resolved(tokenizer_vocab)`` for the exact figure.
    """
    c = cfg.resolved()
    dim, n_layers, (q_dim, _) = resolved_int(c.dim), resolved_int(c.n_layers), head_widths(c)
    n = n_layers * block_linear_params(c) + resolved_int(c.vocab_size) * dim
    t = seq_len if seq_len is not None else resolved_int(c.max_seq_len)
    return float(6 * n + 12 * n_layers * q_dim * t)


__all__ = [
    "PRESETS",
    "Attention",
    "Block",
    "FeedForward",
    "ModelConfig",
    "RMSNorm",
    "Transformer",
    "build_model",
    "count_parameters",
    "flops_per_token",
    "num_params",
]
