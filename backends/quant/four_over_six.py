"""Four Over Six: per NVFP4 block, the scale that maps its maximum to 6 or to 4, whichever errs less.

Cook et al., "Four Over Six: More Accurate NVFP4 Quantization with Adaptive Block Scaling" (arXiv
2512.02010), as its PyTorch reference computes it (mit-han-lab/fouroversix,
``src/fouroversix/quantize/pytorch/reference.py``: ``nvfp4_fouroversix_block_scaled_quantization``,
``compute_nv_scale_factors``, ``select_fouroversix``) and TransformerEngine's NVFP4 4over6 reference
(``NVFP4QuantizerRef._quantize_blockwise_4over6_reference`` in
``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``), which compute the same thing.
E2M1's grid is coarse at the top (4 to 6 is one step): mapping a block's maximum to 4 instead keeps
values near it on a finer grid, at the price of range. ``QuantSpec(format="nvfp4",
scale_rule=RULE)`` with RULE one of ``variants.SCALE_RULES`` turns it on; every step is one IEEE
float32 operation:

- tensor scale with the 4/6 bound 256 in place of E4M3's 448, so map-to-4's scale (x1.5, 384)
  still fits E4M3: ``S_enc = min(1536 / amax, FLT_MAX)`` (1536 = 6 * 256; 1 for an all-zero
  tensor), ``S_dec = 1 / S_enc``;
- per block (per tile with 2-D blocks) two candidate decode scales: ``s6 = E4M3_RNE(min(b, 448))``
  and ``s4 = E4M3_RNE(min(b * 1.5, 448))`` with ``b = (amax_b / 6) * S_enc`` (a division, then the
  product: not NVFP4's ``amax_b * (S_enc * fp32(1/6))``);
- each candidate's elements as NVFP4's: ``E2M1(x * min(1 / (s * S_dec), FLT_MAX))``, round to
  nearest even or stochastically (the same random number for both candidates, as the sources'
  GPU kernels draw it), saturated at +-6;
- each candidate's error against x from its dequantized values ``((q * s) * amax) / 1536``:
  ``mse`` sums ``d * d``, ``mae`` sums ``|d|`` (``d = value - x``), ``abs_max`` takes the largest
  ``|d|``. The sums run over the block's elements in order (TransformerEngine's reference; the
  fouroversix reference leaves the order to ``torch.sum``); a 2-D tile adds its 16 rows' sums in
  TransformerEngine's tree (rows i and i + 8, then i + 4, i + 2, i + 1);
- the block takes map-to-4 where its error is strictly smaller (a tie keeps 6);
- under stochastic rounding, comparing the candidates as they round with the same draws
  (``scale_pick: rounded``, the sources' choice) makes the scale depend on the draws, and the
  estimate biased (``docs/recipes.md`` gives the bias measured by ``python -m
  ablate.bench.bias``; fouroversix's own reference draws the candidates' noise independently,
  biased too, differently); ``scale_pick: nearest`` compares them as they round to nearest and
  then rounds the chosen one stochastically, unbiased (``tests/backends/quant/test_scale_rule.py``);
- values decode as ``q * ((s * amax) * fp32(1/1536))`` (NVFP4's TransformerEngine form with the
  4/6 bound; fouroversix's dequantizer computes ``((q * s) * amax) / 1536``, which may differ in
  the last bit); a native GEMM's alpha is ``(amax_a * amax_b) * fp32(1/1536^2)``.

Where the sources differ, this follows TransformerEngine: a block whose chosen E4M3 scale is 0 keeps
its saturated element codes (fouroversix writes zeros; both decode to 0), and elements saturate at 6
(fouroversix's round-to-nearest does not clip, so a scaled value of 7 or more would become 8, which
E2M1 cannot hold). With a ``prescale`` the candidates are compared with ``x * prescale`` (fouroversix
folds its 16/17 into the tensor scale instead; the same comparison up to rounding).
"""

from __future__ import annotations

import torch

from backends.quant.arith import E4M3_ELEM, F32_MAX, Plan, div, encode, round_to_grid, tensor_scales
from backends.quant.blocks import prepare
from backends.quant.rng import uniform24
from backends.quant.variants import FOUR_OVER_SIX_TOP as TOP

DEQ = float(torch.tensor(1.0) / torch.tensor(TOP))
"""fp32(1/1536), the dequantizer's factor (``qtensor.nv_decode``)."""
ALPHA = float(torch.tensor(1.0) / torch.tensor(TOP * TOP))
"""fp32(1/1536^2): a native GEMM's alpha factor for two 4/6 operands."""
MAP4 = 1.5  # map-to-4's scale is 6/4 times map-to-6's


def _block_error(d: torch.Tensor, rule: str) -> torch.Tensor:
    """(..., nb) error of each block from the (..., nb, B) differences ``d``: a sum in element
    order for mse/mae, the maximum for abs_max."""
    if rule == "abs_max":
        return d.abs().amax(-1)
    t = d * d if rule == "mse" else d.abs()
    acc = t[..., 0]
    for i in range(1, t.shape[-1]):  # in order, one float32 addition at a time
        acc = acc + t[..., i]
    return acc


def _tile_error(err: torch.Tensor, rows: int, rule: str) -> torch.Tensor:
    """(R, nb) per-row block errors -> each tile's error on every row of the tile: the maximum for
    abs_max, else the sum of its rows in TransformerEngine's tree (halves added pairwise)."""
    R = err.shape[0]
    pad = -R % rows
    e = torch.nn.functional.pad(err, (0, 0, 0, pad)) if pad else err
    t = e.unflatten(0, (-1, rows))  # (R / rows, rows, nb)
    if rule == "abs_max":
        tile = t.amax(1)
    else:
        while t.shape[1] > 1:
            h = t.shape[1] // 2
            t = t[:, :h] + t[:, h:]
        tile = t[:, 0]
    return tile.repeat_interleave(rows, 0)[:R]


def run(
    xm: torch.Tensor, key: torch.Tensor, signs: torch.Tensor | None, p: Plan
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``torch_path.run`` for a Four Over Six plan (``p.rule``): the same outputs (values, or codes,
    E4M3 scale codes, the tensor decode scale and amax)."""
    b = prepare(xm, signs, p)
    e = p.elem
    genc, gdec, finite, tamax = tensor_scales(b.x, e, True, TOP)
    nonfinite = b.nonfinite | ~finite
    base = div(b.amax, 6.0) * genc  # (amax_b / 6) * S_enc
    u = uniform24(key, b.index) if p.sr else None
    target = b.xb if p.prescale == 1.0 else b.xb * p.prescale
    # scale_pick nearest: the candidates are compared as they round to nearest, so the choice does
    # not depend on the draws, and the chosen one then rounds stochastically: unbiased
    pick_u = None if p.pick_nearest else u
    cands = []
    for factor in (1.0, MAP4):  # map-to-6, then map-to-4
        s = base if factor == 1.0 else base * factor
        s8 = round_to_grid(
            s.clamp(max=E4M3_ELEM.max), E4M3_ELEM, None
        )  # E4M3, round to nearest even
        enc = torch.clamp(div(torch.ones_like(s8), s8 * gdec), max=F32_MAX)
        scaled = b.xb * (enc * p.prescale).unsqueeze(-1)
        q = round_to_grid(scaled, e, pick_u)
        value = div((q * s8.unsqueeze(-1)) * tamax, TOP)  # what each candidate decodes to
        err = _block_error(value - target, p.rule)
        if p.rows > 1:
            err = _tile_error(err, p.rows, p.rule)
        cands.append((s8, scaled, q, err))
    (s6, x6, q6, err6), (s4, x4, q4, err4) = cands
    pick4 = err4 < err6  # a tie keeps map-to-6
    s8 = torch.where(pick4, s4, s6)
    if p.pick_nearest and u is not None:
        q = round_to_grid(torch.where(pick4.unsqueeze(-1), x4, x6), e, u)
    else:
        q = torch.where(pick4.unsqueeze(-1), q4, q6)
    q = torch.where(nonfinite.unsqueeze(-1), torch.nan, q)
    if not p.values:
        scales = torch.where(nonfinite, 0x7F, encode(s8, E4M3_ELEM)).to(torch.uint8)
        return encode(q.flatten(-2), e), scales, gdec, tamax
    dec = (s8 * tamax) * DEQ
    out = q * dec.unsqueeze(-1)
    return out.flatten(-2)[..., : b.K].to(p.out_dtype), None, None, None


__all__ = ["ALPHA", "DEQ", "MAP4", "TOP", "run"]
