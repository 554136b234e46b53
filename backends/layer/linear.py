"""The quantized linear layer: a drop-in ``nn.Linear`` whose three GEMMs each follow the recipe.

For ``y = x @ W^T + b`` with x flattened to (T, in) tokens, training runs three GEMMs, and each one
quantizes its two operands along *its own* reduction dimension, always from the high-precision
tensors saved by the forward pass (never re-quantizing a quantized tensor):

    fprop  Y  (T, out) = X (T, in)      @ W^T (in, out)   reduce over in    X, W   along in
    dgrad  dX (T, in)  = dY (T, out)    @ W   (out, in)   reduce over out   dY, W  along out
    wgrad  dW (out,in) = dY^T (out, T)  @ X   (T, in)     reduce over T     dY, X  along T

Every GEMM is computed by a backend as ``a @ b^T`` with both operands reduced over their last
dimension (``gemm.GemmBackend.mm``): fprop a=X, b=W; dgrad a=dY, b=W^T; wgrad a=dY^T, b=X^T.
The bias gradient is a high-precision sum. With an all-high-precision recipe the layer is exactly
``nn.Linear`` (``F.linear`` and its autograd).

Random streams: stochastic rounding and random Hadamard signs come from keys derived from
(seed, layer, GEMM, operand, call), where ``call`` counts the layer's training forwards (a buffer,
so a resumed run continues the same streams). Fixed Hadamard signs are a buffer drawn once per layer
(or the recipe's own vector, the same for every layer).

Data parallelism (``ablate.train.parallel``; ``set_rank`` tells each layer its rank): every rank
holds the same weight (DDP's replica, or FSDP's all-gathered one) and quantizes it identically, so
the weight's streams and the signs of fprop and dgrad (which rotate W too) carry no rank. The
per-rank operands, the inputs X and output gradients dY of each rank's own tokens, get keys that
include the rank (``per_rank``; rank 0 keeps a one-process run's keys), and so do wgrad's signs,
which rotate along the token dimension: ranks do not share rounding noise. wgrad is quantized on
each rank's local tokens before the gradients are reduced (DDP's all-reduce, FSDP's reduce-scatter,
both in fp32), as hardware does: the reduced gradient is the mean of W independently quantized
partial products, not one quantization of the global product.

No host synchronisation: the training step never reads a device tensor into Python. The keys of a
call are derived on the layer's device (``rng.extend_key``) from ``key_prefix`` (the keys of
(seed, layer, GEMM, operand), computed when the seed is set or loaded) and the ``calls`` buffer,
and reach the quantizer as int64 tensors; the recipe's sign vectors are a buffer too. So a compiled
model (``torch.compile(fullgraph=True)``) traces the layer in one graph, and on a GPU the step
queues its kernels without waiting for them. Only the CPU's C kernel turns a key into a Python int,
which costs no synchronisation there.

2-D weight blocks: when fprop and dgrad quantize W with the same square 2-D blocks and neither GEMM
rotates it, W is quantized once, in the forward pass, and dgrad multiplies by the transpose of that
quantization (``QTensor.t``): W and W^T are the same quantized values, as in NVIDIA's NVFP4 recipe.

``QuantLinear.gemm_hook``, when set, sees every GEMM call of the layer (name, operands as the backend
receives them, call index, output); ``backends.layer.probe`` uses it to capture operands. It changes nothing.

``convert_model`` swaps a model's ``nn.Linear`` modules for ``QuantLinear`` by name; embeddings are
not linears, and the LM head (``lm_head``/``output``/``head``) stays in high precision because its
logits feed the softmax directly and every published FP4 recipe keeps it there. A recipe's layer
selection (``Recipe.layer_types``, ``blocks``, ``keep_first``/``keep_last``) reads a linear's type and
block from its path (``layer_type``; ``layers.3.attention.wq`` is an attention linear of block 3).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backends.gemm import GemmKeys, get_backend
from backends.quant import SIZES, QTensor, quantize, sign_vector
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key, extend_key
from backends.recipes import GEMMS, OPERANDS, GemmRecipe, Recipe

_SIGNS_STREAM = 0  # operand id used for Hadamard sign keys
DEFAULT_EXCLUDE = ("lm_head", "output", "head")
GemmHook = Callable[[str, torch.Tensor, Any, torch.Tensor, torch.Tensor], None]
_SIGNS_LEN = max(SIZES)


RANK_PART = 1 << 40
"""Rank r > 0 adds the key part ``RANK_PART + r`` (beyond every call index a run reaches, so a
rank's stream is never another call's)."""


def per_rank(gemm: str, stream: str) -> bool:
    """Whether a GEMM's stream (an operand name, or ``signs``) differs between data-parallel ranks:
    the per-rank operands (x, dy: each rank's own tokens), and wgrad's Hadamard signs (wgrad
    rotates along the token dimension, where both operands are per rank). The weight's streams and
    the fprop/dgrad signs (which also rotate W) are shared, so every rank quantizes W alike."""
    if stream == "signs":
        return gemm == "wgrad"
    return stream != "w"


def _parts(seed: int, layer_id: int, gemm: str, stream: str, rank: int) -> tuple[int, ...]:
    sid = _SIGNS_STREAM if stream == "signs" else OPERAND_IDS[stream]
    parts = (seed, layer_id, GEMM_IDS[gemm], sid)
    return parts + (RANK_PART + rank,) if rank and per_rank(gemm, stream) else parts


def key_prefixes(seed: int, layer_id: int, rank: int = 0) -> torch.Tensor:
    """(3, 3) int64: ``derive_key(seed, layer, gemm, stream[, RANK_PART + rank])`` per GEMM (fprop,
    dgrad, wgrad) and stream (operand a, operand b, Hadamard signs), the rank part only on rank
    r > 0 and only for ``per_rank`` streams (rank 0 has the keys of a one-process run); a call's
    keys extend these by the call index."""
    rows = []
    for g in GEMMS:
        a_op, b_op = OPERANDS[g]
        rows.append(
            [derive_key(*_parts(seed, layer_id, g, s, rank)) for s in (a_op, b_op, "signs")]
        )
    return torch.tensor(rows, dtype=torch.int64)


def set_rank(model: nn.Module, rank: int) -> None:
    """Tell every ``QuantLinear`` of ``model`` its data-parallel rank (re-deriving its keys)."""
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.rank = rank


@torch.library.custom_op("ablate::next_call", mutates_args=("calls",))
def _next_call(calls: torch.Tensor) -> torch.Tensor:
    """The counter's value, then the counter advanced by one, on its device.

    An opaque op rather than ``clone`` and ``+=``: under torch.compile, AOTAutograd would recompute
    such a clone in the backward graph from the counter it had already advanced in the forward, so
    dgrad and wgrad would draw the streams of the next call; an opaque op's output is saved."""
    old = calls.clone()
    calls.add_(1)
    return old


@_next_call.register_fake
def _(calls: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(calls)


class CallTape:
    """The call indices that a region's training calls drew, in order: recorded in its forward
    (``recording``) and handed out again, in the same order, to the same calls made once more
    (``replaying``), so a recomputed forward draws the original forward's random streams and no
    counter advances twice. Eager only: under torch.compile a selective checkpoint that saves
    ``ablate::next_call`` does the same (``ablate.model.recompute``)."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []
        self._replayed: int | None = None  # None: recording

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self._replayed = None
        token = _TAPE.set(self)
        try:
            yield
        finally:
            _TAPE.reset(token)

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        self._replayed = 0
        token = _TAPE.set(self)
        try:
            yield
        finally:
            _TAPE.reset(token)

    def draw(self, calls: torch.Tensor) -> torch.Tensor:
        """A training call's index: ``_next_call(calls)`` recorded, or the recorded one replayed."""
        if self._replayed is None:
            self.calls.append(_next_call(calls))
            return self.calls[-1]
        if self._replayed >= len(self.calls):
            raise RuntimeError(
                f"a recomputed forward made more than the {len(self.calls)} quantized training "
                "calls of the forward it repeats: the region is not deterministic"
            )
        self._replayed += 1
        return self.calls[self._replayed - 1]


_TAPE: contextvars.ContextVar[CallTape | None] = contextvars.ContextVar(
    "ablate_call_tape", default=None
)


def _training_call(calls: torch.Tensor) -> torch.Tensor:
    """The index of a training call: from the active ``CallTape`` in eager mode, else the
    counter's (``_next_call``)."""
    if not torch.compiler.is_compiling():
        tape = _TAPE.get()
        if tape is not None:
            return tape.draw(calls)
    return _next_call(calls)


def is_random(g: GemmRecipe) -> bool:
    """Whether a GEMM's output depends on its random streams (SR or random Hadamard signs)."""
    sr = any(s is not None and s.is_random for s in (g.a, g.b))  # SR, MS-EDEN's scales
    return sr or (g.hadamard is not None and g.hadamard.signs == "random")


def shares_weight_quantization(recipe: Recipe) -> bool:
    """Whether fprop and dgrad use one quantization of W: the same 2-D-block spec for W in both,
    and no Hadamard transform in either (a rotation along different axes would make their values
    differ). Such a layer keeps the quantized W (a ``QTensor``) from the forward to the backward."""
    f, d = recipe.fprop, recipe.dgrad
    return (
        f.b is not None
        and f.b.block_rows > 1
        and f.b == d.b
        and f.hadamard is None
        and d.hadamard is None
    )


class _QuantLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        layer: QuantLinear,
        call: torch.Tensor,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (T, in)
        keys = layer._key_table(call)  # every GEMM's keys of this call, derived once
        # the input itself, not its (T, in) view: torch.compile cannot save a view that aliases an
        # input of the traced Function when that input was made in the graph (autocast's cast)
        ctx.save_for_backward(x, weight, call, keys)
        ctx.layer, ctx.x_shape, ctx.has_bias = layer, x.shape, bias is not None
        # fprop: X (T, in) and W (out, in) both quantized along in_features; with shared 2-D
        # weight blocks W is quantized here once, and dgrad uses the same quantization
        w: torch.Tensor | QTensor = weight
        if layer.shares_weight_quantization:
            spec = layer.recipe.fprop.b
            assert spec is not None
            w = quantize(weight, spec, axis=1, key=layer._keys("fprop", call, keys).b)
        ctx.wq = w if isinstance(w, QTensor) else None
        y = layer._mm("fprop", x2, w, call, keys)  # (T, out) float32
        if bias is not None:
            y = y + bias.float()
        y = y.reshape(*x.shape[:-1], weight.shape[0])
        # cast last: under autocast a new tensor, not a view (FSDP2 warns of a unit returning one);
        # no .to() when the dtype is already right: torch 2.11's compiled autograd.Function trains
        # wrongly when the output is that no-op's alias (a quantized fp32 step, tested)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, call, keys = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])  # (T, in)
        layer: QuantLinear = ctx.layer
        dy2 = dy.reshape(-1, dy.shape[-1])  # (T, out)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            # dgrad: dY (T, out) and W^T (in, out) both quantized along out_features
            wt = (
                weight.t() if ctx.wq is None else ctx.wq.t()
            )  # the forward's quantized W, transposed
            dx = layer._mm("dgrad", dy2, wt, call, keys)  # (T, in)
            dx = dx.to(x2.dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            # wgrad: dY^T (out, T) and X^T (in, T) both quantized along the token dimension
            dw = layer._mm("wgrad", dy2.t(), x2.t(), call, keys).to(weight.dtype)  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(weight.dtype)
        return dx, dw, db, None, None


class QuantLinear(nn.Linear):
    """``nn.Linear`` with per-GEMM quantization (see the module docstring)."""

    sr_seed: torch.Tensor  # () int64: seed of the layer's random streams
    calls: torch.Tensor  # () int64: training forwards so far (the "step" of the streams)
    hadamard_signs: torch.Tensor  # (3, 256) +-1: fixed sign vectors for fprop, dgrad, wgrad
    key_prefix: torch.Tensor  # (3, 3) int64, not saved: ``key_prefixes(sr_seed, layer_id)``
    recipe_signs: torch.Tensor  # (3, 256), not saved: the recipe's own sign vectors (0 if none)
    gemm_hook: GemmHook | None
    """Called after every GEMM with (gemm, a, b, call, output); None: nothing (see module doc)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: Recipe | None = None,
        backend: str = "emulated",
        layer_id: int = 0,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.register_buffer(
            "recipe_signs", torch.zeros(3, _SIGNS_LEN, device=device), persistent=False
        )
        self.recipe = recipe if recipe is not None else Recipe.bf16()
        self.backend_name = backend
        self.backend = get_backend(backend)
        self.layer_id = layer_id
        self._rank = 0
        # random-stream state, saved with the model: seed, training-call counter, fixed signs
        self.register_buffer("sr_seed", torch.tensor(seed, dtype=torch.int64, device=device))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64, device=device))
        signs = torch.stack(
            [
                sign_vector(max(SIZES), derive_key(seed, layer_id, GEMM_IDS[g], _SIGNS_STREAM))
                for g in GEMMS
            ]
        )
        self.register_buffer("hadamard_signs", signs.to(device))  # (3, 256) +-1
        self.register_buffer(
            "key_prefix", key_prefixes(seed, layer_id).to(device), persistent=False
        )
        self.gemm_hook = None

    @property
    def recipe(self) -> Recipe:
        return self._recipe

    @recipe.setter
    def recipe(self, recipe: Recipe) -> None:
        self._recipe = recipe
        self._random = any(is_random(recipe.gemm(g)) for g in GEMMS)
        with torch.no_grad():
            self.recipe_signs.zero_()
            for i, g in enumerate(GEMMS):
                h = recipe.gemm(g).hadamard
                if h is not None and h.vector is not None:
                    self.recipe_signs[i, : h.size] = torch.tensor(h.vector, dtype=torch.float32)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any, **kw: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kw)
        if prefix + "sr_seed" in state_dict:  # the key prefixes follow the loaded seed
            self._derive_prefixes()  # once per load

    @property
    def rank(self) -> int:
        """The data-parallel rank whose streams this layer draws (0: one process); setting it
        re-derives the keys (``per_rank``)."""
        return self._rank

    @rank.setter
    def rank(self, rank: int) -> None:
        if rank < 0:
            raise ValueError(f"rank: must be >= 0, got {rank}")
        self._rank = rank
        self._derive_prefixes()

    def _derive_prefixes(self) -> None:
        prefixes = key_prefixes(int(self.sr_seed), self.layer_id, self._rank)
        with torch.no_grad():
            self.key_prefix.copy_(prefixes.to(self.key_prefix.device))

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs: Any) -> QuantLinear:
        """A QuantLinear sharing ``linear``'s parameters (no copy)."""
        q = cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
            **kwargs,
        )
        q.weight = linear.weight
        q.bias = linear.bias
        return q

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.short()}, backend={self.backend_name}"

    def _key_table(self, call: torch.Tensor) -> torch.Tensor:
        """(3, 3) int64 keys of ``call`` (rows: fprop, dgrad, wgrad; columns: a, b, signs), derived
        on the device; an empty tensor when no GEMM of the recipe draws random numbers."""
        if not self._random:
            return call.new_empty(0)
        return extend_key(self.key_prefix, call)

    def _keys(
        self, gemm: str, call: int | torch.Tensor, table: torch.Tensor | None = None
    ) -> GemmKeys:
        """The keys of ``gemm`` at ``call``: from ``table`` (``_key_table(call)``, the training
        step: int64 tensors on the layer's device, no host synchronisation), else Python ints
        (probes). A recipe without SR or random signs uses no key: zeros."""
        if table is not None:
            if table.numel() == 0:
                return GemmKeys(a=0, b=0, signs=0)
            k = table[GEMMS.index(gemm)]
            return GemmKeys(a=k[0], b=k[1], signs=k[2])
        if isinstance(call, torch.Tensor):
            return self._keys(gemm, call, self._key_table(call))
        seed, a_op, b_op = int(self.sr_seed), *OPERANDS[gemm]

        def key(stream: str) -> int:
            return derive_key(*_parts(seed, self.layer_id, gemm, stream, self.rank), call)

        return GemmKeys(a=key(a_op), b=key(b_op), signs=key("signs"))

    @property
    def shares_weight_quantization(self) -> bool:
        """``shares_weight_quantization(self.recipe)``."""
        return shares_weight_quantization(self.recipe)

    def _mm(
        self,
        gemm: str,
        a: torch.Tensor,
        b: torch.Tensor | QTensor,
        call: torch.Tensor,
        keys: torch.Tensor,
    ) -> torch.Tensor:
        out = self._gemm(gemm, a, b, call, keys)
        if self.gemm_hook is not None:  # b is a QTensor where fprop's W quantization is shared
            self.gemm_hook(gemm, a, b, call, out)
        return out

    def signs(self, gemm: str, keys: GemmKeys) -> torch.Tensor | None:
        """The Hadamard sign vector of ``gemm`` for a call with ``keys`` (None: no signs)."""
        h = self.recipe.gemm(gemm).hadamard
        if h is None or h.signs == "none":
            return None
        if h.vector is not None:  # the recipe's one vector, for every layer
            return self.recipe_signs[GEMMS.index(gemm), : h.size]
        if h.signs == "fixed":
            return self.hadamard_signs[GEMMS.index(gemm), : h.size]
        return sign_vector(h.size, keys.signs, device=self.hadamard_signs.device)

    def _gemm(
        self,
        gemm: str,
        a: torch.Tensor,
        b: torch.Tensor | QTensor,
        call: int | torch.Tensor,
        table: torch.Tensor | None = None,
    ) -> torch.Tensor:
        g = self.recipe.gemm(gemm)
        if g.high_precision:
            assert isinstance(b, torch.Tensor)
            return (a @ b.t()).float()
        keys = self._keys(gemm, call, table)
        return self.backend.mm(a, b, g, keys, self.signs(gemm, keys))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.high_precision:
            return F.linear(x, self.weight, self.bias)
        weight: torch.Tensor = self.weight
        bias: torch.Tensor | None = self.bias
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dt), weight.to(dt)
            bias = None if bias is None else bias.to(dt)
        if self.training and torch.is_grad_enabled():  # a training call: advance the streams
            call = _training_call(self.calls)  # this call's index, on the device (no host sync)
        else:
            call = self.calls.clone()
        with torch.autocast(x.device.type, enabled=False):
            y: torch.Tensor = _QuantLinearFn.apply(x, weight, bias, self, call)
        return y


_BLOCK_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
LAYER_TYPE_NAMES = {
    "attention": ("attention", "attn", "self_attn", "self_attention", "cross_attn"),
    "mlp": ("feed_forward", "mlp", "ffn", "ff"),
}
"""Path components that mark a linear's type (this project's model: ``attention``, ``feed_forward``;
Hugging Face Llama: ``self_attn``, ``mlp``)."""


def layer_type(name: str) -> str | None:
    """``attention``, ``mlp`` or None for a linear's dotted path: the type of its closest
    enclosing module whose name marks one."""
    for part in reversed(name.split(".")[:-1]):
        for t, marks in LAYER_TYPE_NAMES.items():
            if part in marks:
                return t
    return None


def convert_model(
    model: nn.Module,
    recipe: Recipe,
    *,
    backend: str = "emulated",
    seed: int = 0,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    include: Callable[[str, nn.Linear], bool] | None = None,
) -> list[str]:
    """Replace ``model``'s ``nn.Linear`` modules in place by ``QuantLinear``; returns their names.

    Modules whose last name component is in ``exclude`` (the LM head) stay as they are, as do those
    ``include(name, module)`` rejects. The transformer block of a linear is the first integer in its
    path (``layers.3.attn.wq`` is block 3), its type what ``layer_type`` reads from the path; the
    linears the recipe's layer selection leaves out (``keep_first``/``keep_last`` blocks, blocks not
    in ``blocks``, types not in ``layer_types``) get the all-high-precision recipe. Layer ids (for
    random streams) number the converted layers in order.
    """
    excluded = set(exclude)
    targets: list[tuple[str, nn.Linear, int | None]] = []
    for name, mod in model.named_modules():
        if type(mod) is not nn.Linear:
            continue
        if name.rsplit(".", 1)[-1] in excluded or (include is not None and not include(name, mod)):
            continue
        m = _BLOCK_INDEX.search(name)
        targets.append((name, mod, int(m.group(1)) if m else None))
    blocks = [b for _, _, b in targets if b is not None]
    n_blocks = max(blocks) + 1 if blocks else None
    if n_blocks is not None:
        recipe.check_blocks(n_blocks)
    get_backend(backend).check(recipe, next(model.parameters()).device)
    for layer_id, (name, mod, block) in enumerate(targets):
        q = QuantLinear.from_linear(
            mod,
            recipe=recipe.for_layer(layer_type(name), block, n_blocks),
            backend=backend,
            layer_id=layer_id,
            seed=seed,
        )
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, q)
    return [n for n, _, _ in targets]
