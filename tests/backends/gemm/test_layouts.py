"""The block-scale layouts (``backends.gemm.layouts``): hipBLASLt's pre-swizzled gfx950 tiles placed
where its closed form says, bit for bit, and read back; every layout's round trip through ragged
shapes and E8M0 bytes; the element counts that make a layout impossible to infer (why a call must
name it); which ROCm versions take the pre-swizzled tiles, and that a torch which cannot name them
is refused."""

from __future__ import annotations

import pytest
import torch

from backends.gemm import capabilities
from backends.gemm.capabilities import build_limits, preswizzled_formats
from backends.gemm.layouts import (
    SCALE_LAYOUTS,
    element_count,
    from_layout,
    preswizzle_scales,
    to_layout,
    unpreswizzle_scales,
)
from backends.gemm.native import dequantize_packed, layout_for, pack_operand
from backends.quant import QuantSpec, fake_quantize

SHAPES = [(1, 1), (32, 8), (33, 9), (64, 16), (96, 24), (128, 4), (37, 3), (256, 128)]


def _closed_form(rows: int, cols: int) -> torch.Tensor:
    """Where hipBLASLt's ``preSwizzleScalesGFX950`` puts scale (r, c), for every (r, c)."""
    C = -(-cols // 8) * 8
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(cols).view(1, -1)
    return (
        (r // 32) * 32 * C + (c // 8) * 256 + (c % 4) * 64 + (r % 16) * 4 + ((c // 4) % 2) * 2
        + (r // 16) % 2
    )  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_each_scale_lands_where_hipblaslt_reads_it(shape):
    rows, cols = shape
    s = torch.randint(0, 255, shape, dtype=torch.uint8)
    flat = preswizzle_scales(s)
    assert flat.numel() == element_count("32x8", rows, cols)
    assert torch.equal(flat[_closed_form(rows, cols)], s)
    placed = torch.zeros(flat.numel(), dtype=torch.bool)
    placed[_closed_form(rows, cols).flatten()] = True
    assert not flat[~placed].any()  # the padding is zero bytes


def test_the_first_word_of_a_tile_interleaves_rows_16_apart_and_columns_4_apart():
    r, c = torch.meshgrid(torch.arange(32), torch.arange(8), indexing="ij")
    s = (r * 8 + c).to(torch.uint8)
    flat = preswizzle_scales(s).tolist()
    assert flat[:8] == [0, 16 * 8, 4, 16 * 8 + 4, 8, 17 * 8, 8 + 4, 17 * 8 + 4]
    assert flat[64:66] == [1, 16 * 8 + 1]  # column 1 starts the second quarter


@pytest.mark.parametrize("layout", SCALE_LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_layout_reads_back_what_it_stored(layout, shape):
    s = torch.randint(100, 140, shape, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    stored = to_layout(s, layout)
    assert stored.dtype == torch.float8_e8m0fnu and stored.numel() == element_count(layout, *shape)
    back = from_layout(stored.view(torch.uint8), layout, *shape)
    assert torch.equal(back, s.view(torch.uint8))
    if layout == "32x8":
        assert torch.equal(unpreswizzle_scales(stored.view(torch.uint8), *shape), back)


def test_an_unknown_layout_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="scale layout 'swizzled': one of 128x4, row-major, 32x8"):
        to_layout(torch.zeros(4, 4), "swizzled")


@pytest.mark.parametrize(("rows", "K"), [(32, 256), (4096, 4096), (8192, 14336)])
def test_pre_swizzled_and_row_major_scales_have_the_same_count_and_other_bytes(rows, K):
    """For rows % 32 == 0 and K % 256 == 0 a call that infers the layout from the element count
    (``torch._scaled_mm``) cannot tell the two apart: every LLM shape."""
    s = torch.randint(100, 140, (rows, K // 32), dtype=torch.uint8)
    assert element_count("32x8", rows, K // 32) == element_count("row-major", rows, K // 32)
    assert not torch.equal(preswizzle_scales(s), s.flatten())


@pytest.mark.parametrize(
    ("hip", "formats"),
    [
        (None, set()),  # a CUDA or CPU build
        ((7, 12), set()),
        ((7, 13), {"mxfp4"}),
        ((7, 14), {"mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"}),
        ((8, 0), {"mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"}),
    ],
)
def test_gfx950_takes_pre_swizzled_scales_by_the_rocm_torch_was_built_against(hip, formats):
    assert preswizzled_formats("gfx950", hip) == formats
    assert layout_for("gfx950", hip=hip).preswizzled == formats
    assert preswizzled_formats("gfx942", hip) == set()  # FP8 only: no block scales
    assert preswizzled_formats("sm_100", hip) == set()


@pytest.mark.parametrize(("named", "refused"), [(False, {"mxfp4"}), (True, set())])
def test_a_rocm_713_build_is_refused_unless_its_torch_can_name_the_layout(
    named, refused, monkeypatch
):
    monkeypatch.setattr(torch.version, "hip", "7.13.60610")
    monkeypatch.setattr(capabilities, "has_swizzle_32_8", lambda: named)
    limits = build_limits("gfx950")
    assert set(limits) == refused
    assert all(
        "built against ROCm 7.13" in why and "SwizzleType.SWIZZLE_32_8" in why
        for why in limits.values()
    )


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
def test_operands_packed_pre_swizzled_decode_to_the_emulated_values(fmt):
    x = torch.randn(65, 300, generator=torch.Generator().manual_seed(3))
    x[3, 5] = float("nan")
    spec = QuantSpec(format=fmt)
    p = pack_operand(x, spec, layout=layout_for("gfx950", hip=(7, 14)))
    assert p.scale_layout == "32x8" and p.scale.dtype == torch.float8_e8m0fnu
    R, width = p.data.shape
    K = width * 2 if spec.fmt.is_fp4 else width
    assert p.scale.numel() == element_count("32x8", R, K // 32)
    ref = fake_quantize(x, spec, axis=1, out_dtype=torch.float32)
    torch.testing.assert_close(dequantize_packed(p)[:65, :300], ref, rtol=0, atol=0, equal_nan=True)
