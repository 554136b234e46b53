"""Counter-based random streams (``backends.quant.rng``): key derivation and uniform draws."""

from __future__ import annotations

import pytest
import torch

from backends.quant.rng import (
    GEMM_IDS,
    OPERAND_IDS,
    PHI,
    derive_key,
    extend_key,
    mix32,
    random_bits,
    uniform24,
)

BASE = (1234, 3, GEMM_IDS["wgrad"], OPERAND_IDS["dy"], 10)  # seed, layer, gemm, operand, step


def test_derive_key_is_deterministic_and_32_bit():
    k = derive_key(*BASE)
    assert k == derive_key(*BASE)
    assert 0 <= k < 2**32


@pytest.mark.parametrize("part", range(len(BASE)), ids=["seed", "layer", "gemm", "operand", "step"])
@pytest.mark.parametrize("delta", [1, 2**32], ids=["+1", "+2^32"])
def test_derive_key_changes_with_each_part(part, delta):
    changed = list(BASE)
    changed[part] += delta  # also a change above bit 32 only
    assert derive_key(*changed) != derive_key(*BASE)


def test_derive_key_depends_on_order_and_count_of_parts():
    assert derive_key(1, 2) != derive_key(2, 1)
    assert derive_key(0) != derive_key(0, 0)
    assert derive_key() != derive_key(0)


def test_derive_key_has_no_collisions_over_a_grid_of_steps_and_layers():
    keys = {derive_key(0, layer, g, o, step) for layer in range(8) for g in (1, 2, 3)
            for o in (1, 2, 3) for step in range(20)}  # fmt: skip
    assert len(keys) == 8 * 3 * 3 * 20


@pytest.mark.parametrize("bad", [-1, -(2**40)])
def test_derive_key_rejects_negative_parts(bad):
    with pytest.raises(ValueError, match="non-negative"):
        derive_key(1, bad, 2)


def test_mix32_matches_the_lowbias32_reference_values():
    # lowbias32 (hash-prospector): x ^= x>>16; x *= 0x21f0aaad; x ^= x>>15; x *= 0x735a2d97; x ^= x>>15
    def lowbias32(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x21F0AAAD) % 2**32
        x ^= x >> 15
        x = (x * 0x735A2D97) % 2**32
        return x ^ (x >> 15)

    for x in (0, 1, 0xDEADBEEF, 2**32 - 1, 12345):
        assert mix32(x) == lowbias32(x)


def test_random_bits_tensor_hash_equals_the_integer_hash():
    key = derive_key(*BASE)
    idx = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 7, 2**40 + 3])
    got = random_bits(key, idx).tolist()
    expected = [mix32(mix32(mix32((i & 0xFFFFFFFF) ^ PHI) ^ (i >> 32)) ^ key) for i in idx.tolist()]
    assert got == expected


def test_uniform24_is_in_unit_interval_on_the_2_pow_minus_24_grid():
    u = uniform24(derive_key(*BASE), torch.arange(1 << 16))
    assert u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    scaled = u.double() * 2**24
    assert torch.equal(scaled, scaled.floor())


def test_uniform24_is_roughly_uniform():
    # Chi-square over 16 equal bins, N = 65536 draws: 15 degrees of freedom, whose 99.9th percentile
    # is 37.70; a fixed key makes the statistic deterministic, so this bound is a real property check.
    n, bins = 1 << 16, 16
    u = uniform24(derive_key(*BASE), torch.arange(n))
    counts = torch.bincount((u * bins).long(), minlength=bins).double()
    expected = n / bins
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 37.70
    assert abs(float(u.double().mean()) - 0.5) < 5 * (1 / 12) ** 0.5 / n**0.5  # 5 sigma


def test_uniform24_streams_of_neighbouring_keys_are_uncorrelated():
    n = 1 << 14
    idx = torch.arange(n)
    a = uniform24(derive_key(0, 0, 1, 1, 0), idx).double()
    b = uniform24(derive_key(0, 0, 1, 1, 1), idx).double()
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    assert abs(corr) < 5 / n**0.5  # 5 sigma of the null distribution of the sample correlation
    assert int((a == b).sum()) < 5


def test_uniform24_depends_on_the_high_index_bits():
    key = derive_key(*BASE)
    lo = uniform24(key, torch.arange(64))
    hi = uniform24(key, torch.arange(64) + 2**32)
    assert int((lo == hi).sum()) < 3


def test_uniform24_is_reproducible_per_key_and_index():
    idx = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    key = derive_key(*BASE)
    full = uniform24(key, torch.arange(1000))
    assert torch.equal(uniform24(key, idx), full[idx])  # a pure function of (key, index)


# ``random_bits`` widens any index dtype to int64 before hashing (narrower types would overflow).
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8], ids=str)
def test_uniform24_is_equal_across_cpu_index_dtypes(dtype):
    key = derive_key(*BASE)
    idx = torch.arange(200)
    assert torch.equal(uniform24(key, idx.to(dtype)), uniform24(key, idx))


# --- independence of the streams of two keys ---------------------------------------------------
#
# Two keys' streams must be independent draws, not the same numbers in another order. A 32-bit
# draw from n indices under each of two keys shares about n^2 / 2^32 values by chance (16 for
# n = 2^18, sd 4); a stream that is another key's permuted within the operand shares all n.

N = 1 << 18


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def _xor_keyed(key: int, index: torch.Tensor) -> torch.Tensor:
    """The streams of numerics 1, the key XORed into the index: what these tests must catch."""
    return _mix32(_mix32((index & 0xFFFFFFFF) ^ key) ^ (index >> 32))


def _shared(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many distinct values the two streams have in common."""
    s = torch.cat([a.unique(), b.unique()]).sort().values
    return int((s[1:] == s[:-1]).sum())


def _pairs() -> list[tuple[int, int]]:
    g = torch.Generator().manual_seed(7)
    base = derive_key(*BASE)
    rand = torch.randint(0, 2**32, (6,), generator=g, dtype=torch.int64).tolist()
    calls = extend_key(torch.tensor(base), torch.arange(4)).tolist()  # a layer's calls 0..3
    return [
        (base, base ^ 1),  # neighbouring keys: one bit apart
        (base, base ^ (1 << 12)),
        (base, (base + 1) & 0xFFFFFFFF),
        (calls[0], calls[1]),  # consecutive training calls of one stream
        (calls[2], calls[3]),
        (rand[0], rand[1]),
        (rand[2], rand[3]),
        (rand[4], rand[5]),
    ]


@pytest.mark.parametrize("pair", range(8))
def test_two_keys_share_no_more_values_than_chance(pair):
    k1, k2 = _pairs()[pair]
    idx = torch.arange(N)
    shared = _shared(random_bits(k1, idx), random_bits(k2, idx))
    assert shared < 16 + 10 * 4, shared  # chance: 16 +- 4


def test_the_shared_value_count_catches_a_key_xored_into_the_index():
    # the numerics-1 streams: keys one bit apart draw the same 2^18 numbers, permuted
    k1 = derive_key(*BASE)
    idx = torch.arange(N)
    assert _shared(_xor_keyed(k1, idx), _xor_keyed(k1 ^ 1, idx)) == N


@pytest.mark.parametrize("pair", range(8))
def test_two_keys_draws_are_jointly_uniform(pair):
    # the (u, v) pairs of the same index under two keys, in an 8 x 8 grid of equal cells: chi-square
    # with 63 degrees of freedom, whose 99.99th percentile is 115.0 (a fixed key pair makes the
    # statistic deterministic); plus the sample correlation within 5 sigma of 0
    k1, k2 = _pairs()[pair]
    idx = torch.arange(1 << 16)
    u, v = uniform24(k1, idx), uniform24(k2, idx)
    cells = (u * 8).long() * 8 + (v * 8).long()
    counts = torch.bincount(cells, minlength=64).double()
    expected = idx.numel() / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 115.0, chi2
    corr = float(torch.corrcoef(torch.stack([u.double(), v.double()]))[0, 1])
    assert abs(corr) < 5 / idx.numel() ** 0.5
