"""The ``native`` GEMM backend: the hardware's scaled GEMM through ``torch.nn.functional.scaled_mm``
(``torch._scaled_mm`` on a torch without it).

Each operand is quantized by the same quantizer as ``emulated`` (``quantizer.quantize``, after the same
Hadamard transform), so the codes and scales are identical; only the product differs: the hardware
multiplies the codes and applies the scales instead of an FP32 GEMM on dequantized values. Hadamard
transforms and stochastic rounding happen in the quantizer and need nothing from the GEMM; the
clip-free SR prescale is undone on the output exactly as ``emulated`` does (16/9 when both operands
use it). What the scaled GEMM receives, for ``a`` (M, K) and ``b`` (N, K), out = a @ b^T:

    format          mat_a / mat_b (b passed as b.t(): column-major)      scale_a / scale_b
    fp8_e4m3/e5m2   float8_e4m3fn / float8_e5m2, (M, K) / (K, N)         float32 scalar decode scale
                    (MI300: float8_*_fnuz codes of half the value, decode scale doubled)
    mxfp8_*         float8, (M, K) / (K, N)                              float8_e8m0fnu per 1x32 block,
                                                                         flat, in the device's layout
    mxfp4           float4_e2m1fn_x2, (M, K/2) / (K/2, N)                float8_e8m0fnu per 1x32, same
    nvfp4           float4_e2m1fn_x2, (M, K/2) / (K/2, N)                float8_e4m3fn per 1x16, 128x4;
                                                                         output x alpha (below)

NVFP4's tensor scales enter as TransformerEngine applies them: the GEMM multiplies the codes with the
E4M3 block scales and the output is multiplied by ``alpha = (amax_a * amax_b) * fp32(1/7225344)``
(7225344 = (6 * 448)^2; TE's ``compute_nvfp4_per_tensor_scale_kernel``), from the operands' tensor
amaxes (``QTensor.global_amax``); with Four Over Six's bound ``fp32(1/1536^2)`` (``operand.nv_alpha``),
and for MS-EDEN the product of the two tensor decode scales. Four Over Six and MS-EDEN produce
ordinary NVFP4 codes and E4M3 scales, so the hardware GEMM runs them; double-block NVFP4
(``outer_block``, TetraJet-v2) has an FP32 scale per 128 elements, which no GEMM here takes:
``check`` refuses it.

Block scales (``layouts``): cuBLAS's 128x4 tiles on CUDA (``swizzle_scales``; torchao's
``to_blocked``); on ROCm row-major for a torch built against ROCm before 7.13, and hipBLASLt's
pre-swizzled 32x8 tiles (``preswizzle_scales``) for MXFP4 from 7.13 and MXFP8 from 7.14, the
version read from the running torch (``torch.version.hip``). Rows are zero-padded to a multiple of
16 and K to a multiple of 32, as the GEMMs require (cuBLASLt: K and N multiples of 16; FP4 packs
K/2); on gfx950 both to 128: the MX GEMM needs K % 128, and torch's check of the scale count
(128·⌈rows/128⌉ · 4·⌈K/128⌉) holds for row-major scales only when rows are a multiple of 128. Padding
is zero codes, which add nothing, and is cut from the output.

Calls (``gemm_call``): ``F.scaled_mm(a, b.t(), scale_a, ScalingType.X, scale_b, ScalingType.X,
swizzle_a=S, swizzle_b=S, output_dtype=..., use_fast_accum=False)``, the explicit API (v2), with X
TensorWise (FP8), BlockWise1x32 (MX) or BlockWise1x16 (NVFP4) and S SWIZZLE_32_4_4 (cuBLAS's
tiles), NO_SWIZZLE (ROCm's row-major MX scales), SWIZZLE_32_8 (hipBLASLt's pre-swizzled tiles) or
none (a tensor scale): v2 names the layout, where ``torch._scaled_mm`` (v1) infers it from the
scale's element count, which for rows % 32 == 0 and K % 256 == 0 is the same for the row-major and
the pre-swizzled layouts (and for rows % 128 == 0 for cuBLAS's too: ``layouts.element_count``).
v1 only on a torch without v2 (before 2.10), never for MXFP4 on CUDA nor for pre-swizzled scales.
In a compiled model the v2 call is one opaque op (``ablate::scaled_mm_v2``): torch 2.11's Dynamo
cannot trace it. MXFP4 on CUDA goes to MSLK's CUTLASS kernel (B200/B300, bf16 output). A torch
built against ROCm 7.13 or later whose ``SwizzleType`` has no SWIZZLE_32_8 (2.11-2.13 among them)
cannot be told the pre-swizzled layout: ``capabilities.build_limits`` refuses those formats there;
and the self-check (``selfcheck.py``) holds every GEMM to the emulation before a cell trains.

``check`` runs before any training step: it refuses a recipe whose formats the device cannot run
(``CAPABILITIES``), naming the device, the formats and GEMMs, what the device supports, and
``backend: emulated`` as the way to run the recipe anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from backends.gemm.base import GemmKeys, UnsupportedFormatError
from backends.gemm.capabilities import (
    CAPABILITIES,
    HAS_V2,
    V2_ON,
    build_limits,
    capability_key,
    check_recipe,
    device_arch,
    device_name,
    formats_for,
    has_swizzle_32_8,
    hip_version,
    preswizzled_formats,
    supported_formats,
)
from backends.gemm.layouts import (
    from_layout,
    pad2d,
    preswizzle_scales,
    round_up,
    swizzle_scales,
    unpreswizzle_scales,
    unswizzle_scales,
)
from backends.quant import (
    E2M1,
    ElementFormat,
    QTensor,
    QuantSpec,
    Rotation,
    decode_e8m0,
    nv_alpha,
    pack_fp4,
    unpack_fp4,
)
from backends.quant.arith import NV_ALPHA, rcp
from backends.quant.ops import quantize  # one opaque op in a compiled graph
from backends.recipes import GemmRecipe, Recipe

_FNUZ = {"e4m3": torch.float8_e4m3fnuz, "e5m2": torch.float8_e5m2fnuz}


# ----------------------------------------------------------------------------------------------
# packing: what the GEMM takes (pure functions, testable on the CPU)


@dataclass(frozen=True, slots=True)
class Layout:
    """What a device's scaled GEMM expects of its operands."""

    swizzle: bool = True
    """Block scales in cuBLAS's 128x4 tiles (``swizzle_scales``); False: ROCm's, row-major or
    pre-swizzled (``preswizzled``)."""
    row_align: int = 16
    """Rows of each operand (M and N) are zero-padded to a multiple of this."""
    k_align: int = 32
    """The reduction dimension is zero-padded to a multiple of this (elements)."""
    fnuz: bool = False
    """FP8 as ``float8_*_fnuz`` (MI300)."""
    block_out: torch.dtype = torch.float32
    """Output dtype of the block-scaled GEMMs (hipBLASLt's MX GEMM writes bf16 only)."""
    preswizzled: frozenset[str] = frozenset()
    """ROCm: formats whose block scales go in hipBLASLt's pre-swizzled 32x8 tiles
    (``preswizzle_scales``: MXFP4 on a torch built against ROCm 7.13 or later, MXFP8 from 7.14)."""

    def scale_layout(self, fmt: str) -> str:
        """Where a GEMM of format ``fmt`` reads its block scales (``layouts.SCALE_LAYOUTS``)."""
        if self.swizzle:
            return "128x4"
        return "32x8" if fmt in self.preswizzled else "row-major"


CUDA_LAYOUT = Layout()


def layout_for(arch: str | None, hip: tuple[int, int] | None = None) -> Layout:
    """The operand layout of ``arch`` (CUDA's for None, so CPU tests exercise it); on gfx950 the
    MX scales' by the ROCm version torch was built against (``hip``, default the running torch's:
    ``capabilities.preswizzled_formats``)."""
    if arch == "gfx942":
        return Layout(swizzle=False, fnuz=True)
    if arch is not None and arch.startswith("gfx"):
        pre = preswizzled_formats(arch, hip_version() if hip is None else hip)
        return Layout(
            swizzle=False, row_align=128, k_align=128, block_out=torch.bfloat16, preswizzled=pre
        )
    return CUDA_LAYOUT


def to_fnuz(codes: torch.Tensor, elem: ElementFormat) -> torch.Tensor:
    """OCP FP8 codes (uint8) -> FNUZ codes (uint8) of exactly half the value.

    FNUZ's exponent bias is one larger, so every finite OCP bit pattern means half as much; the
    caller doubles the decode scale. -0 becomes +0 (0x80 is FNUZ's NaN); NaN and E5M2's infinities
    (which the saturating quantizer never emits) become 0x80.
    """
    assert elem.torch_dtype is not None
    nonfinite = ~torch.isfinite(codes.view(elem.torch_dtype).float())
    out = torch.where(codes == 0x80, 0, codes)
    return torch.where(nonfinite, 0x80, out).to(torch.uint8)


@dataclass(frozen=True, slots=True)
class PackedOperand:
    """One GEMM operand as ``torch._scaled_mm`` takes it (see the module docstring)."""

    data: torch.Tensor
    """(R, Kp) float8, or (R, Kp/2) float4_e2m1fn_x2; row-major, rows and K zero-padded."""
    scale: torch.Tensor
    """float32 () decode scale (per-tensor FP8); else block scales as float8_e8m0fnu (MX) or
    float8_e4m3fn (NVFP4), in ``scale_layout``: flat in cuBLAS's or hipBLASLt's tiles, or
    (R, Kp/block) row-major."""
    global_scale: torch.Tensor | None
    """NVFP4: float32 () tensor amax (the output is multiplied by ``alpha``, see the module
    docstring), or MS-EDEN's tensor decode scale; else None."""
    rows: int
    """Rows before padding."""
    spec: QuantSpec
    scale_layout: str
    """``128x4`` (cuBLAS), ``row-major`` or ``32x8`` (hipBLASLt, gfx950): ``layouts.SCALE_LAYOUTS``;
    ``row-major`` for a tensor scale."""
    out_dtype: torch.dtype
    """What the GEMM writes for this format on this device."""
    top: float | None = None
    """NVFP4: ``QuantSpec.nv_top`` (``global_scale`` is an amax that maps to it); None where
    ``global_scale`` is itself the tensor decode scale (MS-EDEN)."""


def pack_operand(
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    key: int | torch.Tensor = 0,
    hadamard: Rotation | None = None,
    layout: Layout = CUDA_LAYOUT,
) -> PackedOperand:
    """Quantize ``x`` (rows, K) along K, with the ``emulated`` backend's codes, and pack it.

    ``hadamard=Rotation(size, signs)`` first applies ``hadamard_transform`` along K, as ``emulated`` does;
    ``key`` seeds stochastic rounding.
    """
    if x.dim() != 2:
        raise ValueError(f"pack_operand needs a 2-D (rows, K) tensor, got shape {tuple(x.shape)}")
    q = quantize(x, spec, axis=1, key=key, hadamard=hadamard)  # (rows, Kq) codes, K padded
    return pack_quantized(q, layout=layout, device=x.device)


def pack_quantized(
    q: QTensor, *, layout: Layout = CUDA_LAYOUT, device: torch.device | None = None
) -> PackedOperand:
    """``pack_operand`` of a tensor already quantized along its last dimension (2-D)."""
    if len(q.shape) != 2 or q.axis != 1:
        raise ValueError(
            f"pack_quantized needs a 2-D (rows, K) tensor quantized along K, got shape {q.shape} "
            f"quantized along axis {q.axis}"
        )
    spec = q.spec
    device = device if device is not None else q.codes.device
    f, B = spec.fmt, spec.block or 1
    rows, K = q.codes.shape
    R, Kp = round_up(rows, layout.row_align), round_up(K, math.lcm(layout.k_align, B))
    # row-major (R, Kp) whatever the strides of the view that was quantized (``x.t()`` of dgrad
    # and wgrad): cuBLASLt multiplies only a row-major mat_a by a column-major mat_b (``b.t()`` of
    # a row-major b), and Inductor's lowering of ``_scaled_mm`` checks the same on the CPU
    codes = pad2d(q.codes, R, Kp).to(device).contiguous()
    if f.is_fp4:
        data = pack_fp4(codes).view(torch.float4_e2m1fn_x2)
    elif layout.fnuz and f.scale == "tensor":  # MI300 has FNUZ FP8 and no MX GEMM
        data = to_fnuz(codes, f.elem).view(_FNUZ[f.elem.name])
    else:
        assert f.elem.torch_dtype is not None
        data = codes.view(f.elem.torch_dtype)
    if f.scale == "tensor":
        assert q.global_dec is not None
        dec = q.global_dec.to(device=device, dtype=torch.float32).reshape(())
        if layout.fnuz:
            dec = dec * 2  # the FNUZ codes mean half as much
        return PackedOperand(data, dec, None, rows, spec, "row-major", torch.float32)
    assert q.scales is not None
    s = pad2d(q.scales, R, Kp // B).to(device)
    where = layout.scale_layout(spec.format)
    if where == "128x4":  # through this module's names: tests inject faults into them
        s = swizzle_scales(s)
    else:
        s = preswizzle_scales(s) if where == "32x8" else s.contiguous()
    s = s.view(torch.float8_e8m0fnu if f.scale == "e8m0" else torch.float8_e4m3fn)
    g = None
    if f.scale == "nv":
        if q.outer_scales is not None:
            raise ValueError(
                f"pack_quantized: {spec.short()} has a scale per {spec.outer_block} elements; no "
                "scaled GEMM here takes it"
            )
        t = q.global_amax if spec.nv_top is not None else q.global_dec  # MS-EDEN: its decode
        assert t is not None
        g = t.to(device=device, dtype=torch.float32).reshape(())
    out_dtype = layout.block_out
    if spec.format == "mxfp4" and where == "128x4":
        out_dtype = torch.bfloat16  # MSLK's MXFP4 kernel writes bf16
    return PackedOperand(data, s, g, rows, spec, where, out_dtype, spec.nv_top)


def dequantize_packed(p: PackedOperand) -> torch.Tensor:
    """(R, Kp) float32: the values the GEMM multiplies, decoded from what it is handed.

    Equal bit for bit to ``fake_quantize`` on the unpadded region (same operations in the same
    order as ``QTensor.dequantize``); zero in the padding.
    """
    f = p.spec.fmt
    vals = E2M1.decode(unpack_fp4(p.data)) if f.is_fp4 else p.data.float()
    if f.scale == "tensor":
        return vals * p.scale
    R, K = vals.shape
    B = p.spec.block
    codes = p.scale.view(torch.uint8)
    s = from_layout(codes, p.scale_layout, R, K // B)
    if f.scale == "e8m0":
        sv = decode_e8m0(s)
    else:
        assert p.global_scale is not None
        s8 = s.view(torch.float8_e4m3fn).float()
        g = p.global_scale.float()
        # as QTensor.dequantize: (s * amax) * fp32(1/top), or MS-EDEN's s * s_dec
        sv = (s8 * g) * rcp(p.top) if p.top is not None else s8 * g
    return (vals.view(R, K // B, B) * sv.unsqueeze(-1)).flatten(1)


# ----------------------------------------------------------------------------------------------
# the GEMM


_SCALING = {"tensor": "TensorWise", "e8m0": "BlockWise1x32", "nv": "BlockWise1x16"}


@dataclass(frozen=True, slots=True)
class GemmCall:
    """How one packed format is handed to the device's scaled GEMM."""

    api: str
    """``scaled_mm``: ``torch.nn.functional.scaled_mm`` (v2), which takes the scaling and the
    scale layout by name and refuses a mismatch; ``_scaled_mm``: ``torch._scaled_mm`` (v1), which
    infers the layout from the scale's element count (for rows % 32 == 0 and K % 256 == 0 a
    swizzled and a row-major MX scale have the same count: it cannot tell them apart)."""
    scaling: str
    """``ScalingType`` member: TensorWise (FP8), BlockWise1x32 (MX), BlockWise1x16 (NVFP4)."""
    swizzle: str | None
    """``SwizzleType`` member for block scales: SWIZZLE_32_4_4 (cuBLAS's 128x4 tiles),
    NO_SWIZZLE (row-major: ROCm before 7.13) or SWIZZLE_32_8 (hipBLASLt's pre-swizzled gfx950
    tiles: ROCm 7.13 or later, on a torch that names them); None for a tensor scale."""


_SWIZZLE = {"128x4": "SWIZZLE_32_4_4", "row-major": "NO_SWIZZLE", "32x8": "SWIZZLE_32_8"}


def gemm_call(
    spec: QuantSpec, scale_layout: str, v2: bool = HAS_V2, swizzle_32_8: bool | None = None
) -> GemmCall:
    """The call for operands of ``spec`` whose block scales are in ``scale_layout``
    (``layouts.SCALE_LAYOUTS``): v2 wherever this torch has it, with the scaling and the layout
    named; v1 (``torch._scaled_mm``) only on a torch without v2, where it is the one call there
    is. MXFP4 on CUDA has no v1 route in the torch versions this project runs (torch 2.13 sends
    it to MSLK's kernel through v2 only), and hipBLASLt's pre-swizzled scales none but v2's
    ``SwizzleType.SWIZZLE_32_8`` (``swizzle_32_8``: whether this torch has it): v1 would tell
    them from row-major ones by their element count, equal for every LLM shape."""
    scaling = _SCALING[spec.fmt.scale]
    swizzle = None if spec.fmt.scale == "tensor" else _SWIZZLE[scale_layout]
    if scale_layout == "32x8" and not (
        v2 and (has_swizzle_32_8() if swizzle_32_8 is None else swizzle_32_8)
    ):
        raise UnsupportedFormatError(
            f"backend native: {spec.format} with hipBLASLt's pre-swizzled scales needs "
            f"torch.nn.functional.scaled_mm with SwizzleType.SWIZZLE_32_8, which torch "
            f"{torch.__version__} does not have"
        )
    if v2:
        return GemmCall("scaled_mm", scaling, swizzle)
    if spec.format == "mxfp4" and scale_layout == "128x4":
        raise UnsupportedFormatError(
            f"backend native: MXFP4 on CUDA needs torch.nn.functional.scaled_mm, which torch "
            f"{torch.__version__} does not have"
        )
    return GemmCall("_scaled_mm", scaling, swizzle)


def _scaled_mm_v2(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    scaling_a: str,
    scaling_b: str,
    swizzle: str,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_mm`` with the scaling and the layout named (``GemmCall``'s
    ``scaling`` and ``swizzle``, "" for none)."""
    F = torch.nn.functional
    sw = getattr(F.SwizzleType, swizzle) if swizzle else None
    return F.scaled_mm(
        a,
        b,
        scale_a,
        getattr(F.ScalingType, scaling_a),
        scale_b,
        getattr(F.ScalingType, scaling_b),
        swizzle_a=sw,
        swizzle_b=sw,
        output_dtype=out_dtype,
        use_fast_accum=False,  # periodic promotion to FP32 of the tensor-core partial sums
    )


_scaled_mm_v2_op = torch.library.custom_op("ablate::scaled_mm_v2", mutates_args=())(_scaled_mm_v2)
"""``_scaled_mm_v2`` as one opaque op, for a compiled model: torch 2.11's Dynamo cannot trace
``torch.nn.functional.scaled_mm`` (it stops at the builtin ``_scaled_mm_v2``, and a ``fullgraph``
block fails to compile: every native FP8 cell on an H200), while the op is a node it keeps."""


@_scaled_mm_v2_op.register_fake
def _(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    scaling_a: str,
    scaling_b: str,
    swizzle: str,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def scaled_mm(pa: PackedOperand, pb: PackedOperand) -> torch.Tensor:
    """``a @ b^T`` (pa.rows, pb.rows) float32 on the device's scaled GEMM, FP32 accumulation
    (``gemm_call`` says how)."""
    if pa.data.shape[1] != pb.data.shape[1]:
        raise ValueError(
            f"scaled_mm: operands differ in K: {tuple(pa.data.shape)} and {tuple(pb.data.shape)}"
        )
    v2_here = V2_ON.get(pa.data.device.type, False)
    call = gemm_call(pa.spec, pa.scale_layout, v2_here)
    if call.api == "scaled_mm":
        v2 = _scaled_mm_v2_op if torch.compiler.is_compiling() else _scaled_mm_v2
        out = v2(
            pa.data,
            pb.data.t(),  # column-major, as cuBLASLt's FP8 GEMM on Hopper requires
            pa.scale,
            pb.scale,
            call.scaling,
            gemm_call(pb.spec, pb.scale_layout, v2_here).scaling,
            call.swizzle or "",
            pa.out_dtype,
        )
    else:
        out = torch._scaled_mm(
            pa.data,
            pb.data.t(),
            pa.scale,
            pb.scale,
            out_dtype=pa.out_dtype,
            use_fast_accum=False,
        )
    out = out.float()
    if pa.global_scale is not None and pb.global_scale is not None:
        out = out * alpha(pa, pb)
    return _unpad(out, pa.rows, pb.rows)


def alpha(pa: PackedOperand, pb: PackedOperand) -> torch.Tensor:
    """NVFP4's output factor: ``(amax_a * amax_b) * fp32(1/(top_a * top_b))`` (TransformerEngine's
    alpha; Four Over Six's bound in ``top``), or with MS-EDEN the product of the tensor decode
    scales (an amax operand's ``amax * fp32(1/top)``)."""
    assert pa.global_scale is not None and pb.global_scale is not None
    if pa.top is not None and pb.top is not None:
        return (pa.global_scale * pb.global_scale) * nv_alpha(pa.top, pb.top)

    def dec(p: PackedOperand) -> torch.Tensor:
        assert p.global_scale is not None
        return p.global_scale if p.top is None else p.global_scale * rcp(p.top)

    return dec(pa) * dec(pb)


def scaled_mm_reference(pa: PackedOperand, pb: PackedOperand) -> torch.Tensor:
    """``scaled_mm`` in FP32 torch operations on the decoded operands (any device)."""
    out = dequantize_packed(pa) @ dequantize_packed(pb).t()
    return _unpad(out, pa.rows, pb.rows)


Gemm = Callable[[PackedOperand, PackedOperand], torch.Tensor]


class NativeBackend:
    """Quantize with the ``backends`` quantizer, multiply on the hardware's scaled GEMM.

    ``gemm`` computes the product of two packed operands: ``scaled_mm`` (the hardware), or
    ``scaled_mm_reference`` to run the whole path on a device without one (tests).
    """

    name = "native"

    def __init__(self, gemm: Gemm = scaled_mm) -> None:
        self.gemm = gemm
        self._layouts: dict[torch.device, Layout] = {}

    def check(self, recipe: Recipe, device: torch.device) -> None:
        """Refuse what the device cannot run (``check_recipe``; ``convert_model`` then holds the
        GEMMs to the emulation: ``selfcheck.self_check``)."""
        device = torch.device(device)
        arch = device_arch(device)
        check_recipe(recipe, capability_key(device), device_name(device), build_limits(arch))
        self._layouts[device] = layout_for(arch)  # before any traced call

    def mm(
        self,
        a: torch.Tensor | QTensor,
        b: torch.Tensor | QTensor,
        gemm: GemmRecipe,
        keys: GemmKeys,
        signs: torch.Tensor | None,
    ) -> torch.Tensor:
        if gemm.a is None or gemm.b is None:
            raise UnsupportedFormatError(
                f"backend native: GEMM {gemm.short()} has a high-precision operand; a native GEMM "
                "needs both operands quantized (use `backend: emulated`)"
            )
        device = a.codes.device if isinstance(a, QTensor) else a.device
        # read, not filled, here: a traced model would guard on the dict changing after its first
        # call and compile again (``check`` fills it, eagerly)
        layout = self._layouts.get(device) or layout_for(device_arch(device))
        rot = gemm.rotation(signs)

        def pack(
            t: torch.Tensor | QTensor, spec: QuantSpec, key: int | torch.Tensor
        ) -> PackedOperand:
            if isinstance(t, QTensor):  # quantized by the caller: its codes as they are
                return pack_quantized(t, layout=layout, device=device)
            return pack_operand(t, spec, key=key, hadamard=rot, layout=layout)

        pa = pack(a, gemm.a, keys.a)  # (M, K)
        pb = pack(b, gemm.b, keys.b)  # (N, K)
        out = self.gemm(pa, pb)  # (M, N) float32
        comp = gemm.output_scale  # undoes the clip-free SR prescale
        return out * comp if comp != 1.0 else out


def _unpad(out: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The (rows, cols) top-left of a padded GEMM output, contiguous like ``emulated``'s."""
    if out.shape == (rows, cols):
        return out
    return out[:rows, :cols].contiguous()


__all__ = [
    "CAPABILITIES",
    "CUDA_LAYOUT",
    "NV_ALPHA",
    "GemmCall",
    "HAS_V2",
    "Layout",
    "NativeBackend",
    "alpha",
    "PackedOperand",
    "build_limits",
    "check_recipe",
    "dequantize_packed",
    "device_arch",
    "device_name",
    "formats_for",
    "gemm_call",
    "layout_for",
    "pack_operand",
    "pack_quantized",
    "preswizzle_scales",
    "scaled_mm",
    "scaled_mm_reference",
    "supported_formats",
    "swizzle_scales",
    "to_fnuz",
    "unpreswizzle_scales",
    "unswizzle_scales",
]
