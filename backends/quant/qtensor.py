"""The result of quantizing an operand (``QTensor``: codes, scales, and what decodes them), with
the float32 constants of NVFP4's decoding (TransformerEngine's arithmetic: ``nv_decode``,
``nv_alpha``). How an operand is quantized is ``operand.py``'s ``QuantSpec``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.quant.arith import NV_ALPHA, NV_DEQ, rcp
from backends.quant.formats import decode_e8m0, pack_fp4
from backends.quant.operand import QuantSpec


@dataclass
class QTensor:
    """A quantized tensor: codes, scales, and what is needed to dequantize it.

    ``codes``: uint8, one element code per byte (sign in the top bit of the format's width), with the
    quantized axis moved last and zero-padded to a multiple of the block: shape ``(..., Kp)``.
    ``scales``: uint8 block scale codes (E8M0, or E4M3 bits for NVFP4), shape ``(..., Kp // block)``;
    None for per-tensor formats. ``global_dec``: float32 scalar tensor decode scale, ``1 / S_enc``:
    of NVFP4 (``S_enc = 2688 / amax``, what the element encode factors are computed with) and of
    per-tensor FP8 (``S_enc = max / amax``, what the elements are decoded with), else None.
    ``global_amax``: float32 scalar amax of the tensor, NVFP4 only (NaN for a non-finite tensor):
    NVFP4 values decode as ``q * ((s * global_amax) * fp32(1/2688))``, as TransformerEngine's do
    (``1/1536`` with Four Over Six; MS-EDEN's as ``q * (s * global_dec)``). ``outer_scales``:
    float32 ``(..., Kp // outer_block)`` of double-block NVFP4 (``double_block.py``), whose values
    decode as ``q * (outer * s)``, and whose codes are padded to a multiple of the outer block.
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    global_dec: torch.Tensor | None
    spec: QuantSpec
    axis: int
    shape: tuple[int, ...]
    global_amax: torch.Tensor | None = None
    outer_scales: torch.Tensor | None = None

    def elements(self) -> torch.Tensor:
        """Element values (float32, element units), in the codes' layout."""
        return self.spec.fmt.elem.decode(self.codes)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Values in the original shape and layout (with ``prescale``: 3/4 of the tensor's values)."""
        q = self.elements()
        f = self.spec.fmt
        if f.scale == "tensor":
            assert self.global_dec is not None
            out = q * self.global_dec
        else:
            assert self.scales is not None
            B = self.spec.block
            qb = q.unflatten(-1, (-1, B))
            if f.scale == "e8m0":
                out = (qb * decode_e8m0(self.scales).unsqueeze(-1)).flatten(-2)
            else:
                out = (qb * self.nv_block_decode().unsqueeze(-1)).flatten(-2)
        out = out[..., : self.shape[self.axis]].movedim(-1, self.axis)
        return out.to(dtype)

    def nv_block_decode(self) -> torch.Tensor:
        """NVFP4: the float32 decode factor of each block, ``(..., nb)``: ``(s * amax) *
        fp32(1/top)`` (``QuantSpec.nv_top``), MS-EDEN's ``s * global_dec``, or double-block
        NVFP4's ``outer * s``."""
        assert self.scales is not None
        if self.outer_scales is not None:
            s8 = self.scales.view(torch.float8_e4m3fn).float()
            per = (self.spec.outer_block or 0) // self.spec.block
            return self.outer_scales.repeat_interleave(per, -1) * s8
        top = self.spec.nv_top
        if top is None:  # MS-EDEN
            assert self.global_dec is not None
            s8 = self.scales.view(torch.float8_e4m3fn).float()
            return s8 * self.global_dec.to(device=s8.device, dtype=torch.float32)
        assert self.global_amax is not None
        return nv_decode(self.scales, self.global_amax, top)

    def block_values(
        self, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(values without the tensor-level scale, that scale or None), in the original shape and
        layout: MX values as ``dequantize`` gives them (no tensor scale); NVFP4's element x E4M3
        block scale and ``global_amax * fp32(1/2688)``; per-tensor FP8's elements and its decode
        scale. The values are exact in bfloat16 (at most 3 + 4 significant bits, exponents in
        range), so a BF16 GEMM with FP32 accumulation multiplies them exactly, and the tensor scale
        goes on its output, as a native GEMM's alpha does."""
        f = self.spec.fmt
        if f.scale == "e8m0":
            return self.dequantize(dtype), None
        if self.outer_scales is not None:
            raise ValueError(
                "block_values: double-block NVFP4 has a scale per outer block, not per tensor; "
                "its values are not exact in bfloat16 without it (use dequantize)"
            )
        q = self.elements()
        if f.scale == "tensor":
            scale = self.global_dec
        else:
            assert self.scales is not None
            s8 = self.scales.view(torch.float8_e4m3fn).float()
            q = (q.unflatten(-1, (-1, self.spec.block)) * s8.unsqueeze(-1)).flatten(-2)
            top = self.spec.nv_top
            if top is None:  # MS-EDEN: its tensor decode scale
                scale = self.global_dec
            else:
                assert self.global_amax is not None
                scale = self.global_amax.float() * rcp(top)
        out = q[..., : self.shape[self.axis]].movedim(-1, self.axis)
        assert scale is not None
        return out.to(dtype), scale.to(out.device)

    def t(self) -> QTensor:
        """The quantization of ``x.t()`` along the same axis position, from this one of a 2-D ``x``
        with square 2-D blocks, without rounding anything again: the same element codes and tile
        scales, laid out for the other dimension. For ``W`` (out, in) quantized along ``in`` (a
        layer's fprop operand) it is ``W^T`` (in, out) quantized along ``out`` (its dgrad operand),
        bit for bit what ``quantize(W.t(), spec, axis=1)`` returns with round-to-nearest.
        """
        if self.spec.block_rows == 1 or len(self.shape) != 2:
            raise ValueError(
                "QTensor.t() needs a 2-D tensor quantized in 2-D blocks (spec.block_rows > 1); "
                f"this one is {self.spec.short()} of shape {self.shape}"
            )
        assert self.scales is not None
        B = self.spec.block
        rows, K = self.codes.shape[0], self.shape[self.axis]  # codes: (rows, Kp), axis last
        rows_p = -(-rows // B) * B
        codes = torch.nn.functional.pad(self.codes[:, :K].t(), (0, rows_p - rows)).contiguous()
        tiles = self.scales[::B]  # (ceil(rows / B), Kp / B): one row of scales per tile row
        scales = tiles.t().repeat_interleave(B, 0)[:K].contiguous()  # (K, rows_p / B)
        shape = (self.shape[1], self.shape[0])
        return QTensor(
            codes, scales, self.global_dec, self.spec, self.axis, shape, self.global_amax
        )

    def packed(self) -> torch.Tensor:
        """E2M1 codes packed two per byte (``float4_e2m1fn_x2`` layout), FP4 formats only."""
        if not self.spec.fmt.is_fp4:
            raise ValueError(f"packed() is for FP4 formats; this tensor is {self.spec.format}")
        return pack_fp4(self.codes)


def nv_decode(scales: torch.Tensor, global_amax: torch.Tensor, top: float = 2688.0) -> torch.Tensor:
    """float32 decode factors ``(s * amax) * fp32(1/top)`` of NVFP4 block scale codes (E4M3 bits),
    TransformerEngine's dequantization (NaN for the NaN scale code 0x7F); ``top`` is 6 * 448, or
    Four Over Six's 6 * 256 (``QuantSpec.nv_top``)."""
    s8 = scales.view(torch.float8_e4m3fn).float()
    amax = global_amax.to(device=s8.device, dtype=torch.float32)
    return (s8 * amax) * (NV_DEQ if top == 2688.0 else rcp(top))


def nv_alpha(top_a: float, top_b: float) -> float:
    """fp32(1 / (top_a * top_b)): the NVFP4 GEMM's alpha factor on ``amax_a * amax_b``
    (``NV_ALPHA`` for two standard operands, TransformerEngine's)."""
    return NV_ALPHA if top_a == top_b == 2688.0 else rcp(top_a * top_b)
