"""How much device memory one training cell needs: an analytic estimate, nothing is allocated.

What `ablate plan` prints per configuration, and what it warns about when the total exceeds the
device's memory. Everything is computed from shapes (the 8B preset estimates in microseconds).

Assumptions, each matching how ``loop.py`` and ``model.py`` train today:

- **Parameters** are float32 (the trainer keeps fp32 master weights and autocasts the GEMMs), counted
  analytically from the resolved ``ModelConfig`` (``param_count``; equal to ``count_parameters`` of
  the built model: the embedding, per block wq/wk/wv/wo, w1/w2/w3 and two RMSNorm weights, the
  final norm, and an LM head unless tied to the embedding).
- **Gradients** are float32, one per parameter (``zero_grad(set_to_none=True)`` frees them between
  steps, but they are all alive at the optimizer step, which is the peak that matters).
- **Optimizer state** is AdamW's ``exp_avg`` and ``exp_avg_sq``: 2 x fp32 per parameter.
- **Activations** are what autograd saves in one forward of one micro-batch
  (``batch_size / workers / grad_accum`` sequences of ``seq_len`` tokens) (with activation
  checkpointing, see below);
  micro-batches are run one after the other, so only one micro-batch's are alive at once. Per block
  and token (C = dim, F = ffn_dim, H = n_heads), in fp32 runs:
  each RMSNorm saves its input x, the normalized x (before the weight) and 1/rms; the linears save
  their input (the norm's output, once for wq/wk/wv, once for w1/w3; wo's input, the attention
  output, which is a view of attention's output); RoPE saves nothing large (its products need only
  the constant cos/sin tables, which do not require grad); attention is
  ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels: no T x T scores are
  materialized; grouped-query attention inside the kernel, ``enable_gqa``) and saves the rotated q
  (Q = n_heads x head_dim: C unless ``model.head_dim`` says otherwise), k and v (KV = n_kv_heads
  x head_dim each: not repeated per query head), its output (Q) and
  the fp32 log-sum-exp (H); SwiGLU saves w1's output, silu's output, w3's output and their product
  (4 F). Under bf16 autocast the residual stream and the norms stay fp32 while
  the GEMM operands are bf16, and autocast casts the norm's output once per linear (3 copies for
  wq/wk/wv, 2 for w1/w3). Per block and token that is 4 (8 C + 2 KV + 4 F + H + 2) bytes in fp32
  and 4 (4 C + H + 2) + 2 (7 C + 2 KV + 4 F) in bf16. After the blocks: the final norm (as above) and the loss: the fp32 log-probabilities (B, T, V) that ``log_softmax``
  saves, plus one more (B, T, V) fp32 tensor alive around the loss (the logits in the forward,
  their gradient in the backward). The token ids (int64) are saved by the embedding.
- **Evaluation** runs in forwards of training's micro-batch (``loop.evaluate``) without autograd,
  between optimizer steps, when the gradients of the last step are still allocated: it holds no
  saved activations, only one forward's transients (``evaluation_bytes``): one block's worth of
  activations, and at the head the logits (B, T, V) in the autocast precision, their fp32 copy
  and the fp32 log-probabilities. The estimate counts the larger of training's activations and
  evaluation's (``MemoryEstimate.peak_activations``); at a large vocabulary evaluation's head is
  the larger.
- **Autocast weight copies** (bf16 only): the bf16 copy of every linear's weight (the block linears
  and the LM head) that autocast, or ``QuantLinear.forward``, makes and autograd keeps until the
  backward: 2 bytes per linear parameter.
- **Quantized-layer extras**: a ``backends.QuantLinear`` saves x and W in the autocast precision
  (``save_for_backward(x2, weight, ...)``), the same tensors ``nn.Linear`` saves, so they are in
  the activations and weight copies above; a layer whose fprop and dgrad share a 2-D-block weight
  quantization (``shares_weight_quantization``) also keeps the quantized W (uint8 codes, one per
  element, plus one uint8 scale per block): counted as 1 + 1/16 bytes per weight element.
  The emulated backend's transient quantization buffers are not modelled; they are in the allowance.
- **Activation checkpointing** (``train.activation_checkpointing: blocks``,
  ``ablate.model.recompute``): a block keeps only its input, the fp32 residual stream (4 C bytes
  per token), and saves neither its bf16 weight copies nor a 2-D-block recipe's quantized weights
  (both are made again in the recompute); in the backward one block's activations and weight
  copies are rebuilt at a time, and are counted once. The head (final norm, log-probabilities) is
  not checkpointed.
- **Allowance**: +10% of the sum above, for the caching allocator's fragmentation, cuBLAS and
  attention workspaces and the CUDA context's share of the memory (``ALLOWANCE``).

Parallel modes (``train.parallel`` resolved, ``train.workers`` = W; ``ablate.train.parallel``
shares the model) change what one device holds. Every worker trains its own micro-batch of
``batch_size / W / grad_accum`` sequences, so the activations are per worker in every mode.

- **none** (one process): as above.
- **ddp**: each worker holds a full replica (parameters, gradients, AdamW state and the weight
  copies, unsharded), plus **DDP's gradient buckets**: the reducer allocates, when it is built, a
  flat fp32 copy of every gradient to all-reduce in (``gradient_as_bucket_view=False``, torch's
  default and what ``ablate.train.parallel`` passes): 4 bytes per parameter, one more gradient set.
- **fsdp** (FSDP2 ``fully_shard`` per block and on the root, fp32 ``param_dtype`` and
  ``reduce_dtype``): parameters, gradients and AdamW state are sharded, 1/W of each per device.
  The **weight copies are not**: autocast casts each all-gathered fp32 weight to bf16 and autograd
  keeps that copy until the layer's backward, so at the end of the forward every device holds a
  bf16 copy of the whole model's linears (likewise a 2-D-block recipe's quantized weights).
  FSDP's **unsharded working set** is added, all fp32 (``fsdp_unsharded``):
  the root's parameters (embedding, final norm, LM head), all-gathered for the whole forward and
  backward (FSDP2 does not reshard the root after the forward); two blocks' parameters (the block
  being computed and the next one, prefetched); and the unsharded gradients: the root's (the LM
  head's is computed first in the backward and reduced with the embedding's at its end) and two
  blocks' (the one being computed and the one being reduce-scattered). FSDP reduce-scatters every
  micro-batch (``parallel.Ranks.accumulating``: only DDP skips the reduction before a step's last
  micro-batch), so gradients accumulate sharded and ``grad_accum`` adds nothing here; skipping it
  would keep the whole model's fp32 gradients unsharded on every device (30 GiB at 8B).
- **fsdp with the bf16 all-gather** (``train.fsdp_all_gather: bf16``; each block linear a unit of
  its own with ``param_dtype=bfloat16``): the gathered bf16 weight is what the GEMM reads and
  saves, and FSDP2 frees its storage after the linear's forward (gathering it again for the
  backward), so the block linears keep **no weight copies**; the LM head's, made by autocast from
  the fp32 root, stays. In the unsharded working set the block linears' parameters count 2 bytes,
  and their unsharded gradients 2 + 4 (FSDP2 casts the bf16 gradient to fp32 for the
  reduce-scatter); the root and the norms stay fp32.

The parts are added as if all were alive at once (gradients and activations overlap only from
the second micro-batch of a step, the unsharded working set peaks in the backward while the
activations shrink), so with ``grad_accum`` = 1 the figure errs high. The estimate is per device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ablate.model import ModelConfig, num_params
from ablate.model.config import block_linear_params, head_widths, resolved_int
from ablate.model.hf_config import qk_norm_bytes

if TYPE_CHECKING:
    from ablate.train.config import RunConfig
    from backends import Recipe

ALLOWANCE = 0.10
"""Fraction added to the estimate for the allocator, workspaces and the CUDA context."""
GIB = 1 << 30
_F32, _BF16, _I64 = 4, 2, 8


def param_count(cfg: ModelConfig, vocab_size: int | None = None) -> int:
    """Parameters of ``cfg`` for a tokenizer of ``vocab_size`` tokens, from the shapes alone."""
    c = cfg.resolved(vocab_size)
    dim, vocab = resolved_int(c.dim), resolved_int(c.vocab_size)
    per_block = block_linear_params(c) + 2 * dim  # + attention_norm, ffn_norm
    head = 0 if c.tie_embeddings else vocab * dim
    return vocab * dim + resolved_int(c.n_layers) * per_block + dim + head


def activation_parts(
    cfg: ModelConfig,
    micro_batch: int,
    seq_len: int,
    precision: str,
    checkpointing: str = "none",
    extra: int = 0,
) -> dict[str, int]:
    """Bytes autograd keeps for one forward of ``micro_batch`` x ``seq_len`` tokens of the resolved
    ``cfg``, by part: ``blocks`` (all of them), ``head`` (final norm, LM head input, log-probs),
    ``tokens`` (ids), and ``loss_transient``: one (B, T, V) fp32 tensor alive around the loss but
    not saved. ``precision`` is the resolved one: ``fp32`` or ``bf16`` (autocast). With
    ``checkpointing`` ``blocks``, ``blocks`` is each block's input (fp32, the residual stream), and
    ``recompute`` one block's activations, rebuilt in its backward. ``extra``: bytes per token and
    block that an architecture saves beyond these (``hf_config.qk_norm_bytes``: q/k norms)."""
    dim, n_heads, ffn = resolved_int(cfg.dim), resolved_int(cfg.n_heads), resolved_int(cfg.ffn_dim)
    vocab = resolved_int(cfg.vocab_size)
    a = _BF16 if precision == "bf16" else _F32  # GEMM operands and outputs
    norm = 2 * dim * _F32 + _F32  # x and x / rms in fp32 (residual stream is fp32), 1 / rms
    # the norm's output as the linears' input: once in fp32; under autocast one bf16 cast per
    # linear (wq, wk, wv; w1, w3)
    lin_inputs = (5 if precision == "bf16" else 2) * dim * a
    # rotated q, k and v (grouped: KV wide), output (wo's input is a view of it); fp32
    # log-sum-exp. RoPE saves nothing large: its multiplications only need the cos/sin tables.
    q, kv = head_widths(cfg)
    sdpa = (2 * q + 2 * kv) * a + n_heads * _F32
    mlp = 4 * ffn * a  # w1 out, silu out, w3 out, product
    per_token_block = 2 * norm + lin_inputs + sdpa + mlp + extra
    tokens = micro_batch * seq_len
    if checkpointing == "blocks":
        kept = {
            "blocks": resolved_int(cfg.n_layers) * dim * _F32 * tokens,
            "recompute": per_token_block * tokens,
        }
    else:
        kept = {"blocks": resolved_int(cfg.n_layers) * per_token_block * tokens}
    return kept | {
        "head": (norm + dim * a + vocab * _F32) * tokens,  # final norm, lm_head input, log-probs
        "tokens": tokens * _I64,
        "loss_transient": vocab * _F32 * tokens,  # logits (forward) / their gradient (backward)
    }


def evaluation_bytes(
    cfg: ModelConfig, micro_batch: int, seq_len: int, precision: str, extra: int = 0
) -> int:
    """Bytes one evaluation forward of ``micro_batch`` x ``seq_len`` tokens holds at its peak, no
    autograd (module docstring): one block's activations as transients, the hidden state, and at
    the head the logits in the autocast precision, their fp32 copy (the same tensor in fp32) and
    the fp32 log-probabilities."""
    tokens = micro_batch * seq_len
    parts = activation_parts(cfg, micro_batch, seq_len, precision, extra=extra)
    one_block = parts["blocks"] // resolved_int(cfg.n_layers)
    vocab, dim = resolved_int(cfg.vocab_size), resolved_int(cfg.dim)
    logits = (_BF16 + 2 * _F32 if precision == "bf16" else 2 * _F32) * vocab
    return one_block + (logits + 2 * dim * _F32) * tokens


def _weight_extras(
    cfg: ModelConfig,
    recipe: Recipe | None,
    precision: str,
    checkpointing: str = "none",
    all_gather: str = "fp32",
) -> tuple[int, int]:
    """(autocast weight copies, quantized-weight copies) in bytes. A checkpointed block saves
    neither (its casts and quantizations are recomputed): one block's are alive in its backward.
    With FSDP's bf16 all-gather the block linears make no copy: only the LM head's is left."""
    dim, vocab, n_layers = (
        resolved_int(cfg.dim),
        resolved_int(cfg.vocab_size),
        resolved_int(cfg.n_layers),
    )
    kept_blocks = 1 if checkpointing == "blocks" else n_layers
    if all_gather == "bf16":
        kept_blocks = 0
    copies = (
        (kept_blocks * block_linear_params(cfg) + vocab * dim) * _BF16 if precision == "bf16" else 0
    )
    quant = 0
    if recipe is not None and not recipe.high_precision:
        from backends.layer.linear import shares_weight_quantization

        ffn = resolved_int(cfg.ffn_dim)
        q, kv = head_widths(cfg)
        shapes = {
            "attention": (dim * q, dim * kv, dim * kv, q * dim),
            "mlp": (dim * ffn,) * 3,
        }
        per_block = [
            sum(
                sum(sizes) * 17 // 16  # uint8 codes + uint8 block scales
                for kind, sizes in shapes.items()
                if shares_weight_quantization(recipe.for_layer(kind, block, n_layers))
            )
            for block in range(n_layers)
        ]
        quant = max(per_block) if checkpointing == "blocks" else sum(per_block)
    return copies, quant


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per device for one cell; ``total`` includes the allowance."""

    n_params: int
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    """Training's: what autograd keeps for one micro-batch."""
    weight_copies: int
    quant_extras: int
    precision: str
    micro_batch: int
    seq_len: int
    ddp_buckets: int = 0
    fsdp_unsharded: int = 0
    workers: int = 1
    parallel: str = "none"
    evaluation: int = 0
    """What one evaluation forward holds (``evaluation_bytes``); not added to ``activations``:
    the two never coexist, ``peak_activations`` is the larger."""
    checkpointing: str = "none"
    """``train.activation_checkpointing``: with ``blocks`` the activations are the blocks' inputs
    plus one block's, and the weight copies one block's."""
    all_gather: str = "fp32"
    """``train.fsdp_all_gather``: with ``bf16`` the block linears keep no weight copies."""

    @property
    def peak_activations(self) -> int:
        return max(self.activations, self.evaluation)

    @property
    def shards(self) -> int:
        """Devices the parameters, gradients and AdamW state are split over (FSDP's workers)."""
        return self.workers if self.parallel == "fsdp" else 1

    @property
    def subtotal(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer
            + self.peak_activations
            + self.weight_copies
            + self.quant_extras
            + self.ddp_buckets
            + self.fsdp_unsharded
        )

    @property
    def allowance(self) -> int:
        return int(self.subtotal * ALLOWANCE)

    @property
    def total(self) -> int:
        return self.subtotal + self.allowance

    def breakdown(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.peak_activations,  # training's or evaluation's, the larger
            "evaluation": self.evaluation,  # (not added: included in activations when larger)
            "weight_copies": self.weight_copies,
            "quant_extras": self.quant_extras,
            "ddp_buckets": self.ddp_buckets,
            "fsdp_unsharded": self.fsdp_unsharded,
            "allowance": self.allowance,
            "total": self.total,
        }

    def short(self) -> str:
        """One line: the parallel mode (ddp or fsdp: ``fsdp x8: ``), the total and its breakdown
        (GiB, or MiB below 1 GiB)."""
        g = format_bytes
        mode = f"{self.parallel} x{self.workers}: " if self.parallel != "none" else ""
        extra = f" + ddp buckets {g(self.ddp_buckets)}" if self.parallel == "ddp" else ""
        if self.parallel == "fsdp":
            extra = f" + fsdp unsharded {g(self.fsdp_unsharded)}"
        per = " per worker" if self.parallel != "none" else ""
        ac = ", blocks checkpointed" if self.checkpointing == "blocks" else ""
        if self.all_gather == "bf16":
            ac += ", bf16 all-gather"
        return (
            f"{mode}{g(self.total)} per device = params {g(self.parameters)} + grads "
            f"{g(self.gradients)} + adam {g(self.optimizer)} + activations "
            f"{g(self.peak_activations)} (training {g(self.activations)}, evaluation "
            f"{g(self.evaluation)}: the larger counts)"
            f" + weight copies {g(self.weight_copies + self.quant_extras)}{extra} + "
            f"{ALLOWANCE:.0%} {g(self.allowance)} ({self.n_params / 1e6:,.1f}M params, "
            f"{self.precision}, micro-batch {self.micro_batch} x {self.seq_len}{per}{ac})"
        )


def format_bytes(n: int) -> str:
    """``n`` bytes in GiB (3 significant digits), or in MiB below 1 GiB."""
    if n >= GIB:
        return f"{n / GIB:.3g} GiB"
    mib = n / (1 << 20)
    return f"{mib:.3g} MiB" if mib < 100 else f"{mib:.0f} MiB"  # 1020 MiB, not 1.02e+03


def estimate(
    cfg: ModelConfig,
    vocab_size: int | None,
    *,
    batch_size: int,
    grad_accum: int,
    seq_len: int,
    precision: str,
    recipe: Recipe | None = None,
    workers: int = 1,
    parallel: str = "none",
    checkpointing: str = "none",
    all_gather: str = "fp32",
) -> MemoryEstimate:
    """The estimate per device for ``cfg`` (resolved with ``vocab_size``), one optimizer step of
    ``batch_size`` sequences split over ``workers`` workers, each in ``grad_accum`` micro-batches,
    at resolved ``precision``; ``parallel`` is the resolved mode: none, ddp or fsdp (see the
    module's docstring for what each keeps on a device); ``all_gather`` is FSDP's all-gather dtype
    of the block linears (fp32, or bf16 with fsdp and bf16 precision)."""
    if workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers}")
    if parallel not in ("none", "ddp", "fsdp"):
        raise ValueError(f"parallel: unknown {parallel!r}; allowed: none, ddp, fsdp")
    if parallel == "none" and workers > 1:
        raise ValueError(f"parallel: none trains in one process, not {workers} workers")
    if all_gather not in ("fp32", "bf16"):
        raise ValueError(f"all_gather: unknown {all_gather!r}; allowed: fp32, bf16")
    if all_gather == "bf16" and (parallel != "fsdp" or precision != "bf16"):
        raise ValueError(
            f"all_gather: bf16 needs parallel fsdp and precision bf16, not {parallel} and "
            f"{precision}"
        )
    if batch_size % (workers * grad_accum):
        raise ValueError(
            f"batch_size: {batch_size} does not split into workers x grad_accum = "
            f"{workers} x {grad_accum} equal micro-batches"
        )
    c = cfg.resolved(vocab_size)
    # a Hugging Face architecture: its own parameter count and what its q/k norms save
    n = param_count(c) if cfg.hf is None else num_params(cfg, vocab_size)
    extra = 0 if cfg.hf is None else qk_norm_bytes(cfg.hf, precision)
    micro = batch_size // (workers * grad_accum)
    copies, quant = _weight_extras(c, recipe, precision, checkpointing, all_gather)
    shards = workers if parallel == "fsdp" else 1
    return MemoryEstimate(
        n_params=n,
        parameters=-(-n * _F32 // shards),
        gradients=-(-n * _F32 // shards),
        optimizer=-(-2 * n * _F32 // shards),
        activations=sum(
            activation_parts(c, micro, seq_len, precision, checkpointing, extra).values()
        ),
        evaluation=evaluation_bytes(c, micro, seq_len, precision, extra),
        weight_copies=copies,  # of the all-gathered weights under FSDP: not sharded
        quant_extras=quant,
        ddp_buckets=n * _F32 if parallel == "ddp" else 0,
        fsdp_unsharded=fsdp_unsharded(c, grad_accum, all_gather) if parallel == "fsdp" else 0,
        precision=precision,
        micro_batch=micro,
        seq_len=seq_len,
        workers=workers,
        parallel=parallel,
        checkpointing=checkpointing,
        all_gather=all_gather,
    )


def fsdp_unsharded(cfg: ModelConfig, grad_accum: int, all_gather: str = "fp32") -> int:
    """Bytes of FSDP's unsharded working set on one device for the resolved ``cfg`` (module
    docstring): the root's all-gathered parameters, two blocks' (computed and prefetched), and as
    many unsharded gradients (reduce-scattered every micro-batch, whatever ``grad_accum``), all
    fp32; with the bf16 ``all_gather`` the block linears' parameters in bf16, their gradients in
    bf16 plus the fp32 copy reduce-scattered."""
    del grad_accum  # every micro-batch is reduce-scattered: gradients accumulate sharded
    dim, vocab = resolved_int(cfg.dim), resolved_int(cfg.vocab_size)
    root = vocab * dim + dim + (0 if cfg.tie_embeddings else vocab * dim)  # embedding, norm, head
    linears, norms = block_linear_params(cfg), 2 * dim
    if all_gather == "bf16":
        params = root * _F32 + 2 * (linears * _BF16 + norms * _F32)
        grads = root * _F32 + 2 * (linears * (_BF16 + _F32) + norms * _F32)
        return params + grads
    gathered = (root + 2 * (linears + norms)) * _F32
    return 2 * gathered


def tokenizer_vocab(run: RunConfig) -> int | None:
    """The tokenizer's vocabulary the model will be built for: 257 for ``byte``; a tokenizer.json's
    (a hub tokenizer's only from the local cache: a plan does not wait for the network) when it
    loads, else None (the model's own or its preset's vocabulary is used)."""
    if run.data.tokenizer == "byte":
        return 257
    try:
        from ablate.data import load_tokenizer

        return load_tokenizer(run.data.tokenizer, offline=True).vocab_size
    except Exception:  # noqa: BLE001  (a missing file or package: fall back to the config's)
        return None


def estimate_run(run: RunConfig, kind: str | None = None) -> MemoryEstimate:
    """The estimate per device for a cell's ``RunConfig`` on a device ``kind`` (default: what its
    ``device`` resolves to here), in its parallel mode over its ``train.workers``."""
    from ablate.train.config import device_kind, resolved_precision

    kind = kind or device_kind(run.device)
    tc = run.train
    return estimate(
        run.model,
        tokenizer_vocab(run),
        batch_size=tc.batch_size,
        grad_accum=tc.grad_accum,
        seq_len=tc.seq_len,
        precision=resolved_precision(tc.precision, kind),
        recipe=run.recipe,
        workers=tc.workers,
        parallel=tc.resolved_parallel,
        checkpointing=tc.activation_checkpointing,
        all_gather=tc.fsdp_all_gather,
    )


_UNITS = {"gib": 1 << 30, "gb": 10**9, "mib": 1 << 20, "mb": 10**6}
SIZE_FORMS = "a number with GiB, GB, MiB or MB, e.g. 80GiB, 24GB, 512MiB"


def parse_size(text: str) -> int:
    """Bytes of ``80GiB``, ``80 GB``, ``512MiB``, ``1.5GiB`` (case-insensitive); ValueError else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a memory size; give {SIZE_FORMS}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def visible_device_memory() -> int | None:
    """Total memory of the visible GPU 0, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


__all__ = [
    "ALLOWANCE",
    "MemoryEstimate",
    "activation_parts",
    "estimate",
    "estimate_run",
    "evaluation_bytes",
    "format_bytes",
    "fsdp_unsharded",
    "param_count",
    "parse_size",
    "visible_device_memory",
]
