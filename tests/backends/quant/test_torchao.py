"""Bit-exact agreement with torchao's MX reference (``torchao.prototype.mx_formats.to_mx``).

Codes and scales for MXFP4 and MXFP8-E4M3 in all four scale modes on normal, heavy-tailed and edge
tensors; the two places where torchao departs from the OCP MX rules are tested against hand-computed
values instead (see the module docstring of ``backends/quant/quantizer.py``).
"""

from __future__ import annotations

import pytest
import torch

from backends.quant import (
    QuantSpec,
    ScaleMode,
    decode_e8m0,
    fake_quantize,
    quantize,
    quantize_reference,
    unpack_fp4,
)

mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
cfg = pytest.importorskip("torchao.prototype.mx_formats.config")

MODES = [ScaleMode.FLOOR, ScaleMode.CEIL, ScaleMode.EVEN, ScaleMode.RCEIL]
FORMATS = {"mxfp4": torch.float4_e2m1fn_x2, "mxfp8_e4m3": torch.float8_e4m3fn}


def _torchao(x: torch.Tensor, fmt: str, mode: ScaleMode) -> tuple[torch.Tensor, torch.Tensor]:
    scale, data = mx.to_mx(x, FORMATS[fmt], 32, cfg.ScaleCalculationMode(mode.value))
    codes = unpack_fp4(data) if fmt == "mxfp4" else data.view(torch.uint8)
    return codes, scale.view(torch.uint8)


def _edge_tensor() -> torch.Tensor:
    """One 32-element block per row, each row an edge case."""
    g = torch.Generator().manual_seed(0)
    rows = []
    rows.append(torch.zeros(32))  # all zeros
    rows.append(torch.tensor([0.0, -0.0] * 16))  # signed zeros
    rows.append(torch.tensor([2.0**k * (-1) ** k for k in range(-16, 16)]))  # powers of two
    for k in (-3, 0, 5, 40):  # block maxima in [6, 8) * 2^k: FLOOR clips them
        r = torch.randn(32, generator=g)
        r[7] = 7.5 * 2.0**k
        r[9] = -6.25 * 2.0**k
        rows.append(r)
    rows.append(torch.full((32,), 7.0))  # exactly the FLOOR/EVEN boundary
    rows.append(torch.full((32,), 1.75))
    # ties at every E2M1 midpoint (scaled so the block scale is 2^0 under FLOOR: amax 4..7.99)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
    rows.append(torch.cat([mids, -mids, mids * 0.5 + 4 * 0, torch.full((8,), 4.0)]))
    rows.append(torch.cat([mids, -mids, mids, -mids]))
    # near the top of the E8M0 range
    rows.append(torch.randn(32, generator=g) * 2.0**120)
    rows.append(torch.full((32,), 3.0e38))
    # low end, still above the blocks whose scale code is 0 (torchao departs there)
    rows.append(torch.randn(32, generator=g) * 2.0**-110)
    # a descale just above a power of two (RCEIL) but not within float32 log2's blind spot
    rows.append(torch.full((32,), 6.0 * 2.0**3 * (1 + 2.0**-10)))
    return torch.stack(rows)


def _heavy_tailed(n: int = 64, k: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, k, generator=g)
    idx = torch.randint(0, n * k, (n * k // 50,), generator=g)
    x.view(-1)[idx] *= torch.exp(torch.randn(idx.numel(), generator=g) * 4)  # outliers
    return x


TENSORS = {
    "normal": lambda: torch.randn(64, 256, generator=torch.Generator().manual_seed(2)),
    "heavy_tailed": _heavy_tailed,
    "edge": _edge_tensor,
}


@pytest.mark.parametrize("tensor", list(TENSORS))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_and_scales_match_torchao(tensor, mode, fmt, dtype):
    x = TENSORS[tensor]().to(dtype)
    ref_codes, ref_scales = _torchao(x, fmt, mode)
    spec = QuantSpec(format=fmt, scale_mode=mode)
    for q in (quantize(x, spec), quantize_reference(x, spec)):
        assert q.scales is not None
        assert torch.equal(q.scales, ref_scales)
        assert torch.equal(q.codes, ref_codes)


def test_fake_quantize_matches_torchao_dequantize():
    x = _heavy_tailed()
    codes, scales = _torchao(x, "mxfp4", ScaleMode.FLOOR)
    from backends.quant import E2M1

    expected = (E2M1.decode(codes).view(64, -1, 32) * decode_e8m0(scales).unsqueeze(-1)).flatten(1)
    got = fake_quantize(x, QuantSpec(format="mxfp4"))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_smallest_scale_follows_ocp_not_torchao(mode):
    # amax = 2^-126 * 1.5: FLOOR gives E = -126 - 2 -> clamped to -127 (code 0), scale 2^-127.
    # OCP: element = x / 2^-127 = 1.5 * 2 = 3.0 (code 0b0101). torchao divides by 2^-126 instead
    # (its F32_MIN_NORMAL clamp) and gets 1.5 (code 0b0011); for RCEIL it multiplies by 1.0 instead
    # of 2^127 (TransformerEngine's exp2f_rcp convention) and flushes the block to zero.
    x = torch.zeros(1, 32)
    x[0, 0] = 1.5 * 2.0**-126
    q = quantize(x, QuantSpec(format="mxfp4", scale_mode=mode))
    assert q.scales is not None and int(q.scales[0, 0]) == 0
    assert int(q.codes[0, 0]) == 0b0101  # 3.0
    assert float(q.dequantize()[0, 0]) == 1.5 * 2.0**-126  # exact round trip
    ao_codes, ao_scales = _torchao(x, "mxfp4", mode)
    departure = 0b0000 if mode == ScaleMode.RCEIL else 0b0011
    assert int(ao_scales[0, 0]) == 0 and int(ao_codes[0, 0]) == departure  # torchao's departure


def test_rceil_uses_exact_ceiling():
    # amax = nextafter(6 * 2^100): descale = fp32(amax / 6) = 2^100 + 2^77, just above 2^100.
    # cvt.rp.satfinite.ue8m0 (the exact ceiling) gives E = 101. float32 log2 returns 100 + 1.7e-7,
    # which rounds to exactly 100.0 (the float32 spacing at 100 is 7.6e-6), so torchao gets E = 100.
    amax = torch.tensor(6.0 * 2.0**100).nextafter(torch.tensor(float("inf")))
    assert float(amax / 6.0) > 2.0**100
    x = torch.zeros(1, 32)
    x[0, 0] = amax
    q = quantize(x, QuantSpec(format="mxfp4", scale_mode=ScaleMode.RCEIL))
    assert q.scales is not None and int(q.scales[0, 0]) == 127 + 101
    assert int(q.codes[0, 0]) == 0b0101  # amax / 2^101 = 3.0000x -> 3.0 (grid index 5)
    _, ao_scales = _torchao(x, "mxfp4", ScaleMode.RCEIL)
    assert int(ao_scales[0, 0]) == 127 + 100  # torchao's float32 log2 departs here
