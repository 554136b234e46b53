"""What the quantizer tests share: the three implementations by name, a key, a seeded generator,
bit-for-bit comparisons, and the single-threaded kernel the tests call thousands of times."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from backends.quant import (
    FORMATS,
    QTensor,
    fake_quantize,
    fake_quantize_fused,
    fake_quantize_reference,
    hadamard_transform,
    quantize,
    quantize_fused,
    quantize_reference,
)
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key

# fast: the C kernel here; fused: the torch arithmetic that runs on GPUs (eager on the CPU)
QUANTIZERS = {"fast": quantize, "fused": quantize_fused, "reference": quantize_reference}
FAKE_QUANTIZERS = {
    "fast": fake_quantize,
    "fused": fake_quantize_fused,
    "reference": fake_quantize_reference,
}
MX_FORMATS = [n for n, f in FORMATS.items() if f.scale == "e8m0"]
KEY = derive_key(42, 3, GEMM_IDS["dgrad"], OPERAND_IDS["dy"], 7)


@pytest.fixture(autouse=True)
def one_thread():
    """The kernel runs single-threaded here: these tests call it thousands of times on tiny tensors,
    and an OpenMP team per call costs milliseconds on a busy machine. The multi-threaded kernel is
    checked against this one in ``test_fast_path_is_independent_of_the_thread_count``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same dtype, shape and bit pattern (so -0 != +0), with NaN == NaN whatever its payload."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    ints = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]
    assert torch.equal(a[~nan].view(ints), b[~nan].view(ints))


def same_qtensor(a: QTensor, b: QTensor) -> None:
    assert torch.equal(a.codes, b.codes)
    assert (a.scales is None) == (b.scales is None)
    if a.scales is not None:
        assert torch.equal(a.scales, b.scales)
    assert (a.global_dec is None) == (b.global_dec is None)
    if a.global_dec is not None:
        bits_equal(a.global_dec.reshape(1), b.global_dec.reshape(1))
    assert (a.global_amax is None) == (b.global_amax is None)
    if a.global_amax is not None:
        bits_equal(a.global_amax.reshape(1), b.global_amax.reshape(1))
    assert (a.axis, a.shape) == (b.axis, b.shape)


# --- inputs --------------------------------------------------------------------------------


def heavy(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Normal values times a log-normal magnitude (heavy tails, block maxima spread over ~2^-8..2^8),
    with some exact zeros."""
    g = gen(seed)
    x = torch.randn(shape, generator=g) * torch.exp(1.5 * torch.randn(shape, generator=g))
    x.view(-1)[::11] = 0.0
    return x


def _edge_narrow() -> torch.Tensor:
    """Rows of 64 (two MX blocks, four NVFP4 blocks) that sit on rounding and scale boundaries."""
    g = gen(3)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
    rows = [
        torch.zeros(64),
        torch.tensor([0.0, -0.0] * 32),
        torch.cat([mids, -mids, mids * 2, -mids * 0.5, torch.full((32,), 4.0)]),  # E2M1 ties
        torch.cat([mids * 0.125, -mids * 64, torch.randn(48, generator=g)]),
        torch.full((64,), 7.0),  # FLOOR / EVEN boundary
        torch.full((64,), 6.0),
        torch.full((64,), 6.0 * 8 * (1 + 2.0**-10)),  # RCEIL: descale just above 2^3
        torch.full((64,), 448.0 * 2 * (1 + 2.0**-12)),
        torch.arange(64) * 1.0625 - 30,  # E4M3 ties (1 + 1/16) after scaling
        torch.randn(64, generator=g).sign() * (1 + torch.arange(64) / 16.0),  # E5M2/E4M3 ties
    ]
    for k in (-2, 0, 3):  # block maxima in [6, 8) * 2^k: FLOOR clips them
        r = torch.randn(64, generator=g) * 2.0**k
        r[5], r[40] = 7.5 * 2.0**k, -6.5 * 2.0**k
        rows.append(r)
    return torch.stack(rows)


def _edge_wide() -> torch.Tensor:
    """Rows spanning the float32 range: subnormal blocks, E8M0 clamping at both ends."""
    g = gen(4)
    r = lambda: torch.randn(64, generator=g)  # noqa: E731
    rows = [
        r() * 2.0**-130,  # float32 subnormals: E clamps at -127 (code 0)
        r() * 2.0**-145,
        torch.full((64,), 2.0**-149),  # the smallest subnormal
        r() * 2.0**-120,
        r() * 2.0**110,
        torch.full((64,), 3.0e38),  # near float32 max
        r(),
        torch.zeros(64),
    ]
    return torch.stack(rows)


def _nonfinite() -> torch.Tensor:
    x = heavy((4, 64), 5)
    x[0, 3] = math.nan
    x[1, 40] = math.inf
    x[3, 0] = -math.inf
    return x


def _hadamard_axis0() -> torch.Tensor:
    # the output of a Hadamard transform along axis 0 (K = 40 padded to 64), in whatever layout
    # hadamard_transform returns it
    return hadamard_transform(heavy((40, 10), 6), axis=0, size=32)


def _rows_and_edges() -> torch.Tensor:
    return torch.cat([heavy((8, 64), 0), _edge_narrow()])


def _edges_ragged_axis0() -> torch.Tensor:
    # K = 50 along axis 0 (a full block of 32 and a ragged one of 18), quantized column by column
    return torch.cat([_edge_narrow().t()[:50], heavy((50, 6), 2)], 1).contiguous()


# name -> (tensor factory, axis)
LAYOUTS: dict[str, tuple[Callable[[], torch.Tensor], int]] = {
    "rows_and_edges_axis-1": (_rows_and_edges, -1),
    "ragged37_axis-1": (lambda: heavy((6, 37), 1), -1),
    "edges_ragged50_axis0": (_edges_ragged_axis0, 0),
    "3d_middle_axis": (lambda: heavy((3, 37, 5), 7), 1),
    "wide_axis0": (lambda: heavy((40, 150), 25), 0),  # strided, more columns than a kernel chunk
    "transposed_axis-1": (lambda: heavy((64, 12), 10).t(), -1),
    "transposed_axis0": (lambda: heavy((12, 50), 11).t(), 0),  # contiguous once axis is last
    "permuted_3d_axis1": (lambda: heavy((5, 37, 3), 24).permute(2, 1, 0), 1),
    "hadamard_axis0": (_hadamard_axis0, 0),
    "edge_wide": (_edge_wide, -1),
    "nonfinite": (_nonfinite, -1),
    "nonfinite_axis0": (lambda: _nonfinite().t().contiguous(), 0),
}


def to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast keeping the strides (a transposed view stays a transposed view), clamped to range."""
    fmax = torch.finfo(dtype).max
    return torch.where(torch.isfinite(x), x.clamp(-fmax, fmax), x).to(dtype)


def spacing(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Grid spacing of the element format at element-unit values ``v`` (that of the binade of |v|)."""
    elem = FORMATS[fmt].elem
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0**-200)))
    return torch.exp2(e.clamp(min=elem.emin) - elem.mbits)
