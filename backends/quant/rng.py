"""Counter-based random bits for stochastic rounding and random Hadamard signs.

A random stream here is a pure function of a 32-bit key and an element index, so the same
(seed, layer, GEMM, operand, step) gives the same bits on every device and in every code path (the C
kernel in ``csrc/quant.c`` computes the identical hash). ``mix32`` is the "lowbias32" integer hash
from Wellons' hash-prospector (constants 0x21f0aaad, 0x735a2d97, shifts 16/15/15); both constants are
below 2^31 so the torch version can use int64 arithmetic without overflow.

The element index is hashed before the key is mixed in: ``mix32(mix32(mix32(lo ^ PHI) ^ hi) ^
key)``. Were the key XORed into the index itself (``mix32(mix32(lo ^ key) ^ hi)``, numerics 1),
two keys' streams would be the same numbers in another order (``stream_k2[i] = stream_k1[i ^ k1 ^
k2]``, within the operand whenever the keys agree above its index width); hashed first, the index
that would give one key's number under the other is a pseudo-random one, almost never inside the
operand, and the streams of neighbouring and random keys are independent (``tests/backends/quant/
test_rng.py`` measures it). ``PHI`` keeps index 0 off ``mix32``'s fixed point 0.
"""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF
_C1 = 0x21F0AAAD
_C2 = 0x735A2D97

GEMM_IDS = {"fprop": 1, "dgrad": 2, "wgrad": 3}
OPERAND_IDS = {"x": 1, "w": 2, "dy": 3}


def mix32(x: int) -> int:
    """The hash on Python ints (for deriving keys)."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 15
    x = (x * _C2) & M32
    x ^= x >> 15
    return x


_KEY_INIT = 0x9E3779B9
_HI_OFFSET = 0x85EBCA6B
PHI = 0x9E3779B9  # 2^32 / golden ratio: the index offset of the stream hash


def derive_key(*parts: int) -> int:
    """A 32-bit stream key from integers, e.g. ``derive_key(seed, layer, gemm, operand, step)``."""
    k = _KEY_INIT
    for p in parts:
        if p < 0:
            raise ValueError(f"key parts must be non-negative integers, got {p}")
        k = mix32(k ^ mix32(p & M32) ^ mix32((p >> 32) + _HI_OFFSET))
    return k


def extend_key(key: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """``derive_key(*parts, part)`` from ``key = derive_key(*parts)``, on the device: int64 tensors
    (broadcast), no host synchronisation. The training step keys its streams this way, from the
    layer's key prefixes and its call counter, both buffers on the layer's device."""
    p = part.to(torch.int64)
    return _mix32_t(key ^ _mix32_t(p & M32) ^ _mix32_t((p >> 32) + _HI_OFFSET))


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 15)


def random_bits(key: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """32 random bits (in int64) per element index: ``mix32(mix32(mix32(lo ^ PHI) ^ hi) ^ key)``,
    the index hashed before the key enters (module docstring).

    ``key`` may be an int64 tensor (a compiled caller passes it as data, not as a constant)."""
    index = index.to(torch.int64)  # the arithmetic below needs 64 bits whatever the index dtype
    lo = index & M32
    hi = index >> 32
    return _mix32_t(_mix32_t(_mix32_t(lo ^ PHI) ^ hi) ^ (key & M32))


def uniform24(key: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in [0, 1) on the 2^-24 grid (exact), one per element index."""
    return (random_bits(key, index) >> 8).to(torch.float32) * 2.0**-24
