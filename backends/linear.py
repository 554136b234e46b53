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

2-D weight blocks: when fprop and dgrad quantize W with the same square 2-D blocks and neither GEMM
rotates it, W is quantized once, in the forward pass, and dgrad multiplies by the transpose of that
quantization (``QTensor.t``): W and W^T are the same quantized values, as in NVIDIA's NVFP4 recipe.

``QuantLinear.gemm_hook``, when set, sees every GEMM call of the layer (name, operands as the backend
receives them, call index, output); ``backends.probe`` uses it to capture operands. It changes nothing.

``convert_model`` swaps a model's ``nn.Linear`` modules for ``QuantLinear`` by name; embeddings are
not linears, and the LM head (``lm_head``/``output``/``head``) stays in high precision because its
logits feed the softmax directly and every published FP4 recipe keeps it there. A recipe's layer
selection (``Recipe.layer_types``, ``blocks``, ``keep_first``/``keep_last``) reads a linear's type and
block from its path (``layer_type``; ``layers.3.attention.wq`` is an attention linear of block 3).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import GemmKeys
from .hadamard import SIZES, sign_vector
from .quant import QTensor, quantize
from .recipe import GEMMS, OPERANDS, Recipe
from .registry import get_backend
from .rng import GEMM_IDS, OPERAND_IDS, derive_key

_SIGNS_STREAM = 0  # operand id used for Hadamard sign keys
DEFAULT_EXCLUDE = ("lm_head", "output", "head")
GemmHook = Callable[[str, torch.Tensor, Any, int, torch.Tensor], None]


class _QuantLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        layer: QuantLinear,
        call: int,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (T, in)
        ctx.save_for_backward(x2, weight)
        ctx.layer, ctx.call, ctx.x_shape, ctx.has_bias = layer, call, x.shape, bias is not None
        # fprop: X (T, in) and W (out, in) both quantized along in_features; with shared 2-D
        # weight blocks W is quantized here once, and dgrad uses the same quantization
        w: torch.Tensor | QTensor = weight
        if layer.shares_weight_quantization:
            spec = layer.recipe.fprop.b
            assert spec is not None
            w = quantize(weight, spec, axis=1, key=layer._keys("fprop", call).b)
        ctx.wq = w if isinstance(w, QTensor) else None
        y = layer._mm("fprop", x2, w, call)  # (T, out) float32
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, weight = ctx.saved_tensors
        layer: QuantLinear = ctx.layer
        dy2 = dy.reshape(-1, dy.shape[-1])  # (T, out)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            # dgrad: dY (T, out) and W^T (in, out) both quantized along out_features
            wt = (
                weight.t() if ctx.wq is None else ctx.wq.t()
            )  # the forward's quantized W, transposed
            dx = layer._mm("dgrad", dy2, wt, ctx.call)  # (T, in)
            dx = dx.to(x2.dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            # wgrad: dY^T (out, T) and X^T (in, T) both quantized along the token dimension
            dw = layer._mm("wgrad", dy2.t(), x2.t(), ctx.call).to(weight.dtype)  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(weight.dtype)
        return dx, dw, db, None, None


class QuantLinear(nn.Linear):
    """``nn.Linear`` with per-GEMM quantization (see the module docstring)."""

    sr_seed: torch.Tensor  # () int64: seed of the layer's random streams
    calls: torch.Tensor  # () int64: training forwards so far (the "step" of the streams)
    hadamard_signs: torch.Tensor  # (3, 256) +-1: fixed sign vectors for fprop, dgrad, wgrad
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
        self.recipe = recipe if recipe is not None else Recipe.bf16()
        self.backend_name = backend
        self.backend = get_backend(backend)
        self.layer_id = layer_id
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
        self.gemm_hook = None

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

    def _keys(self, gemm: str, call: int) -> GemmKeys:
        seed, gid = int(self.sr_seed), GEMM_IDS[gemm]
        a_op, b_op = OPERANDS[gemm]
        return GemmKeys(
            a=derive_key(seed, self.layer_id, gid, OPERAND_IDS[a_op], call),
            b=derive_key(seed, self.layer_id, gid, OPERAND_IDS[b_op], call),
            signs=derive_key(seed, self.layer_id, gid, _SIGNS_STREAM, call),
        )

    @property
    def shares_weight_quantization(self) -> bool:
        """Whether fprop and dgrad use one quantization of W: the same 2-D-block spec for W in
        both, and no Hadamard transform in either (a rotation along different axes would make
        their values differ)."""
        f, d = self.recipe.fprop, self.recipe.dgrad
        return (
            f.b is not None
            and f.b.block_rows > 1
            and f.b == d.b
            and f.hadamard is None
            and d.hadamard is None
        )

    def _mm(self, gemm: str, a: torch.Tensor, b: torch.Tensor | QTensor, call: int) -> torch.Tensor:
        out = self._gemm(gemm, a, b, call)
        if self.gemm_hook is not None:  # b is a QTensor where fprop's W quantization is shared
            self.gemm_hook(gemm, a, b, call, out)
        return out

    def _gemm(
        self, gemm: str, a: torch.Tensor, b: torch.Tensor | QTensor, call: int
    ) -> torch.Tensor:
        g = self.recipe.gemm(gemm)
        if g.high_precision:
            assert isinstance(b, torch.Tensor)
            return (a @ b.t()).float()
        keys = self._keys(gemm, call)
        signs = None
        h = g.hadamard
        if h is not None and h.vector is not None:  # the recipe's one vector, for every layer
            signs = torch.tensor(h.vector, dtype=torch.float32, device=a.device)
        elif h is not None and h.signs == "fixed":
            signs = self.hadamard_signs[GEMMS.index(gemm), : h.size]
        elif h is not None and h.signs == "random":
            signs = sign_vector(h.size, keys.signs, device=a.device)
        return self.backend.mm(a, b, g, keys, signs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.high_precision:
            return F.linear(x, self.weight, self.bias)
        weight: torch.Tensor = self.weight
        bias: torch.Tensor | None = self.bias
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dt), weight.to(dt)
            bias = None if bias is None else bias.to(dt)
        call = int(self.calls)
        if self.training and torch.is_grad_enabled():
            self.calls += 1
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
