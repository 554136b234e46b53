"""Four Over Six (``QuantSpec.scale_rule``) equals its two published references bit for bit: the
E4M3 block scales each block picks, the element values, the tensor amax and the choice itself, for
MSE, MAE and abs-max, 1x16 blocks and 16x16 tiles.

Two transcriptions, written here in torch from the sources' code (read, not imported):

- ``_fouroversix``: mit-han-lab/fouroversix at commit dadfad6901d473a734fe71e0b082e70ee993e23a,
  ``src/fouroversix/quantize/pytorch/reference.py``: ``quantize`` (nvfp4, RoundStyle.nearest, no
  Hadamard) -> ``nvfp4_fouroversix_block_scaled_quantization`` -> ``compute_nv_scale_factors``
  (``utils.py``: E2M1 max 6, NV scale bound 256 for the adaptive rules, scale expansion 1.5 for
  map-to-4), ``fake_quantize_to_e2m1`` and ``select_fouroversix``, with its ``torch.sum`` of the
  block errors as written;
- ``_te``: NVIDIA/TransformerEngine at commit d0067d0da6cb01811b8072a7d304f0e00344ce2b,
  ``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``:
  ``NVFP4QuantizerRef._quantize_blockwise_reference`` (its tensor scale with ``nvfp4_e4m3_max``
  256) -> ``_quantize_blockwise_4over6_reference`` (``cast_to_fp4x2``'s table, errors summed in
  element order, 2-D tiles summed by ``_sum_4over6_2d_error``).

The tensors hold ties (scaled values on E2M1 midpoints), all-zero blocks, blocks where map-to-4 and
map-to-6 err exactly alike, a NaN, and random heavy-tailed blocks. Where the sources differ from
each other or from E2M1 (see ``backends/quant/four_over_six.py``), the tests say so: blocks whose E4M3 scale
is 0 (fouroversix writes element zeros, TE saturated codes; both decode to 0), and fouroversix's
unclipped round-to-nearest, which only blocks far below the tensor maximum (subnormal E4M3 scales)
reach and which has a test of its own.
"""

from __future__ import annotations

import pytest
import torch
from quant_cases import spacing

from backends.quant import QuantSpec, fake_quantize, fake_quantize_fused, quantize, quantize_fused
from backends.quant.four_over_six import DEQ
from backends.quant.rng import derive_key

F32 = torch.float32
RULES = ("mse", "mae", "abs_max")


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------------------------------------
# fouroversix's PyTorch reference, transcribed


def _fouroversix_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``fake_quantize_to_e2m1`` with RoundStyle.nearest: no clipping (a 7 becomes 8)."""
    step1 = torch.round(2 * x.abs()) / 2
    step2 = torch.round(x.abs())
    step3 = 2 * torch.round(x.abs() / 2)
    mask1 = x.abs() < 2
    mask2 = x.abs() < 4
    return x.sign() * (step1 * mask1 + step2 * (~mask1) * mask2 + step3 * (~mask1) * (~mask2))


def _fouroversix(x: torch.Tensor, rule: str, block_2d: bool = False) -> dict[str, torch.Tensor]:
    """(element values, E4M3 scales, amax, pick-4) of fouroversix's reference ``quantize``, in
    x's layout: values (R, K), scales (R, K / 16) (one per tile row with 2-D blocks)."""
    R, K = x.shape
    amax = x.abs().max().float()
    if block_2d:
        blocks = x.reshape(-1, 16, K // 16, 16).permute(0, 2, 1, 3).reshape(-1, 256).float()
    else:
        blocks = x.reshape(-1, 16).float()

    def candidate(expansion: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        # compute_nv_scale_factors(fp4_format=nvfp4, scale_rule=rule, nearest): max value 6, max
        # scale 256, adjustment 1
        if amax == 0:
            hp = torch.zeros(blocks.shape[:-1], dtype=F32)
        else:
            encode = torch.tensor(6 * 256 * 1, dtype=F32) / amax
            hp = blocks.abs().max(axis=-1).values / torch.tensor(6 * 1, dtype=F32) * encode
        if expansion is not None:
            hp = hp * expansion
        s = hp.to(torch.float8_e4m3fn)
        decode = 1 / (torch.tensor(6 * 256 * 1, dtype=F32) / amax)
        scaled = torch.where(
            s.unsqueeze(1) != 0, blocks * (1 / (decode * s.to(F32).unsqueeze(1))), 0
        )
        return scaled, s

    scaled6, s6 = candidate(None)
    scaled4, s4 = candidate(1.5)
    # select_fouroversix
    fq6, fq4 = _fouroversix_e2m1(scaled6), _fouroversix_e2m1(scaled4)
    denom = torch.tensor(6 * 256 * 1, dtype=F32)
    deq6 = fq6.to(F32) * s6.unsqueeze(1).to(F32) * amax / denom
    deq4 = fq4.to(F32) * s4.unsqueeze(1).to(F32) * amax / denom
    if rule == "abs_max":
        err4 = (deq4 - blocks).abs().max(axis=-1).values
        err6 = (deq6 - blocks).abs().max(axis=-1).values
    elif rule == "mae":
        err4 = (deq4 - blocks).abs().sum(axis=-1)
        err6 = (deq6 - blocks).abs().sum(axis=-1)
    else:
        err4 = ((deq4 - blocks) ** 2).sum(axis=-1)
        err6 = ((deq6 - blocks) ** 2).sum(axis=-1)
    select4 = (err4 < err6).unsqueeze(1)
    fq = torch.where(select4, fq4, fq6)
    s = torch.where(select4, s4.reshape(-1, 1), s6.reshape(-1, 1))
    if block_2d:  # back to x's layout; a tile's scale on each of its 16 rows
        fq = fq.reshape(-1, K // 16, 16, 16).permute(0, 2, 1, 3).reshape(R, K)
        s = s.reshape(R // 16, 1, K // 16).expand(R // 16, 16, K // 16).reshape(R, K // 16)
        pick = select4.reshape(R // 16, 1, K // 16).expand(R // 16, 16, K // 16).reshape(R, -1)
    else:
        fq, s, pick = fq.reshape(R, K), s.reshape(R, K // 16), select4.reshape(R, K // 16)
    return {"values": fq, "scales": s.view(torch.uint8), "amax": amax, "pick4": pick}


# ----------------------------------------------------------------------------------------------
# TransformerEngine's 4over6 reference, transcribed


def _te_e2m1(v: torch.Tensor) -> torch.Tensor:
    """``cast_to_fp4x2``'s table (ties to the even code) as values, on v clipped to [-6, 6]."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    m = v.abs()
    code = torch.full(v.shape, 7)
    edges = [(0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False)]
    edges += [(5.0, True)]
    for c, (t, inclusive) in reversed(list(enumerate(edges))):
        code = torch.where((m <= t) if inclusive else (m < t), c, code)
    return torch.where(v < 0, -grid[code], grid[code])


def _te(x: torch.Tensor, rule: str, tile_rows: int = 1) -> dict[str, torch.Tensor]:
    """TE's ``_quantize_blockwise_reference`` with ``nvfp4_use_4over6``, ``nvfp4_e4m3_max`` 256 and
    err mode ``rule`` (MAE or MSE), not fast math: element values, scales, pick-4."""
    m, n = x.shape
    f6 = torch.tensor(6.0, dtype=F32)
    f448 = torch.tensor(448.0, dtype=F32)
    f256 = torch.tensor(256.0, dtype=F32)
    if tile_rows == 16:
        tiles = x.unfold(0, 16, 16).unfold(1, 16, 16).to(F32)
        vec_max = tiles.abs().amax(dim=(-1, -2)).repeat_interleave(16, dim=0).unsqueeze(-1)
    else:
        vec_max = x.view(m, n // 16, 16).abs().amax(dim=-1, keepdim=True).to(F32)
    xb = x.view(m, n // 16, 16)
    global_amax = x.abs().max().float()
    genc = torch.div(f256 * f6, global_amax)
    genc = torch.min(genc, torch.tensor(torch.finfo(F32).max))
    if genc == torch.tensor(0.0):
        genc = torch.tensor(1.0)
    gdec = torch.div(1.0, genc)
    # _quantize_blockwise_4over6_reference
    base = torch.div(vec_max, f6) * genc
    d4 = torch.clamp(base * 1.5, min=-f448, max=f448).to(torch.float8_e4m3fn)
    d6 = torch.clamp(base, min=-f448, max=f448).to(torch.float8_e4m3fn)
    fmax = torch.tensor(torch.finfo(F32).max)
    e4 = torch.min(torch.div(1.0, d4.to(F32) * gdec), fmax)
    e6 = torch.min(torch.div(1.0, d6.to(F32) * gdec), fmax)
    q4 = _te_e2m1(torch.clamp(xb.to(F32) * e4, -f6, f6))
    q6 = _te_e2m1(torch.clamp(xb.to(F32) * e6, -f6, f6))
    err4 = torch.zeros_like(vec_max)
    err6 = torch.zeros_like(vec_max)
    denom = f6 * f256
    sf4, sf6 = d4.to(F32).squeeze(-1), d6.to(F32).squeeze(-1)
    xf = xb.to(F32)
    for idx in range(16):
        v4 = q4[:, :, idx] * sf4
        v4 = v4 * global_amax
        v4 = v4 / denom
        d = v4 - xf[:, :, idx]
        err4 = err4 + ((d * d) if rule == "mse" else torch.abs(d)).unsqueeze(-1)
        v6 = q6[:, :, idx] * sf6
        v6 = v6 * global_amax
        v6 = v6 / denom
        d = v6 - xf[:, :, idx]
        err6 = err6 + ((d * d) if rule == "mse" else torch.abs(d)).unsqueeze(-1)
    if tile_rows == 1:
        pick4 = err4 < err6
    else:

        def tree(err: torch.Tensor) -> torch.Tensor:  # _sum_4over6_2d_error
            rows = err.view(err.shape[0] // 16, 16, err.shape[1], 1).squeeze(-1)
            rows = rows[:, 0:8, :] + rows[:, 8:16, :]
            rows = rows[:, 0:4, :] + rows[:, 4:8, :]
            rows = rows[:, 0:2, :] + rows[:, 2:4, :]
            return (rows[:, 0, :] + rows[:, 1, :]).unsqueeze(-1)

        pick4 = (tree(err4) < tree(err6)).repeat_interleave(16, dim=0)
    q = torch.where(pick4, q4, q6).reshape(m, n)
    s = torch.where(pick4, d4, d6).squeeze(-1)
    return {"values": q, "scales": s.view(torch.uint8), "amax": global_amax}


# ----------------------------------------------------------------------------------------------
# the tensors


def _blocks_with_cases(rows: int = 32, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """Random heavy-tailed blocks (block maxima from 2^-8 to 2^0 of the tensor's) and, in the first
    rows, the hand-made cases. The tensor amax is 1536, so S_enc = 1 and a block whose maximum
    is 6 * 2^k gets the exact scales 2^k (map-to-6) and 1.5 * 2^k (map-to-4)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(-8 * torch.rand(rows, cols // 16, 1, generator=g))
    x = (torch.randn(rows, cols // 16, 16, generator=g) * mag).reshape(rows, cols)
    x = x / x.abs().amax() * 1000.0
    x[0, 0] = 1536.0  # the tensor amax
    x[0, 16:32] = 0.0  # an all-zero block
    x[1, :] = 0.0
    u = 2.0**4  # S_enc = 1: a block maximum 6u gets the exact scales u and 1.5u
    # ties: 5 and -2.5 (x u) are E2M1 midpoints under map-to-6 (round to even: 4, -2)
    x[1, :16] = torch.tensor([6.0, 5.0, -2.5] + [1.0] * 13) * u
    # errors tie: 6 and 5.25 err 0 and 0.75 under either scale (5.25 -> 6 under map-to-6; under
    # map-to-4 5.25 / 1.5 rounds to 4, which decodes to 6 again): a tie keeps map-to-6
    x[1, 16], x[1, 17] = 6 * u, 5.25 * u
    x[1, 32], x[1, 33] = 6 * u, 6 * u  # exact under both (error 0 each): map-to-6
    x[1, 48], x[1, 49], x[1, 50] = 6 * u, 4.5 * u, -2.25 * u  # on map-to-4's grid only
    # maximum 4u: map-to-4's scale is exactly u, and these are its midpoints (ties to even)
    x[1, 64:74] = torch.tensor([4, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -0.25, -2.5, -3.5]) * u
    return x


def _assert_same(got_q, ref: dict[str, torch.Tensor], where_scale_zero_differs: bool) -> None:
    got_scales = got_q.scales
    # E4M3's NaN: 0x7F here, 0xFF where torch converts a NaN (its sign bit set)
    theirs_scales = torch.where(ref["scales"] == 0xFF, 0x7F, ref["scales"]).to(torch.uint8)
    assert torch.equal(got_scales, theirs_scales), "E4M3 block scales differ"
    ga, ra = float(got_q.global_amax), float(ref["amax"])
    assert ga == ra or (ga != ga and ra != ra)  # equal, or both NaN
    ours = got_q.elements()[:, : ref["values"].shape[1]]
    # E2M1 has no NaN: a NaN block's elements are NaN through its scale code
    ours = torch.where((got_scales == 0x7F).repeat_interleave(16, -1), torch.nan, ours)
    theirs = ref["values"]
    if where_scale_zero_differs:  # fouroversix: elements of a zero-scale block are 0
        zero = (got_scales == 0).repeat_interleave(16, -1)
        ours = torch.where(zero, 0.0, ours)
    both_nan = ours.isnan() & theirs.isnan()
    assert torch.equal(torch.where(both_nan, 0.0, ours), torch.where(both_nan, 0.0, theirs))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("seed", [0, 1])
def test_1x16_blocks_equal_fouroversix_bit_for_bit(rule, seed):
    x = _blocks_with_cases(seed=seed)
    ref = _fouroversix(x, rule)
    q = quantize(x, QuantSpec(format="nvfp4", scale_rule=rule))
    _assert_same(q, ref, where_scale_zero_differs=True)
    # and not vacuously: both choices occur, and the hand-made cases come out as worked out
    picks = ref["pick4"]
    assert 0.05 < float(picks.float().mean()) < 0.95
    assert picks[1, 1:4].tolist() == [False, False, True]  # error tie, exact tie, 4's grid
    if rule == "mae":  # map-to-6, its midpoints rounded to even
        assert not bool(picks[1, 0]) and ref["values"][1, :3].tolist() == [6, 4, -2]
    if rule == "abs_max":  # map-to-4 with the exact scale 16, its midpoints rounded to even
        assert bool(picks[1, 4]) and int(ref["scales"][1, 4]) == 0x58  # E4M3 16.0
        assert ref["values"][1, 64:74].tolist() == [4, 0, 1, 1, 2, 2, 4, -0.0, -2, -4]


@pytest.mark.parametrize("rule", RULES)
def test_16x16_tiles_equal_fouroversix_bit_for_bit(rule):
    x = _blocks_with_cases(48, 128, seed=2)
    ref = _fouroversix(x, rule, block_2d=True)
    q = quantize(x, QuantSpec(format="nvfp4", scale_rule=rule, block_rows=16))
    _assert_same(q, ref, where_scale_zero_differs=True)


@pytest.mark.parametrize("rule", ["mse", "mae"])
@pytest.mark.parametrize("rows", [1, 16])
def test_equals_transformer_engines_4over6_bit_for_bit(rule, rows):
    x = _blocks_with_cases(48, 128, seed=3)
    ref = _te(x, rule, rows)
    q = quantize(x, QuantSpec(format="nvfp4", scale_rule=rule, block_rows=rows))
    _assert_same(q, ref, where_scale_zero_differs=False)  # TE keeps the saturated codes too


@pytest.mark.parametrize("rule", RULES)
def test_a_nan_makes_the_tensor_nan_as_in_fouroversix(rule):
    x = _blocks_with_cases(16, 128, seed=4)
    x[3, 5] = torch.nan
    ref = _fouroversix(x, rule)
    assert bool((ref["scales"] == 0xFF).all()) and bool(ref["values"].isnan().all())
    q = quantize(x, QuantSpec(format="nvfp4", scale_rule=rule))
    _assert_same(q, ref, where_scale_zero_differs=True)
    assert bool(fake_quantize(x, QuantSpec(format="nvfp4", scale_rule=rule)).isnan().all())


def test_an_all_zero_tensor_quantizes_to_zeros():
    x = torch.zeros(4, 32)
    for rule in RULES:
        ref = _fouroversix(x, rule)
        q = quantize(x, QuantSpec(format="nvfp4", scale_rule=rule))
        _assert_same(q, ref, where_scale_zero_differs=True)
        assert bool((q.dequantize() == 0).all())


def test_fouroversix_rounds_past_six_where_a_tiny_block_has_a_subnormal_scale():
    # a block 1e-5 of the tensor maximum: its map-to-6 scale (amax_b / 6) * 1536 / amax = 2.6e-3
    # is subnormal in E4M3 and rounds down to 2^-9 (code 1), so its maximum scales to about 7.8:
    # fouroversix's round-to-nearest makes that 8, which E2M1 cannot hold, and picks map-to-6 for
    # its (understated) error; here the 7.8 saturates at 6, as TransformerEngine's reference
    # clips it, and both then pick map-to-4 (scale 2^-8, code 2).
    x = torch.zeros(2, 32)
    x[0, 0] = 1536.0
    x[1, :2] = torch.tensor([1536.0 * 1.02e-5, 1536.0 * 0.3e-5])
    ref = _fouroversix(x, "mse")
    assert ref["values"][1, :2].tolist() == [8.0, 2.0] and int(ref["scales"][1, 0]) == 1
    q = quantize(x, QuantSpec(format="nvfp4", scale_rule="mse"))
    _assert_same(q, _te(x, "mse"), where_scale_zero_differs=False)
    assert q.elements()[1, :2].tolist() == [4.0, 1.0] and int(q.scales[1, 0]) == 2


def test_values_decode_with_the_4over6_bound():
    x = _blocks_with_cases(16, 128, seed=5)
    spec = QuantSpec(format="nvfp4", scale_rule="mse")
    q = quantize(x, spec)
    s8 = q.scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, -1)
    assert q.global_amax is not None
    want = q.elements() * ((s8 * q.global_amax) * DEQ)
    assert torch.equal(q.dequantize(), want)
    assert torch.equal(fake_quantize(x, spec), want)
    assert float(torch.tensor(1.0) / torch.tensor(1536.0)) == DEQ


def test_four_over_six_errs_less_than_plain_nvfp4():
    x = _blocks_with_cases(64, 256, seed=6)
    plain = fake_quantize(x, QuantSpec(format="nvfp4"))
    for rule in ("mse", "mae"):
        err46 = (fake_quantize(x, QuantSpec(format="nvfp4", scale_rule=rule)) - x).norm()
        assert float(err46) < float((plain - x).norm())


def test_stochastic_rounding_uses_one_stream_for_both_candidates():
    # with SR the candidates are rounded with the same uniforms, so a draw is a pure function of
    # the key; the two neighbours of each scaled value are the only outcomes of either candidate
    x = _blocks_with_cases(16, 128, seed=7)
    spec = QuantSpec(format="nvfp4", scale_rule="mse", rounding="sr", prescale=16 / 17)
    a, b = quantize(x, spec, key=11), quantize(x, spec, key=11)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)
    c = quantize(x, spec, key=12)
    assert not torch.equal(a.codes, c.codes)
    assert spec.short() == "nvfp4/4o6mse/sr*0.9412"


@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 16])
def test_compiled_path_equals_fouroversix(rows):
    # test_variants' shape: rows=1 is its 4o6mse variant, one compile for both (Inductor's cache)
    x = _blocks_with_cases(32, 256, seed=8)
    spec = QuantSpec(format="nvfp4", scale_rule="mse", block_rows=rows)
    _assert_same(
        quantize_fused(x, spec, compile=True),
        _fouroversix(x, "mse", block_2d=rows == 16),
        where_scale_zero_differs=True,
    )
    assert torch.equal(fake_quantize_fused(x, spec, compile=True), fake_quantize(x, spec))


def test_scale_pick_nearest_is_unbiased_and_the_recipes_rounded_pick_is_not():
    # As test_quant's test_sr_is_unbiased: with n draws of a value between grid points D apart,
    # the mean has std <= D / (2 sqrt n). With scale_pick nearest the block scale does not depend
    # on the draws (the same for every key), so D is fixed, and each element's mean over n = 1000
    # keys must lie within 5 such bounds of x * 16/17. Compared as they round (the recipe's
    # rounded), the scale follows the draws and the mean is off by many bounds for some elements.

    n = 1000
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(11))
    rounded = QuantSpec(format="nvfp4", scale_rule="mse", rounding="sr", prescale=16 / 17)
    nearest = QuantSpec(
        format="nvfp4", scale_rule="mse", rounding="sr", prescale=16 / 17, scale_pick="nearest"
    )
    q = quantize(x, nearest, key=1)
    assert torch.equal(q.scales, quantize(x, nearest, key=2).scales)  # no draw moves the scale
    d = q.nv_block_decode().double().repeat_interleave(16, -1)  # per element, float64
    target = x.double() * (16 / 17)
    bound = 5 * spacing(target / d, "nvfp4") * d / (2 * n**0.5) + 1e-6 * x.double().abs()

    def mean(spec: QuantSpec) -> torch.Tensor:
        acc = torch.zeros_like(target)
        for step in range(n):
            acc += fake_quantize(x, spec, key=derive_key(3, step), out_dtype=F32).double()
        return acc / n

    err = (mean(nearest) - target).abs()
    assert bool((err <= bound).all()), f"worst: {float((err / bound).max()):.2f} bounds"
    biased = (mean(rounded) - target).abs() > bound
    assert int(biased.sum()) >= 8, int(biased.sum())  # 15 of 1,024 here; unbiased: none


def test_scale_pick_is_checked_and_labelled():
    with pytest.raises(ValueError, match="scale_pick: chooses between Four Over Six's two scales"):
        QuantSpec(format="nvfp4", scale_pick="nearest")
    with pytest.raises(ValueError, match="scale_pick: unknown 'best'; allowed: rounded, nearest"):
        QuantSpec(format="nvfp4", scale_rule="mse", scale_pick="best")
    spec = QuantSpec(format="nvfp4", scale_rule="mse", rounding="sr", scale_pick="nearest")
    assert spec.short() == "nvfp4/4o6mse-nearest/sr"
    # round to nearest: the two picks are the same quantizer
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    rne = QuantSpec(format="nvfp4", scale_rule="mae")
    assert torch.equal(
        fake_quantize(x, rne),
        fake_quantize(x, QuantSpec(format="nvfp4", scale_rule="mae", scale_pick="nearest")),
    )
