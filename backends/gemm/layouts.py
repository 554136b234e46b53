"""Where a scaled GEMM reads its block scales: the layouts of the devices' libraries as pure
functions of a (rows, cols) scale matrix, each with its inverse and its element count.

- ``swizzle_scales``: cuBLAS's 128x4 tiles (CUDA's MXFP8, MXFP4 and NVFP4; torch's
  ``SwizzleType.SWIZZLE_32_4_4``), bit for bit torchao's ``to_blocked``
  (``torchao/prototype/mx_formats/utils.py``) and the cuBLAS documentation's "1D block scaling
  factors layout".
- row-major ``(rows, cols)``: ROCm's MX scales for a torch built against ROCm before 7.13
  (hipBLASLt's ``VEC32_UE8M0``; torch's ``SwizzleType.NO_SWIZZLE``).
- ``preswizzle_scales``: hipBLASLt's pre-swizzled gfx950 layout (``BLK32_UE8M0_32_8_EXT``), which a
  torch built against ROCm 7.13 or later takes for MXFP4 and from 7.14 for MXFP8; written from
  PyTorch's ``to_blocked`` for ROCm >= 7.13 (``torch/testing/_internal/common_quantized.py``),
  AITER's ``shuffle_scale`` (``aiter/ops/shuffle.py``) and hipBLASLt's ``preSwizzleScalesGFX950``
  (``shared/mxdatagenerator/.../PreSwizzle.hpp`` in ROCm/rocm-libraries), which agree.

``element_count`` is what ``torch._scaled_mm`` (v1) checks a scale tensor against to infer the
layout; for rows % 32 == 0 and cols % 8 == 0 (K % 256 == 0: every LLM shape) the pre-swizzled and
the row-major counts are equal, and for rows % 128 == 0 and cols % 4 == 0 the cuBLAS count too,
so only a call that names the layout (``torch.nn.functional.scaled_mm``'s ``SwizzleType``) can
tell them apart.
"""

from __future__ import annotations

import torch

SCALE_LAYOUTS = ("128x4", "row-major", "32x8")
"""cuBLAS's tiles, ROCm's row-major scales, hipBLASLt's gfx950 pre-swizzle."""


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def pad2d(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor at the bottom and right to (rows, cols)."""
    r, c = t.shape
    if (r, c) == (rows, cols):
        return t
    return torch.nn.functional.pad(t, (0, cols - c, 0, rows - r))


def _padded_bytes(scales: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, bool]:
    """``scales`` zero-padded to (rows, cols), as bytes where they are one-byte floats (E8M0 has
    no zero and ``pad`` no float8 kernel: its pad bytes are 0x00); whether it was viewed."""
    byte = scales.element_size() == 1 and scales.dtype != torch.uint8
    return pad2d(scales.view(torch.uint8) if byte else scales, rows, cols), byte


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) block scales -> flat, in cuBLAS's tiled layout.

    Bit for bit torchao's ``to_blocked``: zero-padded to (128·⌈rows/128⌉, 4·⌈cols/4⌉); tile (t, u)
    of 128 rows x 4 columns is stored at ``(t·⌈cols/4⌉ + u)·512``, its row 32i + j, column c at
    offset 16j + 4i + c.
    """
    rows, cols = scales.shape
    R, C = round_up(rows, 128), round_up(cols, 4)
    padded, byte = _padded_bytes(scales, R, C)
    t = padded.view(R // 128, 4, 32, C // 4, 4)  # (row tile, i, j, col tile, c)
    out = t.permute(0, 3, 2, 1, 4).reshape(-1)  # (row tile, col tile, j, i, c)
    return out.view(scales.dtype) if byte else out


def unswizzle_scales(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of ``swizzle_scales``: the (rows, cols) scales."""
    R, C = round_up(rows, 128), round_up(cols, 4)
    t = blocked.reshape(R // 128, C // 4, 32, 4, 4)  # (row tile, col tile, j, i, c)
    return t.permute(0, 3, 2, 1, 4).reshape(R, C)[:rows, :cols]


def preswizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) E8M0 block scales -> flat, in hipBLASLt's pre-swizzled gfx950 layout.

    Zero-padded to (32·⌈rows/32⌉, 8·⌈cols/8⌉), viewed as (R/32, 2, 16, C/8, 2, 4) (row
    r = 32·d0 + 16·d1 + d2, column c = 8·d3 + 4·d4 + d5) and permuted to (d0, d3, d5, d2, d4, d1):
    each 32x8 tile is 256 bytes, tiles row-block-major; scale (r, c) lands at ``(r//32)·32·C +
    (c//8)·256 + (c%4)·64 + (r%16)·4 + ((c//4)%2)·2 + (r//16)%2``. AITER pads rows to 256 with
    uninitialized bytes; its first R·C bytes are these.
    """
    rows, cols = scales.shape
    R, C = round_up(rows, 32), round_up(cols, 8)
    padded, byte = _padded_bytes(scales, R, C)
    t = padded.view(R // 32, 2, 16, C // 8, 2, 4)
    out = t.permute(0, 3, 5, 2, 4, 1).reshape(-1)
    return out.view(scales.dtype) if byte else out


def unpreswizzle_scales(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of ``preswizzle_scales``: the (rows, cols) scales."""
    R, C = round_up(rows, 32), round_up(cols, 8)
    t = flat.reshape(R // 32, C // 8, 4, 16, 2, 2)  # (d0, d3, d5, d2, d4, d1)
    return t.permute(0, 5, 3, 1, 4, 2).reshape(R, C)[:rows, :cols]


def to_layout(scales: torch.Tensor, layout: str) -> torch.Tensor:
    """(rows, cols) scales as ``layout`` (one of ``SCALE_LAYOUTS``) stores them."""
    if layout == "128x4":
        return swizzle_scales(scales)
    if layout == "32x8":
        return preswizzle_scales(scales)
    if layout == "row-major":
        return scales.contiguous()
    raise ValueError(f"scale layout {layout!r}: one of {', '.join(SCALE_LAYOUTS)}")


def from_layout(stored: torch.Tensor, layout: str, rows: int, cols: int) -> torch.Tensor:
    """Inverse of ``to_layout``: the (rows, cols) scales."""
    if layout == "128x4":
        return unswizzle_scales(stored, rows, cols)
    if layout == "32x8":
        return unpreswizzle_scales(stored, rows, cols)
    if layout == "row-major":
        return stored.reshape(rows, cols)
    raise ValueError(f"scale layout {layout!r}: one of {', '.join(SCALE_LAYOUTS)}")


def element_count(layout: str, rows: int, cols: int) -> int:
    """How many scales ``layout`` stores for a (rows, cols) scale matrix."""
    if layout == "128x4":
        return round_up(rows, 128) * round_up(cols, 4)
    if layout == "32x8":
        return round_up(rows, 32) * round_up(cols, 8)
    if layout == "row-major":
        return rows * cols
    raise ValueError(f"scale layout {layout!r}: one of {', '.join(SCALE_LAYOUTS)}")
