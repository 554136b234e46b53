"""MS-EDEN (``rounding: eden``) equals Quartet II's kernel bit for bit and is unbiased.

``_quartet_ii`` transcribes ``eden_1x16s_fp4_kernel`` of IST-DASLab/Quartet-II at commit
8776a90b7aa0c0a400ad858a3c05a66f7ec55b73 (``src/models/quantization/schemes/quartet_2.py``, the
backward quantizer of ``Quartet_II_fn``: ``scale_override = (17/16) * 0.93``, group size 16) in
torch float32, from the rotated tensor on (the rotation is ``hadamard_transform``'s, tested in
``test_hadamard.py``). Three things the kernel leaves to its compiler or its generator are fixed
here and given to both sides alike: the uniforms of the scales' stochastic rounding (``tl.rand``:
here ``rng.uniform24``), the order of ``tl.sum`` (a pairwise tree) and the division (Triton's
``/`` is approximate on GPUs; here IEEE). The inputs hold an all-zero rotation group (its
correction's denominator is 0), all-zero blocks inside a group, scales that round to 0, a NaN,
and random heavy-tailed groups; ties of the element rounding are worked by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from backends.quant import QuantSpec, fake_quantize, hadamard_transform, quantize, sign_vector
from backends.quant.ms_eden import VAL_MAX, quantize_rotated
from backends.quant.rng import derive_key, uniform24
from backends.recipes import GemmRecipe, HadamardSpec

F32 = torch.float32
G = 128


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _tree(t: torch.Tensor) -> torch.Tensor:
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = t[..., :h] + t[..., h:]
    return t[..., :1]


def _quartet_ii(x_had: torch.Tensor, u: torch.Tensor) -> dict[str, torch.Tensor]:
    """``eden_1x16s_fp4_kernel`` from ``x_had`` on, hadamard_dim G, group_size 16, ``u`` one
    uniform per 16-block in place of ``tl.rand``."""
    scale_override = (17 / 16) * 0.93
    scales_max = torch.tensor(255.99, dtype=F32)  # a Python constant: float32 in the kernel
    val_max = torch.tensor(6.0 / scale_override, dtype=F32)
    amax = x_had.abs().max().float()
    s_dec = torch.where(amax == 0.0, torch.tensor(1.0), amax / scales_max / val_max)
    x_grouped = x_had.reshape(-1, 16).float()
    s_dec_b = x_grouped.abs().amax(-1, keepdim=True) / val_max
    s_e4m3 = (s_dec_b / s_dec).to(torch.float8_e4m3fn).to(F32)
    s_e4m3 = torch.where(s_e4m3 == 0, torch.tensor(1.0), s_e4m3)
    x_scaled = x_grouped / (s_e4m3 * s_dec)
    a = x_scaled.abs()
    sign = torch.where(x_scaled > 0, 1.0, -1.0)
    mag = torch.where(
        a >= 5,
        6.0,
        torch.where(
            a >= 3.5,
            4.0,
            torch.where(
                a >= 2.5,
                3.0,
                torch.where(
                    a >= 1.75,
                    2.0,
                    torch.where(
                        a >= 1.25,
                        1.5,
                        torch.where(a >= 0.75, 1.0, torch.where(a >= 0.25, 0.5, 0.0)),
                    ),
                ),
            ),
        ),
    )
    x_fp4 = mag * sign
    xs_g, q_g = x_scaled.reshape(-1, G), x_fp4.reshape(-1, G)
    num = _tree(xs_g * xs_g)
    denom = _tree(xs_g * q_g)
    correction = torch.where(denom == 0.0, torch.tensor(1.0), num / denom)
    scales = s_e4m3.reshape(-1, G // 16)
    corrected = (scales * correction).reshape(-1, 1)
    bits = corrected.to(torch.float8_e4m3fn).view(torch.uint8)
    prevscale = (bits - 1).view(torch.float8_e4m3fn).to(F32)
    currscale = bits.view(torch.float8_e4m3fn).to(F32)
    nextscale = (bits + 1).view(torch.float8_e4m3fn).to(F32)
    up = torch.where(currscale > corrected, currscale, nextscale)
    down = torch.where(currscale > corrected, prevscale, currscale)
    prob_up = (corrected - down) / (up - down)
    scales = torch.where(u.reshape(-1, 1) < prob_up, up, down)
    x_dequantized = x_fp4 * scales * s_dec
    return {
        "q": x_fp4.reshape(x_had.shape),
        "scales": scales.reshape(*x_had.shape[:-1], -1),
        "s_dec": s_dec,
        "values": x_dequantized.reshape(x_had.shape),
        "corrected": corrected.reshape(*x_had.shape[:-1], -1),
    }


def _rotated_cases(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 512, generator=g) * torch.exp(2 * torch.randn(6, 32, 1, generator=g)).repeat(
        1, 1, 16
    ).reshape(6, 512)
    x[0, :G] = 0.0  # an all-zero rotation group: correction 0 / 0 -> 1, scale 1
    x[1, 16:48] = 0.0  # zero blocks inside a group
    x[2, 64:80] = 1e-9  # a block whose scale rounds to 0 (then 1, and its elements to 0)
    return x


def _same_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    nan = a.isnan() & b.isnan()
    return torch.equal(torch.where(nan, 0.0, a), torch.where(nan, 0.0, b))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_quartet_ii_kernel_bit_for_bit(seed):
    x = _rotated_cases(seed)
    key = derive_key(5, seed)
    u = uniform24(key, torch.arange(x.numel() // 16))
    ref = _quartet_ii(x, u)
    q, s, s_dec, _ = quantize_rotated(x, G, key)
    assert float(s_dec) == float(ref["s_dec"])
    assert torch.equal(s, ref["scales"]), "rounded E4M3 scales differ"
    # values: the same grid points (the sign of a zero: the kernel's is -1 for x <= 0)
    assert torch.equal(q, ref["q"])
    # dequantized: the kernel's (q * s) * s_dec and this project's q * (s * s_dec) agree to an ulp
    ours = q.reshape(-1, 16) * (s.reshape(-1, 1) * s_dec)
    assert torch.allclose(ours.reshape(x.shape), ref["values"], rtol=2**-23, atol=0)
    # and not vacuously: corrections other than 1, and scales the rounding took away from the
    # nearest E4M3 value as well as to it
    t = ref["corrected"]
    assert float((t != ref["corrected"].to(torch.float8_e4m3fn).float()).float().mean()) > 0.9
    nearest = t.to(torch.float8_e4m3fn).float()
    far = s != nearest
    assert 0.1 < float(far.float().mean()) < 0.9


def test_stochastic_scales_go_up_with_the_probability_of_their_distance():
    # one block's corrected scale t lies between two E4M3 values: over many keys the fraction
    # rounded up is (t - down) / (up - down) within 4 standard deviations
    x = _rotated_cases(3)
    keys = [derive_key(6, k) for k in range(400)]
    draws = torch.stack([quantize_rotated(x, G, k)[1] for k in keys])  # (n, rows, nb)
    lo, hi = draws.amin(0), draws.amax(0)
    assert bool(((draws == lo) | (draws == hi)).all())  # two neighbours at most
    split = lo != hi
    assert int(split.sum()) > 100
    frac = (draws == hi).float().mean(0)[split]
    mean_scale = draws.double().mean(0)[split]
    # E[s] = t: the mean of the draws is the corrected scale, so lo + frac * (hi - lo) == mean
    p = (mean_scale - lo[split].double()) / (hi[split] - lo[split]).double()
    assert torch.allclose(p.float(), frac, atol=1e-6)
    assert 0.2 < float(frac.mean()) < 0.8


def test_ties_round_away_from_zero():
    # Quartet II's table: 0.25 -> 0.5, 0.75 -> 1, 1.25 -> 1.5, 1.75 -> 2, 2.5 -> 3, 3.5 -> 4,
    # 5 -> 6 (round-half-to-even would give 0, 1, 1, 2, 2, 4, 4), and everything past 5 -> 6
    from backends.quant.ms_eden import _rtn

    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 0.24, -0.25, -5.0, 0.0])
    assert _rtn(v).tolist() == [0.5, 1, 1.5, 2, 3, 4, 6, 6, 0, -0.5, -6, 0]


def test_a_nan_makes_the_tensor_nan():
    x = _rotated_cases(4)
    x[3, 7] = torch.nan
    q, s, _, amax = quantize_rotated(x, G, 1)
    assert bool(q.isnan().all()) and bool(s.isnan().all()) and bool(amax.isnan())
    ref = _quartet_ii(x, uniform24(1, torch.arange(x.numel() // 16)))
    assert bool(ref["values"].isnan().all())  # the kernel's too (its amax is NaN)


def test_quantize_rotates_then_corrects_over_the_hadamard_group():
    x = _rotated_cases(5)
    signs = sign_vector(G, 123)
    spec = QuantSpec(format="nvfp4", rounding="eden")
    qt = quantize(x, spec, key=9, hadamard=(G, signs))
    q, s, s_dec, amax = quantize_rotated(hadamard_transform(x, 1, G, signs), G, 9)
    assert torch.equal(qt.elements(), q) and float(qt.global_dec) == float(s_dec)
    assert torch.equal(qt.scales.view(torch.float8_e4m3fn).float(), s)
    assert float(qt.global_amax) == float(amax)
    v = fake_quantize(x, spec, key=9, hadamard=(G, signs), out_dtype=torch.float32)
    assert torch.equal(v, qt.dequantize())
    assert torch.equal(v, (q.reshape(-1, 16) * (s.reshape(-1, 1) * s_dec)).reshape(v.shape))


def test_eden_needs_a_hadamard_and_nvfp4():
    spec = QuantSpec(format="nvfp4", rounding="eden")
    with pytest.raises(ValueError, match="hadamard: rounding eden"):
        GemmRecipe(a=spec, b=spec)
    GemmRecipe(a=spec, b=spec, hadamard=HadamardSpec(size=128, signs="random"))
    with pytest.raises(ValueError, match="hadamard=.size, signs."):
        quantize(torch.ones(2, 32), spec)
    with pytest.raises(ValueError, match="rounding: eden .MS-EDEN. rounds E4M3 block scales"):
        QuantSpec(format="mxfp4", rounding="eden")
    with pytest.raises(ValueError, match="takes no prescale"):
        QuantSpec(format="nvfp4", rounding="eden", prescale=True)


def _inverse(v: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """x from its rotation (x * signs) H / sqrt(G) (H symmetric and orthogonal)."""
    return hadamard_transform(v, 1, G, None) * signs.repeat(v.shape[1] // G)


def test_ms_eden_is_unbiased_over_random_rotations():
    # The claim of MS-EDEN: over the random Hadamard signs and the scales' stochastic rounding,
    # the rotated-back estimate's mean is x. As test_quant's SR tests do per element, each of the
    # 1024 means over n = 1000 draws (fixed keys: deterministic) must lie within 5 standard errors
    # of x (here estimated from the draws: an MS-EDEN error has no simple bound), and their
    # squared z-scores average about 1. Not vacuous: round-to-nearest with the same rotations,
    # without the correction, is detectably biased (mean z^2 well above 1).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 256, generator=g) * torch.exp(torch.randn(4, 256, generator=g))
    n = 1000

    def zscores(spec: QuantSpec) -> torch.Tensor:
        acc = torch.zeros_like(x, dtype=torch.float64)
        acc2 = torch.zeros_like(acc)
        for k in range(n):
            s = sign_vector(G, derive_key(9, k))
            v = fake_quantize(x, spec, key=derive_key(7, k), hadamard=(G, s), out_dtype=F32)
            e = _inverse(v, s).double()
            acc += e
            acc2 += e * e
        mean = acc / n
        se = ((acc2 / n - mean * mean).clamp(min=0) / n).sqrt()
        return (mean - x.double()) / se

    z = zscores(QuantSpec(format="nvfp4", rounding="eden"))
    assert float(z.abs().max()) < 5.0, f"worst: {float(z.abs().max()):.2f} standard errors"
    assert float((z * z).mean()) < 1.5
    z_rtn = zscores(QuantSpec(format="nvfp4"))
    assert float((z_rtn * z_rtn).mean()) > 2.0
    assert VAL_MAX > 6.0 and math.isclose(VAL_MAX, 6 / 0.988125, rel_tol=1e-7)
