"""Block quantization: MXFP4/MXFP8 (E8M0 scales), NVFP4 (E4M3 block + FP32 tensor scale), FP8 per tensor.

Two entry points; every path below is bit-identical to the reference, and tested so:

- ``quantize(x, spec, axis)`` returns a ``QTensor`` (element codes + scale codes + metadata) whose
  ``dequantize()`` gives the values a GEMM on native hardware would consume;
- ``fake_quantize(x, spec, axis)`` returns those dequantized values directly, fused in one pass (the
  training path).

Both run the C kernel of ``ckernel.py`` on the CPU and, on a GPU (or a CPU without a C compiler),
the branch-free torch arithmetic of ``torch_path.py``, compiled into fused kernels on CUDA
(``quantize_fused``/``fake_quantize_fused`` call that path directly, on any device). The types
they take and return (``QuantSpec``, ``QTensor``, the formats) are ``operand.py``'s; the
package's face (``backends.quant``) exports them all.

The NVFP4 variants of the 2026 recipes (``variants.py``: Four Over Six's ``scale_rule``, MS-EDEN's
``rounding: eden``, double-block ``outer_block``) have their own modules and run on the torch path of
``torch_path.py`` on every device (the C kernel has none of them).

``reference.py`` holds the readable specification (``quantize_reference``: grid search for rounding,
``frexp`` for the shared exponent) that every path is tested against. The rules:

- quantization runs along ``axis`` (a GEMM's reduction dimension) in blocks of ``spec.block``; a
  ragged last block is zero padded (padding changes no amax and is dropped from the output);
- with 2-D blocks (``spec.block_rows`` > 1, a 2-D tensor only) one scale serves a square tile of
  ``block_rows`` rows x ``block`` elements along ``axis``: the tile's amax decides it, and a ragged
  tile is zero padded likewise. Element rounding is per element as ever, so a tensor and its
  transpose quantize to the same values (``QTensor.t`` gives one from the other without rounding);
- elements round to nearest, ties to even, then saturate to +-max; or stochastically (round up with
  probability equal to the fractional distance, from ``rng.uniform24(key, flat_index)``);
- a block containing NaN or +-Inf is entirely NaN (E8M0 scale code 255, E4M3 scale code 0x7F); for
  the tensor-scaled formats (NVFP4, FP8) a non-finite value anywhere makes the whole tensor NaN;
- an all-zero block gets the smallest scale 2^-127 and zero elements (MX formats).

NVFP4 follows TransformerEngine's NVFP4 quantizer bit for bit (its reference
``NVFP4QuantizerRef._quantize_blockwise_reference`` in
``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`` and the CUDA kernels of
``transformer_engine/common/cast/nvfp4/``), every step one IEEE float32 operation:

- tensor encode scale ``S_enc = min(2688 / amax, FLT_MAX)`` (2688 = 448 * 6), and ``S_enc = 1`` for
  ``amax == 0`` (TE's kernel, ``compute_global_encode_scaling_factor_FP4``; TE's Python reference
  keeps ``FLT_MAX`` there, which gives the same codes and scales); ``S_dec = 1 / S_enc``;
- block decode scale ``s = E4M3_RNE(min(amax_b * (S_enc * fp32(1/6)), 448))``: the multiplier
  ``S_enc * fp32(1/6)`` first, then the block amax times it (not ``(amax_b / 6) * S_enc``);
- element encode factor ``e = min(1 / (fp32(s) * S_dec), FLT_MAX)``: the product first, then one
  division. A block whose ``s`` is 0 gets ``e = FLT_MAX``, so its non-zero elements saturate to
  +-6 (their values are 0 all the same: ``s = 0`` decodes them);
- elements ``E2M1_RNE(x * e)`` (``x * (e * 0.75)`` with the prescale), saturated to +-6, keeping the
  sign of zero (TE's hardware conversion does; its Python table maps an exact -0 to code 0);
- decoded value ``q * ((fp32(s) * amax) * fp32(1/2688))`` (TE's ``dequantize_nvfp4``), so a
  ``QTensor`` keeps the tensor amax (``global_amax``); a native GEMM multiplies the codes with the
  E4M3 scales and then by ``alpha = (amax_a * amax_b) * fp32(1/7225344)`` (TE's
  ``compute_nvfp4_per_tensor_scale_kernel``; 7225344 = 2688^2).

Non-finite inputs are ours (TE has no rule): the whole tensor is NaN, as above.

Where torchao departs from the OCP MX rules we follow the rules (see ``tests/backends/quant/test_torchao.py``):
for blocks whose E8M0 scale is 2^-127 (code 0) torchao divides the elements by 2^-126 (its
``F32_MIN_NORMAL`` clamp, a Triton work-around it documents as less correct), and under RCEIL it
multiplies by 1.0 (TransformerEngine's ``exp2f_rcp`` convention), flushing the block; we divide by
2^-127 as the OCP rules say.
For RCEIL its eager fallback computes ``ceil(log2(d))`` with float32 ``log2``, which returns exactly
``k`` for a descale just above ``2^k`` when the float32 spacing at ``k`` is coarse (e.g. k = 100); we use
the exact ceiling, as the ``cvt.rp.satfinite.ue8m0`` instruction does.
"""

from __future__ import annotations

import ctypes
import math

import torch

from backends.quant import ckernel, double_block, four_over_six, ms_eden, torch_path
from backends.quant.arith import F32_MAX, Elem, Plan
from backends.quant.formats import E4M3, ScaleMode
from backends.quant.hadamard import hadamard_transform
from backends.quant.operand import QuantSpec
from backends.quant.qtensor import QTensor
from backends.quant.rotation import Rotation, check_size, rotation

_SCALE_KIND_CODES = {"e8m0": 0, "nv": 1, "tensor": 2}
_MODE_CODES = {ScaleMode.FLOOR: 0, ScaleMode.CEIL: 1, ScaleMode.EVEN: 2, ScaleMode.RCEIL: 3}
_TENSOR_BLOCK = 256  # loop granularity of the per-tensor formats in the kernel (no block scales)


# ----------------------------------------------------------------------------------------------
# argument checks shared by every entry point


def check_args(x: torch.Tensor, spec: QuantSpec, axis: int) -> int:
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec, got {type(spec).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"quantize needs a floating-point tensor (float32, bfloat16, float16, float64), "
            f"got {x.dtype}"
        )
    if x.dim() == 0:
        raise ValueError("quantize needs a tensor with at least one dimension")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {tuple(x.shape)}")
    if spec.block_rows != 1 and x.dim() != 2:
        raise ValueError(
            f"2-D blocks ({spec.block_rows}x{spec.block}) need a 2-D tensor, got shape "
            f"{tuple(x.shape)}"
        )
    return axis % x.dim()


def global_scales(x: torch.Tensor, spec: QuantSpec) -> tuple[float, float, bool, float]:
    """(encode, decode, finite, amax) for the tensor-level scale of NVFP4 / per-tensor FP8: encode
    ``max / amax`` (NVFP4: 2688 / amax) in float32, saturated at the float32 maximum, 1 for an
    all-zero or non-finite tensor; decode its float32 reciprocal; amax NaN if not finite."""
    lo, hi = torch.aminmax(x.detach().reshape(-1))
    amax = torch.maximum(lo.abs(), hi.abs()).float().cpu()
    if not bool(torch.isfinite(amax)):
        return 1.0, 1.0, False, math.nan
    top = spec.fmt.elem.max * (E4M3.max if spec.fmt.scale == "nv" else 1.0)  # 448 * 6 for NVFP4
    if float(amax) == 0.0:
        enc = torch.ones((), dtype=torch.float32)
    else:
        enc = torch.clamp(torch.tensor(top, dtype=torch.float32) / amax, max=F32_MAX)
    dec = torch.ones((), dtype=torch.float32) / enc
    return float(enc), float(dec), True, float(amax)


# ----------------------------------------------------------------------------------------------
# fused path (C kernel on the CPU)


def spec_key(key: int | torch.Tensor) -> int:
    """The 32-bit key as the C kernel takes it (a tensor key is read on the CPU: no device sync)."""
    return int(key) & 0xFFFFFFFF


def run_kernel(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    key: int | torch.Tensor,
    out_dtype: torch.dtype,
    elements: bool,
    hadamard: Rotation | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, float | None, float | None]:
    """Returns (output in x's shape, block scale codes ``(..., nb)`` with the axis last or None,
    global decode scale or None, tensor amax (NVFP4) or None)."""
    f = spec.fmt
    base, kaxis, how = ckernel.layout(x.detach(), axis)
    shape = base.shape
    signs = None
    if hadamard is not None and hadamard.signs is not None:  # None: dht
        signs = hadamard.signs.detach().to(torch.float32).contiguous()
    outer, K, inner = math.prod(shape[:kaxis]), shape[kaxis], math.prod(shape[kaxis + 1 :])
    if f.scale == "tensor" and spec.rounding == "rne":
        # one scale for all and no random stream: elementwise, so the axis does not matter and the
        # kernel runs over the memory in order (a strided axis would cost a slower loop)
        outer, K, inner = 1, base.numel(), 1
    block = spec.block if f.scale != "tensor" else _TENSOR_BLOCK
    nb = -(-K // block)
    out_dt = torch.float32 if elements else out_dtype
    scales: torch.Tensor | None = None
    out = torch.empty(shape, dtype=out_dt)
    if f.scale != "tensor":
        scales = torch.empty((outer, nb, inner), dtype=torch.uint8)
    # the tensor amax and scales of NVFP4 / per-tensor FP8 are computed by the kernel, in the same
    # parallel region as the quantization (as global_scales does, bit for bit)
    g_out = (ctypes.c_float * 3)()
    p = ckernel.QParams(
        outer=outer,
        K=K,
        inner=inner,
        block=block,
        in_dtype=ckernel.DTYPE_CODES[base.dtype],
        out_dtype=ckernel.DTYPE_CODES[out.dtype],
        out_kind=1 if elements else 0,
        mbits=f.elem.mbits,
        emin=f.elem.emin,
        emax=f.elem.emax,
        maxval=f.elem.max,
        scale_kind=_SCALE_KIND_CODES[f.scale],
        scale_mode=_MODE_CODES[spec.scale_mode],
        global_out=ctypes.addressof(g_out),
        prescale=spec.prescale_factor,
        sr=1 if spec.rounding == "sr" else 0,
        key=spec_key(key),
        nthreads=torch.get_num_threads(),
        had_g=hadamard.size if hadamard else 0,
        had_norm=1 / math.sqrt(hadamard.size) if hadamard else 1.0,
        had_signs=signs.data_ptr() if signs is not None else None,
        x=base.data_ptr(),
        out=out.data_ptr(),
        scales=scales.data_ptr() if scales is not None else None,
    )
    ckernel.run(p)
    gdec_out = g_out[1] if f.scale != "e8m0" else None
    amax_out = g_out[2] if f.scale == "nv" else None
    if scales is not None:
        lead, trail = shape[:kaxis], shape[kaxis + 1 :]
        scales = scales.reshape(*lead, nb, *trail).movedim(len(lead), -1)
    # the scales are (..., nb) over base's non-K dimensions, which are x's in the same order
    return ckernel.restore(out, axis, how), scales, gdec_out, amax_out


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int | torch.Tensor = 0,
    hadamard: Rotation | None = None,
) -> QTensor:
    """Quantize ``x`` along ``axis``; ``key`` seeds stochastic rounding (see ``rng.derive_key``).

    ``hadamard=Rotation(size, signs)`` (or a plain ``(size, signs)``; signs None: dht) quantizes
    ``hadamard_transform(x, axis, size, signs)`` instead (the returned tensor has its shape, ``axis``
    padded to a multiple of ``size``), in one pass on a GPU.
    """
    hadamard = rotation(hadamard)
    axis = check_args(x, spec, axis)
    if hadamard is not None:
        check_size(hadamard.size)
    # the C kernel scales 1-D blocks only, and runs none of the ``variants``
    if not ckernel.usable(x) or spec.block_rows != 1 or spec.variant:
        return quantize_fused(x, spec, axis, key, hadamard)
    if hadamard is not None:
        x = hadamard_transform(x, axis, hadamard.size, hadamard.signs)
    q, scales, gdec, gamax = run_kernel(x, spec, axis, key, torch.float32, elements=True)
    B = spec.block or x.shape[axis]
    qm = q.movedim(axis, -1)
    K = qm.shape[-1]
    qm = torch.nn.functional.pad(qm, (0, -(-K // B) * B - K))
    scales = None if scales is None else scales.contiguous()
    g = None if gdec is None else torch.tensor(gdec, dtype=torch.float32)
    a = None if gamax is None else torch.tensor(gamax, dtype=torch.float32)
    return QTensor(spec.fmt.elem.encode(qm), scales, g, spec, axis, tuple(x.shape), a)


def fake_quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int | torch.Tensor = 0,
    out_dtype: torch.dtype | None = None,
    hadamard: Rotation | None = None,
) -> torch.Tensor:
    """Quantize-dequantize in one fused pass: the values the GEMM sees (training path).

    Output dtype defaults to x's; MX dequantized values are exact in bfloat16 and float32.
    ``hadamard=Rotation(size, signs)`` (or a plain ``(size, signs)``; signs None: dht) first applies
    ``hadamard_transform(x, axis, size, signs)`` (output padded along ``axis`` to a multiple of
    ``size``, float32 by default), fused into the same pass with the same bits as the two steps: on
    a GPU always, on the CPU for the MX formats along a contiguous ``axis`` whose length is a
    multiple of the block and the size.
    """
    hadamard = rotation(hadamard)
    axis = check_args(x, spec, axis)
    od = out_dtype or (torch.float32 if hadamard is not None else x.dtype)
    if hadamard is not None:
        check_size(hadamard.size)
    if (
        not (ckernel.usable(x) and od in ckernel.DTYPE_CODES)
        or spec.block_rows != 1
        or spec.variant
    ):
        return fake_quantize_fused(x, spec, axis, key, od, hadamard)
    if hadamard is not None:
        size, signs = hadamard
        unit = max(size, spec.block)
        fusable = (
            # NVFP4's tensor scale needs the amax of the transformed tensor: not in one pass
            spec.fmt.scale == "e8m0"
            and x.shape[axis] % unit == 0
            and x.movedim(axis, -1).is_contiguous()
            and unit <= 1024
        )
        if fusable:
            return run_kernel(x, spec, axis, key, od, elements=False, hadamard=hadamard)[0]
        x = hadamard_transform(x, axis, size, signs)
    return run_kernel(x, spec, axis, key, od, elements=False)[0]


# ----------------------------------------------------------------------------------------------
# fused torch path (GPUs; the CPU without the C kernel)


def _plan(spec: QuantSpec, hadamard: Rotation | None, values: bool, od: torch.dtype) -> Plan:
    if hadamard is not None:
        check_size(hadamard.size)
    return Plan(
        elem=Elem.of(spec.fmt.elem),
        scale=spec.fmt.scale,
        block=spec.block,
        rows=spec.block_rows,
        mode=_MODE_CODES[spec.scale_mode],
        sr=spec.rounding == "sr",
        prescale=spec.prescale_factor,
        hadamard=hadamard.size if hadamard else 0,
        values=values,
        out_dtype=od,
        rule=spec.scale_rule or "",
        pick_nearest=spec.scale_pick == "nearest",
        eden=spec.rounding == "eden",
        outer=spec.outer_block or 0,
    )


def _impl(spec: QuantSpec) -> torch_path.PlanRunner | None:
    """The quantizer of a ``variants`` option (None: ``torch_path.run``)."""
    if spec.scale_rule is not None:
        return four_over_six.run
    if spec.rounding == "eden":
        return ms_eden.run
    if spec.outer_block:
        return double_block.run
    return None


def quantize_fused(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int | torch.Tensor = 0,
    hadamard: Rotation | None = None,
    compile: bool | None = None,
) -> QTensor:
    """``quantize`` on the fused torch path (``torch_path.py``), whatever the device: what runs on a
    GPU. ``compile`` forces ``torch.compile`` on or off (default: on CUDA only)."""
    hadamard = rotation(hadamard)
    axis = check_args(x, spec, axis)
    xm = x.detach().movedim(axis, -1)
    signs = None if hadamard is None else hadamard.signs
    plan = _plan(spec, hadamard, False, torch.float32)
    codes, scales, gdec, gamax = torch_path.call(xm, key, signs, plan, compile, _impl(spec))
    shape = list(x.shape)
    if hadamard is not None:
        shape[axis] = -(-shape[axis] // hadamard.size) * hadamard.size
    if spec.outer_block:  # its outer scales come in the tensor-decode slot
        return QTensor(codes, scales, None, spec, axis, tuple(shape), outer_scales=gdec)
    return QTensor(codes, scales, gdec, spec, axis, tuple(shape), gamax)


def fake_quantize_fused(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    key: int | torch.Tensor = 0,
    out_dtype: torch.dtype | None = None,
    hadamard: Rotation | None = None,
    compile: bool | None = None,
) -> torch.Tensor:
    """``fake_quantize`` on the fused torch path (see ``quantize_fused``)."""
    hadamard = rotation(hadamard)
    axis = check_args(x, spec, axis)
    od = out_dtype or (torch.float32 if hadamard is not None else x.dtype)
    xm = x.detach().movedim(axis, -1)
    signs = None if hadamard is None else hadamard.signs
    out = torch_path.call(xm, key, signs, _plan(spec, hadamard, True, od), compile, _impl(spec))[0]
    return out.movedim(-1, axis)


__all__ = [
    "check_args",
    "fake_quantize",
    "fake_quantize_fused",
    "global_scales",
    "quantize",
    "quantize_fused",
    "run_kernel",
    "spec_key",
]
