"""The blocks every quantizer of the torch paths starts from (``prepare``): an operand, after its
Hadamard transform, zero-padded and cut into blocks along its last dimension, with each block's
maximum and whether it holds a non-finite value (``Blocks``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.quant.arith import Plan, tiles
from backends.quant.hadamard import hadamard_transform_reference


@dataclass(frozen=True, slots=True)
class Blocks:
    """An operand cut into blocks along its last dimension, as every quantizer starts.

    ``x`` the float32 operand (after the Hadamard transform, if any), ``K`` its length, ``xb``
    ``(..., nb, B)`` zero-padded to ``Kp = nb * B``, ``index`` the flat element indices in the
    same shape (the random stream's counter), ``nonfinite`` and ``amax`` ``(..., nb)`` per block
    (per tile with 2-D blocks)."""

    x: torch.Tensor
    K: int
    xb: torch.Tensor
    index: torch.Tensor
    nonfinite: torch.Tensor
    amax: torch.Tensor


def prepare(xm: torch.Tensor, signs: torch.Tensor | None, p: Plan, unit: int = 0) -> Blocks:
    """``Blocks`` of ``xm`` (axis last) for plan ``p``, K padded to a multiple of ``unit`` (default
    the block), the padding zeros (they change no maximum)."""
    if p.hadamard:
        xm = hadamard_transform_reference(xm, -1, p.hadamard, signs)
    x = xm.float()
    K = x.shape[-1]
    B = p.block
    U = unit or B
    Kp = -(-K // U) * U
    index = torch.arange(x.numel(), device=x.device).view(x.shape)
    xb = torch.nn.functional.pad(x, (0, Kp - K)).unflatten(-1, (-1, B))
    index = torch.nn.functional.pad(index, (0, Kp - K)).unflatten(-1, (-1, B))
    nonfinite = (~torch.isfinite(xb)).any(-1)
    amax = xb.abs().amax(-1)
    if p.rows > 1:
        nonfinite, amax = tiles(nonfinite, p.rows), tiles(amax, p.rows)
    return Blocks(x, K, xb, index, nonfinite, amax)
