"""The quantized linear layer: a drop-in ``nn.Linear`` whose three GEMMs each follow the recipe.

For ``y = x @ W^T + b`` with x flattened to (T, in) tokens, training runs three GEMMs, and each one
quantizes its two operands along *its own* reduction dimension, always from the high-precision
tensors saved by the forward pass (never re-quantizing a quantized tensor):

    fprop  Y  (T, out) = X (T, in)      @ W^T (in, out)   reduce over in    X, W   along in
    dgrad  dX (T, in)  = dY (T, out)    @ W   (out, in)   reduce over out   dY, W  along out
    wgrad  dW (out,in) = dY^T (out, T)  @ X   (T, in)     reduce over T     dY, X  along T

Every GEMM is computed by a backend as ``a @ b^T`` with both operands reduced over their last
dimension (``gemm.base.GemmBackend.mm``): fprop a=X, b=W; dgrad a=dY, b=W^T; wgrad a=dY^T, b=X^T.
The bias gradient is a high-precision sum. With an all-high-precision recipe the layer is exactly
``nn.Linear`` (``F.linear`` and its autograd).

Random streams (``streams.py``, the layer's base class ``RandomStreams``): stochastic rounding and
random Hadamard signs draw from keys of (seed, layer, GEMM, operand, call), ``call`` counting the
layer's training forwards; a call derives every GEMM's keys once, on the device, and the backward
reuses them. Under data parallelism wgrad is quantized on each rank's local tokens before the
gradients are reduced, as hardware does: the reduced gradient is the mean of independently
quantized partial products. Nothing in the step reads a device tensor into Python, so a compiled
model traces the layer in one graph.

2-D weight blocks: when fprop and dgrad quantize W with the same square 2-D blocks and neither GEMM
rotates it, W is quantized once, in the forward pass, and dgrad multiplies by the transpose of that
quantization (``QTensor.t``): W and W^T are the same quantized values, as in NVIDIA's NVFP4 recipe.

``QuantLinear.gemm_hook``, when set, sees every GEMM call of the layer (name, operands as the backend
receives them, call index, output); ``backends.layer.probe`` uses it to capture operands. It changes nothing.

``convert.py`` puts the layer into a model (``convert_model`` by path, ``convert`` by a Hugging Face
architecture's table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backends.gemm import GemmKeys, get_backend
from backends.layer.streams import RandomStreams
from backends.quant import QTensor
from backends.quant.ops import quantize  # one opaque op in a compiled graph
from backends.recipes import Recipe

GemmHook = Callable[[str, torch.Tensor, Any, torch.Tensor, torch.Tensor], None]


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
        keys = layer.key_table(call)  # every GEMM's keys of this call, derived once
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
            w = quantize(weight, spec, axis=1, key=layer.keys("fprop", call, keys).b)
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


class QuantLinear(RandomStreams, nn.Linear):
    """``nn.Linear`` with per-GEMM quantization (see the module docstring); its random streams
    are ``RandomStreams``'."""

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
        self.init_streams(seed, layer_id, device)
        self.recipe = recipe if recipe is not None else Recipe.bf16()
        self.backend_name = backend
        self.backend = get_backend(backend)
        self.gemm_hook = None

    @property
    def recipe(self) -> Recipe:
        return self._recipe

    @recipe.setter
    def recipe(self, recipe: Recipe) -> None:
        self._recipe = recipe
        self.streams_for(recipe)

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
        out = self.run_gemm(gemm, a, b, call, keys)
        if self.gemm_hook is not None:  # b is a QTensor where fprop's W quantization is shared
            self.gemm_hook(gemm, a, b, call, out)
        return out

    def signs(self, gemm: str, keys: GemmKeys) -> torch.Tensor | None:
        """The Hadamard sign vector of ``gemm`` for a call with ``keys`` (None: no signs)."""
        return self.hadamard_signs_of(gemm, self.recipe.gemm(gemm).hadamard, keys)

    def run_gemm(
        self,
        gemm: str,
        a: torch.Tensor,
        b: torch.Tensor | QTensor,
        call: int | torch.Tensor,
        table: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``a @ b^T`` as ``gemm`` of call ``call`` computes it under the layer's recipe and
        backend (what training runs; probes call it again on captured operands)."""
        g = self.recipe.gemm(gemm)
        if g.high_precision:
            assert isinstance(b, torch.Tensor)
            return (a @ b.t()).float()
        keys = self.keys(gemm, call, table)
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
        call = self.next_call(self.training and torch.is_grad_enabled())
        with torch.autocast(x.device.type, enabled=False):
            y: torch.Tensor = _QuantLinearFn.apply(x, weight, bias, self, call)
        return y
