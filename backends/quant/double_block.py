"""Double-block NVFP4: an FP32 scale per block of blocks in place of NVFP4's one tensor scale.

TetraJet-v2 (Chen et al., "TetraJet-v2: Accurate NVFP4 Training for Large Language Models with
Oscillation Suppression and Outlier Control", arXiv 2510.27527) quantizes every operand with E4M3
scales per 16 elements under an FP32 "outer" scale per 128 elements along the reduction dimension,
so no pass over the whole tensor (its amax) comes first and an outlier only coarsens its own 128
elements. ``QuantSpec(format="nvfp4", outer_block=128)``; the arithmetic of its CUDA quantizer
(thu-ml/TetraJet-v2-NVFP4Training, ``kernels/csrc/quant_fp4.cu``: ``quant_fp4_from_reg``), every
step one IEEE float32 operation:

- outer scale ``o = (omax / 448) / 6`` of each block of ``outer_block`` elements (1 where it is 0);
- inner E4M3 scale ``s = E4M3_RNE(min((imax / o) / 6, 448))`` of each 16 (the kernel's SATFINITE
  conversion), ``2^-9`` (E4M3's smallest subnormal) where ``(imax / o) / 6`` is 0;
- elements ``E2M1(x * (1 / (o * s)))``, round to nearest even or stochastically, saturated at +-6
  (0 where ``o * s`` is 0; ``E2M1(x / (o * s))`` where ``1 / (o * s)`` overflows, as the Triton
  reference of the same repository divides: the CUDA kernel's product would be NaN there);
- values ``q * (o * s)``, the kernel's dequantization.

Not TetraJet-v2's: the stochastic rounding draws from this project's stream (TetraJet-v2's kernel
adds uniform noise of one grid step from its own generator), and a non-finite value makes its outer
block NaN (every scale in it 0x7F) as a block-scaled format's non-finite block does. No native GEMM
here takes an outer scale (TetraJet-v2 ships its own), so the ``native`` backend refuses it and the
``emulated`` backend multiplies in FP32.
"""

from __future__ import annotations

import torch

from backends.quant.arith import E4M3_ELEM, Plan, div, encode, round_to_grid
from backends.quant.blocks import prepare
from backends.quant.rng import uniform24

INNER_FLOOR = 2.0**-9
"""The inner scale of a block whose scaled maximum is 0: E4M3's smallest subnormal."""


def run(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, p: Plan
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``torch_path.run`` for a double-block plan (``p.outer``): values, or (codes (..., Kp) with K
    padded to a multiple of the outer block, inner E4M3 scale codes (..., Kp / 16), the float32
    outer scales (..., Kp / outer) in the tensor-decode slot, None)."""
    O, B = p.outer, p.block
    b = prepare(xm, signs, p, unit=O)
    e = p.elem
    per = O // B  # inner blocks per outer block
    ob = b.amax.unflatten(-1, (-1, per))  # (..., no, per)
    outer_nonfinite = b.nonfinite.unflatten(-1, (-1, per)).any(-1)
    outer = div(div(ob.amax(-1), E4M3_ELEM.max), e.max)
    outer = torch.where(outer == 0, 1.0, outer)
    o = outer.repeat_interleave(per, -1)  # (..., nb)
    s = div(div(b.amax, o), e.max)
    s = torch.where(s == 0, INNER_FLOOR, s)
    s8 = round_to_grid(s.clamp(max=E4M3_ELEM.max), E4M3_ELEM, None)
    prod = o * s8
    inv = torch.where(prod != 0, div(torch.ones_like(prod), prod), 0.0)
    # 1 / (o * s) overflows to inf once the block's scale is below 1 / FLT_MAX (an outer maximum
    # under about 1.8e-38): there the elements are divided by o * s instead, as TetraJet-v2's own
    # reference does, so a tiny block quantizes to its values and never to NaN
    tiny = torch.isinf(inv).unsqueeze(-1)
    scaled = torch.where(
        tiny,
        div(b.xb, prod.unsqueeze(-1)) * p.prescale,
        b.xb * (inv * p.prescale).unsqueeze(-1),
    )
    u = uniform24(key, b.index) if p.sr else None
    q = round_to_grid(scaled, e, u)
    nonfinite = outer_nonfinite.repeat_interleave(per, -1)
    q = torch.where(nonfinite.unsqueeze(-1), torch.nan, q)
    if not p.values:
        scales = torch.where(nonfinite, 0x7F, encode(s8, E4M3_ELEM)).to(torch.uint8)
        outer = torch.where(outer_nonfinite, torch.nan, outer)
        return encode(q.flatten(-2), e), scales, outer, None
    out = q * prod.unsqueeze(-1)
    return out.flatten(-2)[..., : b.K].to(p.out_dtype), None, None, None


__all__ = ["INNER_FLOOR", "run"]
