"""Block-diagonal Hadamard transforms along any axis, with the three sign policies of the recipes.

``hadamard_transform(x, axis, size, signs)`` multiplies every consecutive group of ``size`` elements
along ``axis`` by ``diag(signs) @ H / sqrt(size)``, where H is the Sylvester Hadamard matrix. The
matrix is orthogonal, so applying it to both operands of a GEMM along the reduction dimension leaves
the exact product unchanged: ``(A D H)(B D H)^T = A B^T``. A reduction dimension that is not a multiple
of ``size`` is zero-padded (the output keeps the padded length; both operands get the same padding,
so the product is still exact).

Sign policies (``SignPolicy``), each the Hadamard kind of an intervention
(``backends.recipes.intervention``): ``none`` (``DETERMINISTIC``) - dht, H itself with no signs (the
H16 of the MXFP4 paper); ``fixed`` - fht, one seeded sign vector per layer and GEMM, constant over
training (stored as a buffer); ``random`` - rht, signs redrawn at every call from (seed, layer, GEMM,
step): the random Hadamard transform of Tseng et al.

The transforms below take ``signs=None`` for dht. The quantizer takes a transform as a
``Rotation(size, signs)``, a named tuple that is still the ``(size, signs)`` the custom ops pass;
the sizes, the sign policies and ``Rotation`` are ``rotation.py``'s, in plain Python.
"""

from __future__ import annotations

import functools
import math

import torch

from backends.quant import ckernel
from backends.quant.rng import random_bits
from backends.quant.rotation import check_size


@functools.lru_cache(maxsize=32)
def _sylvester(size: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_matrix(
    size: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix ``H / sqrt(size)`` (symmetric and orthogonal)."""
    check_size(size)
    return (_sylvester(size) / math.sqrt(size)).to(dtype=dtype, device=device)


def sign_vector(
    size: int, key: int | torch.Tensor, device: torch.device | str | None = None
) -> torch.Tensor:
    """A reproducible vector of +-1 (float32) drawn from a 32-bit key (see ``rng.derive_key``)."""
    check_size(size)
    bits = random_bits(key, torch.arange(size, device=device))
    return torch.where((bits >> 31) == 1, -1.0, 1.0)


def _butterfly(y: torch.Tensor, size: int, signs: torch.Tensor | None) -> torch.Tensor:
    """The canonical transform of rows of ``size`` elements: signs, butterfly stages, norm."""
    y = y.reshape(-1, size)
    if signs is not None:
        y = y * signs.to(y.dtype)
    h = 1
    while h < size:
        v = y.view(-1, size // (2 * h), 2, h)
        a, b = v[:, :, 0], v[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, size)
        h *= 2
    # a tensor of the working dtype: a Python float would multiply in double and round differently
    return y * torch.tensor(1 / math.sqrt(size), dtype=y.dtype, device=y.device)


def hadamard_transform(
    x: torch.Tensor, axis: int, size: int, signs: torch.Tensor | None = None
) -> torch.Tensor:
    """Apply the block-diagonal ``diag(signs) H / sqrt(size)`` along ``axis`` (``signs`` None: H
    alone, the intervention dht).

    Computed as the fast Walsh-Hadamard butterfly in float32 (float64 stays float64), the same
    operations in the same order on every path (the fused C kernel on the CPU, torch elsewhere), so
    results are reproducible bit for bit; matches ``x @ diag(signs) @ hadamard_matrix(size)`` up to
    float32 rounding. Returns float32 (float64 for float64 input) in x's shape, with the axis padded
    to a multiple of ``size``. Not differentiable: the quantized layer calls it inside its own
    autograd function, on the operands of each GEMM.
    """
    check_size(size)
    if not x.is_floating_point():
        raise TypeError(f"hadamard_transform needs a floating-point tensor, got {x.dtype}")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {tuple(x.shape)}")
    axis %= x.dim()
    if signs is not None and signs.shape != (size,):
        raise ValueError(f"signs must have shape ({size},), got {tuple(signs.shape)}")
    pad = -x.shape[axis] % size
    if pad:
        x = torch.nn.functional.pad(x, [0, 0] * (x.dim() - 1 - axis) + [0, pad])
    if ckernel.usable(x):
        return _hadamard_kernel(x, axis, size, signs)
    return hadamard_transform_reference(x, axis, size, signs)


def hadamard_transform_reference(
    x: torch.Tensor, axis: int, size: int, signs: torch.Tensor | None = None
) -> torch.Tensor:
    """``hadamard_transform`` in torch operations (any device); same bits as the kernel."""
    check_size(size)
    axis %= x.dim()
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    xm = x.movedim(axis, -1).to(dtype)
    pad = -xm.shape[-1] % size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    return _butterfly(xm, size, signs).reshape(xm.shape).movedim(-1, axis)


def _hadamard_kernel(
    x: torch.Tensor, axis: int, size: int, signs: torch.Tensor | None
) -> torch.Tensor:
    base, kaxis, how = ckernel.layout(x.detach(), axis)
    shape = base.shape
    out = torch.empty(shape, dtype=torch.float32)
    s = None if signs is None else signs.detach().to(torch.float32).contiguous()
    p = ckernel.HParams(
        outer=math.prod(shape[:kaxis]),
        K=shape[kaxis],
        inner=math.prod(shape[kaxis + 1 :]),
        g=size,
        in_dtype=ckernel.DTYPE_CODES[base.dtype],
        nthreads=torch.get_num_threads(),
        norm=1 / math.sqrt(size),
        signs=None if s is None else s.data_ptr(),
        x=base.data_ptr(),
        out=out.data_ptr(),
    )
    ckernel.run_hadamard(p)
    return ckernel.restore(out, axis, how)
