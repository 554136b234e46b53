"""Gradient-fidelity probes: how far each quantized GEMM of a ``QuantLinear`` is from the exact GEMM
on the same operands, and whether its error is random or structured over training (numerics only:
torch, no tracking; ``ablate.train.probe`` runs them during training and names the metrics).

``capture(layers)`` records every GEMM call of the given layers (through ``QuantLinear.gemm_hook``):
the operands exactly as the layer handed them to its backend, the call index that keys its random
streams, and the quantized output. On those, ``probe_gemm`` compares the GEMM that training computes
(the layer's own recipe and backend, ``QuantLinear.run_gemm``) with the high-precision GEMM
``a @ b^T`` in float32 (the product a Hadamard transform leaves unchanged, so the probe sees
quantization error only). With ``g`` the exact output, ``q`` the quantized one, ``e = q - g`` (all
flattened and concatenated over the calls, e.g. over micro-batches):

    cos         <q, g> / (|q| |g|)
    align       <q, g> / <g, g>                       (Quartet's projection; 1 when unbiased)
    rel_err     |e| / |g|
    sqnr_db     10 log10(|g|^2 / |e|^2)

Over ``draws`` redraws of the recipe's randomness on the same operands (draw r > 0 uses the stream
of call ``call + r * REDRAW_STRIDE``, which no training call reaches; nothing advances the layer's
counters), with ``m`` the mean error over draws:

    bias        |m| / |g|
    noise       sqrt(mean_r |e_r - m|^2) / |g|
    bias_ratio  |m| / mean_r |e_r|                    (1 when every draw errs alike; 1/sqrt(draws)
                                                       for independent zero-mean errors)
    draw_cos    mean cosine between the errors of two different draws

A recipe without randomness (no stochastic rounding, no random Hadamard signs) gives the same output
on every draw, so ``draws_for`` asks it for one draw and its repeat metrics are exact (bias_ratio 1,
noise 0, draw_cos 1).

Per operand (``operand_stats``, with the quantizer's own scales and keys): the fraction of elements
saturated (clipped: ``|x| * enc * prescale > max``), flushed to zero (non-zero, quantized to 0), and
the mean block-scale utilisation (block amax after scaling / the element format's max; above 1 where
a block clips). The NVFP4 variants are measured with their own scales: a Four Over Six block
mapped to 4 shows as a utilisation near 4/6, MS-EDEN's elements against the scale they were rounded
with (before its correction), double-block NVFP4's against its outer x inner scale.

Error structure over steps (``ErrorHistory``, on the same probe batch at consecutive probe steps):
``step_cos``, the cosine between this probe's error and the previous one's; ``sum_ratio``, over the
last ``window`` probes, ``|sum_t e_t| / sum_t |e_t|`` (1 when the errors point the same way, about
``1/sqrt(window)`` when they are independent); ``step_cos_perp``, the cosine of the errors' parts
orthogonal to their exact outputs (a shrinkage along g, ``align < 1``, is shared by consecutive
errors whatever the pattern of the rest).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from backends.layer.linear import QuantLinear
from backends.layer.streams import is_random
from backends.quant import QTensor, QuantSpec, ckernel, hadamard_transform, ms_eden, quantize
from backends.quant.arith import F32_MAX
from backends.quant.quantizer import global_scales, run_kernel
from backends.quant.rotation import Rotation, rotation
from backends.recipes import OPERANDS, GemmRecipe

REDRAW_STRIDE = 1 << 32
"""Draw r of call c uses the random streams of call ``c + r * REDRAW_STRIDE``: training's call
counter counts forwards and never gets there, so a redraw is never a stream training uses."""

GEMM_METRICS = ("cos", "align", "rel_err", "sqnr_db")
REPEAT_METRICS = ("bias", "noise", "bias_ratio", "draw_cos")
STEP_METRICS = ("step_cos", "step_cos_perp", "sum_ratio")
OPERAND_METRICS = ("sat", "ftz", "util")


@dataclass(frozen=True, slots=True)
class GemmCall:
    """One GEMM call of a layer as training ran it: ``a`` (M, K) and ``b`` (N, K) as the backend
    received them (possibly transposed views; ``b`` is a ``QTensor`` where fprop and dgrad share
    one 2-D-block quantization of W), the call index that keys its random streams, the quantized
    output (M, N) float32, and ``b_exact``: ``b`` in high precision (W or W^T where ``b`` is
    already quantized)."""

    gemm: str
    a: torch.Tensor
    b: torch.Tensor | QTensor
    call: int
    out: torch.Tensor
    b_exact: torch.Tensor

    @classmethod
    def of(
        cls,
        layer: QuantLinear,
        gemm: str,
        a: torch.Tensor,
        b: torch.Tensor | QTensor,
        call: int,
        out: torch.Tensor,
    ) -> GemmCall:
        if isinstance(b, QTensor):  # the shared quantization of W (from W as the layer cast it)
            w = layer.weight.detach().to(a.dtype)
            return cls(gemm, a.detach(), b, call, out.detach(), w if gemm == "fprop" else w.t())
        return cls(gemm, a.detach(), b.detach(), call, out.detach(), b.detach())


@contextmanager
def capture(layers: Mapping[str, QuantLinear]) -> Iterator[dict[str, list[GemmCall]]]:
    """Record every GEMM call of ``layers`` while the block runs: name -> calls in order. The hooks
    are removed on exit; the layers compute exactly what they would without them."""
    calls: dict[str, list[GemmCall]] = {name: [] for name in layers}
    for name, layer in layers.items():
        if layer.gemm_hook is not None:
            raise RuntimeError(f"{name}: a GEMM hook is already installed")

        def hook(
            gemm: str,
            a: torch.Tensor,
            b: torch.Tensor | QTensor,
            call: torch.Tensor,
            out: torch.Tensor,
            _into: list[GemmCall] = calls[name],
            _layer: QuantLinear = layer,
        ) -> None:
            _into.append(GemmCall.of(_layer, gemm, a, b, int(call), out))  # probes may sync

        layer.gemm_hook = hook
    try:
        yield calls
    finally:
        for layer in layers.values():
            layer.gemm_hook = None


def draws_for(g: GemmRecipe, repeats: int) -> int:
    """Draws a probe needs: ``repeats`` for a random GEMM, 1 for a deterministic one (its draws are
    all the same output)."""
    return repeats if is_random(g) else 1


def redraw(layer: QuantLinear, c: GemmCall, r: int) -> torch.Tensor:
    """Draw ``r`` of call ``c``: its captured output for r = 0, else the layer's GEMM on the same
    operands with the streams of call ``c.call + r * REDRAW_STRIDE``."""
    if r == 0:
        return c.out
    return layer.run_gemm(c.gemm, c.a, c.b, c.call + r * REDRAW_STRIDE)


def signs_of(layer: QuantLinear, gemm: str, call: int) -> torch.Tensor | None:
    """The Hadamard sign vector the layer uses for ``gemm`` at ``call`` (None: no signs)."""
    return layer.signs(gemm, layer.keys(gemm, call))


@dataclass(slots=True)
class OperandStats:
    """Counts over the elements (and blocks) of one operand, summed over calls."""

    elements: int = 0
    saturated: int = 0
    flushed: int = 0
    blocks: int = 0
    util_sum: float = 0.0

    def add(self, other: OperandStats) -> None:
        self.elements += other.elements
        self.saturated += other.saturated
        self.flushed += other.flushed
        self.blocks += other.blocks
        self.util_sum += other.util_sum

    def metrics(self) -> dict[str, float]:
        n, b = max(self.elements, 1), max(self.blocks, 1)
        return {
            "sat": self.saturated / n,
            "ftz": self.flushed / n,
            "util": self.util_sum / b if self.blocks else math.nan,
        }


def operand_stats(
    t: torch.Tensor,
    spec: QuantSpec,
    key: int | torch.Tensor,
    hadamard: Rotation | None = None,
    quantized: QTensor | None = None,
) -> OperandStats:
    """Saturation, flush-to-zero and block-scale utilisation of quantizing the 2-D operand ``t``
    along its last dimension as a GEMM does (``key`` and ``hadamard`` as the layer passes them), or
    of ``quantized``, the quantization of ``t`` that the GEMM used. With 2-D blocks a block is a
    tile of ``spec.block_rows`` rows."""
    hadamard = rotation(hadamard)
    xt = t.float() if hadamard is None else hadamard_transform(t, 1, hadamard.size, hadamard.signs)
    M, K = xt.shape
    elem, f = spec.fmt.elem, spec.fmt
    B = spec.block or K
    Kp = -(-K // (spec.outer_block or B)) * (spec.outer_block or B)  # as the quantizer pads
    nb = Kp // B
    if quantized is None and spec.variant:  # quantized from t: MS-EDEN rotates it itself
        quantized = quantize(t, spec, axis=1, key=key, hadamard=hadamard)
    if quantized is not None:
        elements, scales = quantized.elements()[:, :K], quantized.scales
    else:
        elements, scales = _elements_and_scales(xt, spec, key)
    if Kp != K:
        xt = torch.nn.functional.pad(xt, (0, Kp - K))
        elements = torch.nn.functional.pad(elements, (0, Kp - K))
    xb, elements = xt.reshape(M, nb, B), elements.reshape(M, nb, B)
    # enc: what the quantizer multiplies a block by (as reference.quantize_reference computes it)
    if f.scale == "e8m0":
        assert scales is not None
        codes = scales.to(torch.int32)
        enc = torch.ldexp(torch.ones(codes.shape, device=xt.device), 127 - codes)  # 2^-E, exact
        finite = codes != 255
    elif spec.variant:
        assert quantized is not None and scales is not None
        enc = _variant_encode(quantized, xb)
        s8 = scales.view(torch.float8_e4m3fn).float()
        if spec.scale_rule is not None:  # a zero scale decodes to zeros, as below
            enc = torch.where(s8 == 0, 0.0, enc)
            elements = torch.where((s8 == 0).unsqueeze(-1), 0.0, elements)
        finite = scales != 0x7F
    else:
        genc, gdec, ok, _ = global_scales(xt, spec)
        genc_t = torch.tensor(genc, dtype=torch.float32, device=xt.device)
        if f.scale == "nv":
            assert scales is not None
            s8 = scales.view(torch.float8_e4m3fn).float()
            ones = torch.ones_like(s8)
            enc = torch.clamp(ones / (s8 * torch.tensor(gdec, device=xt.device)), max=F32_MAX)
            # a block whose E4M3 scale is 0 decodes to zeros whatever its element codes (its
            # factor is FLT_MAX, as in TransformerEngine): count it flushed, not saturated
            enc = torch.where(s8 == 0, 0.0, enc)
            elements = torch.where((s8 == 0).unsqueeze(-1), 0.0, elements)
            finite = (scales != 0x7F) & ok
        else:
            enc = genc_t.expand(M, nb)
            finite = torch.full((M, nb), ok, device=xt.device)
    ax = xb.abs()
    mul = enc * spec.prescale_factor  # (M, nb): what the quantizer multiplies each block by
    # |x| * mul in float32 is monotone in |x|: the block maximum after scaling is amax(|x|) * mul
    amax = ax.amax(-1) * mul
    used = finite & (amax > 0)
    tile_amax, tile_used = amax, used
    R = spec.block_rows
    if R > 1:  # a 2-D block's amax is its tile's: the maximum over its rows
        rows = -(-M // R) * R
        tile_amax = torch.nn.functional.pad(amax, (0, 0, 0, rows - M)).view(-1, R, nb).amax(1)
        tile_used = finite[::R] & (tile_amax > 0)
    real: torch.Tensor | None = None
    if Kp != K or not bool(finite.all()):  # leave out the padding and non-finite blocks
        real = (torch.arange(Kp, device=xt.device) < K).view(1, nb, B) & finite.unsqueeze(-1)
    clipping = finite & (amax > elem.max)  # only these blocks can hold a saturated element
    saturated = 0
    if bool(clipping.any()):
        sat = ax[clipping] * mul[clipping].unsqueeze(-1) > elem.max  # as the quantizer computes it
        saturated = _count(sat if real is None else sat & real[clipping])
    if real is None:
        n = M * K
        # a zero stays zero: the flushed elements are the output's zeros less the input's
        flushed = _count(elements == 0) - (_count(ax == 0) if bool(ax.amin() == 0) else 0)
    else:
        n = _count(real.expand(M, nb, B))
        flushed = _count((elements == 0) & (ax != 0) & real)
    return OperandStats(
        elements=n,
        saturated=saturated,
        flushed=flushed,
        blocks=_count(tile_used),
        util_sum=float(tile_amax[tile_used].double().sum()) / elem.max,
    )


def _count(mask: torch.Tensor) -> int:
    return int(mask.count_nonzero())


def _variant_encode(q: QTensor, xb: torch.Tensor) -> torch.Tensor:
    """(M, nb): what the quantizer of an NVFP4 variant multiplied each block of ``xb`` (M, nb, B)
    by before rounding: ``1 / (s * S_dec)`` for Four Over Six's chosen scale, ``1 / (o * s)`` for
    double-block scales, and for MS-EDEN ``1 / (s * s_dec)`` with its block scale before the
    correction (recomputed from the block maximum, as ``ms_eden.quantize_rotated`` computes it)."""
    assert q.scales is not None
    s8 = q.scales.view(torch.float8_e4m3fn).float()
    ones = torch.ones_like(s8)
    if q.outer_scales is not None:
        per = (q.spec.outer_block or 0) // q.spec.block
        prod = q.outer_scales.repeat_interleave(per, -1) * s8
        return torch.where(prod != 0, ones / prod, 0.0)
    assert q.global_dec is not None
    gdec = q.global_dec.to(device=s8.device, dtype=torch.float32)
    if q.spec.rounding == "eden":
        s8 = ms_eden.block_scale(xb.abs().amax(-1), gdec)
    return torch.clamp(ones / (s8 * gdec), max=F32_MAX)


def _elements_and_scales(
    xt: torch.Tensor, spec: QuantSpec, key: int | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The quantizer's element values (element units, (M, K)) and block scale codes ((M, nb), None
    for per-tensor formats) of the already transformed 2-D ``xt`` quantized along its last axis."""
    if ckernel.usable(xt) and spec.block_rows == 1:  # the kernel hands both over, not encoded
        elements, scales, _, _ = run_kernel(xt, spec, 1, key, torch.float32, elements=True)
        return elements, scales
    q = quantize(xt, spec, axis=1, key=key)
    return q.elements()[:, : xt.shape[1]], q.scales


@dataclass(slots=True)
class GemmProbe:
    """What ``probe_gemm`` finds for one GEMM of one layer."""

    metrics: dict[str, float]
    """``GEMM_METRICS``, ``REPEAT_METRICS`` and ``<operand>.<OPERAND_METRICS>``."""
    error: torch.Tensor
    """The error of draw 0 (what training computes), flattened float32: ``ErrorHistory``'s input."""
    exact: torch.Tensor
    """The exact output g, flattened float32."""
    alignments: list[float] = field(default_factory=list)
    """``align`` of each draw."""


def _dot(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.dot(x, y))  # float32 vectors: relative error ~1e-6 at these sizes


def _cos(x: torch.Tensor, y: torch.Tensor) -> float:
    nx, ny = _dot(x, x), _dot(y, y)
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return _dot(x, y) / math.sqrt(nx * ny)


def _gram_cos(gram: torch.Tensor, i: int, j: int) -> float:
    d = float(gram[i, i] * gram[j, j])
    return float(gram[i, j]) / math.sqrt(d) if d else float(gram[i, i] == gram[j, j])


def probe_gemm(
    layer: QuantLinear, calls: Sequence[GemmCall], draws: int, *, operands: bool = True
) -> GemmProbe:
    """Compare the quantized GEMM ``calls`` (all of one GEMM of ``layer``) with the exact GEMM on
    the same operands, over ``draws`` draws of the randomness (see the module docstring)."""
    if not calls:
        raise ValueError("probe_gemm: no calls to probe")
    if draws < 1:
        raise ValueError(f"draws: must be >= 1, got {draws}")
    gemm = calls[0].gemm
    if any(c.gemm != gemm for c in calls):
        raise ValueError("probe_gemm: calls of different GEMMs")
    # float32 vectors, float32 products (relative error ~1e-6 at these sizes, far below the
    # quantization error measured), float64 from there on
    exact = torch.cat([(c.a.float() @ c.b_exact.float().t()).flatten() for c in calls])
    q = torch.stack(
        [torch.cat([redraw(layer, c, r).float().flatten() for c in calls]) for r in range(draws)]
    )  # (draws, n)
    e = q - exact
    gram = (e @ e.t()).double()  # (draws, draws): every <e_r, e_s>
    gg = float(exact @ exact)
    qg = (q @ exact).double().tolist()
    qq = float(q[0] @ q[0])
    ee = gram.diagonal().tolist()
    align = [x / gg if gg else math.nan for x in qg]
    m: dict[str, float] = {
        "cos": qg[0] / math.sqrt(qq * gg) if qq and gg else float(qq == gg),
        "align": align[0],
        "rel_err": math.sqrt(ee[0] / gg) if gg else math.nan,
        "sqnr_db": 10 * math.log10(gg / ee[0]) if ee[0] and gg else math.inf,
    }
    mm = float(gram.sum()) / draws**2  # |mean error|^2
    g_norm = math.sqrt(gg) if gg else math.nan
    mean_norm = sum(math.sqrt(x) for x in ee) / draws
    m["bias"] = math.sqrt(mm) / g_norm
    m["noise"] = math.sqrt(max(sum(ee) / draws - mm, 0.0)) / g_norm
    m["bias_ratio"] = math.sqrt(mm) / mean_norm if mean_norm else 1.0
    if draws > 1:
        pairs = [_gram_cos(gram, i, j) for i in range(draws) for j in range(i + 1, draws)]
        m["draw_cos"] = sum(pairs) / len(pairs)
    elif not is_random(layer.recipe.gemm(gemm)):
        m["draw_cos"] = 1.0  # every draw is this one
    else:
        for k in REPEAT_METRICS:  # one draw of a random GEMM says nothing about its spread
            m.pop(k, None)
    if operands:
        for side, op in zip(("a", "b"), OPERANDS[gemm], strict=True):
            stats = gemm_operand_stats(layer, calls, side)
            if stats is not None:
                m.update({f"{op}.{k}": v for k, v in stats.metrics().items()})
    return GemmProbe(
        metrics=m, error=e[0].clone() if draws > 1 else e[0], exact=exact, alignments=align
    )


def gemm_operand_stats(
    layer: QuantLinear, calls: Sequence[GemmCall], side: str
) -> OperandStats | None:
    """``operand_stats`` of operand ``side`` ("a" or "b") summed over ``calls``; None when that
    operand stays in high precision."""
    gemm = calls[0].gemm
    g = layer.recipe.gemm(gemm)
    spec = g.a if side == "a" else g.b
    if spec is None:
        return None
    total = OperandStats()
    for c in calls:
        keys = layer.keys(gemm, c.call)
        rot = g.rotation(signs_of(layer, gemm, c.call))
        key = keys.a if side == "a" else keys.b
        if side == "b" and isinstance(c.b, QTensor):  # the shared 2-D quantization of W
            total.add(operand_stats(c.b_exact, spec, key, quantized=c.b))
        else:
            total.add(operand_stats(c.a if side == "a" else c.b_exact, spec, key, rot))
    return total


class ErrorHistory:
    """The error structure over probe steps: per (layer, GEMM) the errors of the last ``window``
    probes, all on the same probe batch (see the module docstring)."""

    def __init__(self, window: int) -> None:
        if window < 2:
            raise ValueError(f"window: must be >= 2, got {window}")
        self.window = window
        self._errors: dict[str, deque[torch.Tensor]] = {}
        self._perp: dict[str, torch.Tensor] = {}

    def update(
        self, key: str, error: torch.Tensor, exact: torch.Tensor | None = None
    ) -> dict[str, float]:
        """Add this probe's error for ``key``; returns ``step_cos`` once there is a previous one
        and ``sum_ratio`` once there are ``window``. With the exact output ``exact`` also
        ``step_cos_perp``: the cosine of the errors' parts orthogonal to their exact outputs (what
        is left once the error along g, a shrinkage or growth of the output, is taken out)."""
        past = self._errors.setdefault(key, deque(maxlen=self.window))
        if past and past[-1].shape != error.shape:
            raise ValueError(f"{key}: error shape changed ({past[-1].shape} -> {error.shape})")
        out: dict[str, float] = {}
        error = error.detach().float().flatten()
        if past:
            out["step_cos"] = _cos(error, past[-1])
        if exact is not None:
            g = exact.detach().float().flatten()
            gg = _dot(g, g)
            perp = error - (_dot(error, g) / gg) * g if gg else error
            if key in self._perp:
                out["step_cos_perp"] = _cos(perp, self._perp[key])
            self._perp[key] = perp
        past.append(error)
        if len(past) == self.window:
            total = float(torch.linalg.vector_norm(torch.stack(list(past)).sum(0)))
            norms = sum(float(torch.linalg.vector_norm(e)) for e in past)
            out["sum_ratio"] = total / norms if norms else 1.0
        return out
