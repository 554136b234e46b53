"""Block-diagonal Hadamard transforms along any axis, with the three sign policies of the recipes.

``hadamard_transform(x, axis, size, signs)`` multiplies every consecutive group of ``size`` elements
along ``axis`` by ``diag(signs) @ H / sqrt(size)``, where H is the Sylvester Hadamard matrix. The
matrix is orthogonal, so applying it to both operands of a GEMM along the reduction dimension leaves
the exact product unchanged: ``(A D H)(B D H)^T = A B^T``. A reduction dimension that is not a multiple
of ``size`` is zero-padded (the output keeps the padded length; both operands get the same padding,
so the product is still exact).

Sign policies (``SignPolicy``): ``none`` - deterministic H (the H16 of the MXFP4 paper); ``fixed`` -
one seeded sign vector per layer and GEMM, constant over training (stored as a buffer); ``random`` -
signs redrawn at every call from (seed, layer, GEMM, step): the random Hadamard transform of Tseng et al.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch

from .rng import random_bits

SIZES = (16, 32, 64, 128, 256)
SIGN_POLICIES = ("none", "fixed", "random")
SignPolicy = Literal["none", "fixed", "random"]


def check_size(size: int) -> None:
    if size not in SIZES:
        raise ValueError(
            f"hadamard size {size!r} is not supported; allowed: {', '.join(map(str, SIZES))} "
            "(powers of two from 16 to 256)"
        )


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


def sign_vector(size: int, key: int, device: torch.device | str | None = None) -> torch.Tensor:
    """A reproducible vector of +-1 (float32) drawn from a 32-bit key (see ``rng.derive_key``)."""
    check_size(size)
    bits = random_bits(key, torch.arange(size, device=device))
    return torch.where((bits >> 31) == 1, -1.0, 1.0)


def hadamard_transform(
    x: torch.Tensor, axis: int, size: int, signs: torch.Tensor | None = None
) -> torch.Tensor:
    """Apply the block-diagonal ``diag(signs) H / sqrt(size)`` along ``axis``.

    Computed in float32 for 16-bit inputs (float64 stays float64); the result is float32/float64 and
    contiguous with ``axis`` moved back in place.
    """
    check_size(size)
    if not x.is_floating_point():
        raise TypeError(f"hadamard_transform needs a floating-point tensor, got {x.dtype}")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {tuple(x.shape)}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    m = hadamard_matrix(size, dtype, x.device)
    if signs is not None:
        if signs.shape != (size,):
            raise ValueError(f"signs must have shape ({size},), got {tuple(signs.shape)}")
        m = signs.to(dtype).unsqueeze(1) * m  # diag(signs) @ H
    xm = x.movedim(axis, -1).to(dtype)
    K = xm.shape[-1]
    pad = -K % size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    y = (xm.reshape(-1, size) @ m).reshape(xm.shape)  # (..., Kp)
    return y.movedim(-1, axis)
