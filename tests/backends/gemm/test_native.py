"""The ``native`` backend: packing, scale swizzling, parity with ``emulated`` (its capability checks:
``test_native_capabilities.py``).

On the CPU: the packed operands decode to exactly the emulated quantizer's codes, scales and values;
the swizzle is torchao's ``to_blocked`` bit for bit; per-tensor FP8 runs through the real
``torch._scaled_mm`` (torch has a CPU kernel for it) and the block formats through
``scaled_mm_reference``, both matching ``emulated`` within FP32-accumulation tolerance. The GPU
tests compare the hardware GEMMs with ``emulated`` and skip with the hardware they need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from backends.gemm import GemmKeys, UnsupportedFormatError, native, supported_formats
from backends.gemm.emulated import EmulatedBackend
from backends.gemm.native import (
    CUDA_LAYOUT,
    NativeBackend,
    dequantize_packed,
    device_arch,
    device_name,
    layout_for,
    pack_operand,
    scaled_mm,
    scaled_mm_reference,
    swizzle_scales,
    to_fnuz,
    unswizzle_scales,
)
from backends.gemm.selfcheck import accumulation_bits
from backends.layer import QuantLinear
from backends.quant import (
    E4M3,
    E5M2,
    FORMATS,
    QuantSpec,
    fake_quantize,
    hadamard_transform,
    quantize,
    unpack_fp4,
)
from backends.recipes import GemmRecipe, HadamardSpec, Recipe

KEYS = GemmKeys(a=1234, b=5678, signs=99)
ALL_FORMATS = list(FORMATS)
RAGGED = [(1, 32), (65, 100), (128, 256), (130, 64)]  # rows and K off every alignment


def _x(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x.view(-1)[:: max(1, x.numel() // 7)] *= 50  # a few outliers, so blocks differ in scale
    return x


def _signs(size: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(size, generator=g) < 0.5, -1.0, 1.0)


def _spec(fmt: str, sr: bool) -> QuantSpec:
    return QuantSpec(format=fmt, rounding="sr" if sr else "rne", prescale=sr)


def _accumulation_bound(
    aq: torch.Tensor, bq: torch.Tensor, ref: torch.Tensor, acc_bits: int = 24, out_bits: int = 24
) -> torch.Tensor:
    """Elementwise bound on |native - emulated| for a @ b^T of the quantized values aq, bq.

    Both sides are FP32 dot products of the same values, so each is within (K+2)·2^-24·(|a|·|b|)
    of the exact product (K additions plus the rounding of the dequantized values and of the
    scale); ``acc_bits`` adds a tensor core that keeps fewer bits while accumulating (Hopper's
    FP8: about 13), ``out_bits`` an output in a narrower type (bf16: 8).
    """
    K = aq.shape[1]
    mag = aq.abs() @ bq.abs().t()
    return mag * (2 * (K + 2) * 2.0**-24 + 2.0**-acc_bits) + ref.abs() * 2.0**-out_bits


def _within_fp32_accumulation(
    got: torch.Tensor, ref: torch.Tensor, a: torch.Tensor, b: torch.Tensor, gemm: GemmRecipe
) -> bool:
    """Whether ``got`` is within ``_accumulation_bound`` of ``ref``, both ``a @ b^T`` of the
    operands quantized as ``gemm`` says (``KEYS``)."""
    aq = fake_quantize(a, gemm.a, axis=1, key=KEYS.a, out_dtype=torch.float32)
    bq = fake_quantize(b, gemm.b, axis=1, key=KEYS.b, out_dtype=torch.float32)
    return bool(((got - ref).abs() <= _accumulation_bound(aq, bq, ref)).all())


# ----------------------------------------------------------------------------------------------
# scale swizzling


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (128, 4), (129, 5), (300, 9), (1000, 37)])
def test_swizzle_matches_torchao_to_blocked(shape):
    utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
    g = torch.Generator().manual_seed(shape[0])
    s = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    assert torch.equal(swizzle_scales(s), utils.to_blocked(s))
    e8 = s.view(torch.float8_e8m0fnu)  # the dtype the GEMM gets; same bytes
    assert torch.equal(swizzle_scales(e8).view(torch.uint8), utils.to_blocked(s))


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (128, 4), (129, 5), (300, 9), (256, 64)])
def test_unswizzle_inverts_swizzle(shape):
    g = torch.Generator().manual_seed(1)
    s = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    blocked = swizzle_scales(s)
    rows, cols = shape
    assert blocked.numel() == -(-rows // 128) * 128 * (-(-cols // 4) * 4)  # what _scaled_mm checks
    assert torch.equal(unswizzle_scales(blocked, rows, cols), s)


def test_swizzle_places_each_scale_where_cublas_reads_it():
    # cuBLAS's 1D block-scaling layout: in a 128x4 tile, row 32i + j, column c sits at 16j + 4i + c;
    # tiles follow each other along the columns first. Scale (r, c) is encoded as r * 8 + c.
    rows, cols = 256, 8
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    blocked = swizzle_scales(r * 8 + c)
    for row, col in [(0, 0), (1, 0), (31, 3), (32, 0), (33, 2), (127, 3), (128, 0), (200, 7)]:
        tile = (row // 128) * (cols // 4) + col // 4
        i, j = (row % 128) // 32, row % 32
        assert int(blocked[tile * 512 + 16 * j + 4 * i + col % 4]) == row * 8 + col


# ----------------------------------------------------------------------------------------------
# packing reuses the quantizer: same codes, same scales, same values


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("shape", RAGGED)
def test_packed_fp4_codes_unpack_to_the_emulated_quantizers_codes(fmt, sr, shape):
    x = _x(*shape).t().contiguous().t()  # a transposed view, as dgrad and wgrad pass
    spec = _spec(fmt, sr)
    p = pack_operand(x, spec, key=KEYS.a)
    q = quantize(x, spec, axis=1, key=KEYS.a)
    rows, k = q.codes.shape
    assert p.data.dtype == torch.float4_e2m1fn_x2
    codes = unpack_fp4(p.data)
    assert torch.equal(codes[:rows, :k], q.codes)
    assert not codes[rows:].any() and not codes[:, k:].any()  # zero padding
    assert q.scales is not None
    R, Kp = codes.shape
    scales = unswizzle_scales(p.scale.view(torch.uint8), R, Kp // spec.block)
    assert torch.equal(scales[: q.scales.shape[0], : q.scales.shape[1]], q.scales)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("shape", RAGGED)
def test_packed_fp8_codes_are_the_emulated_quantizers_codes(fmt, shape):
    x = _x(*shape)
    spec = _spec(fmt, sr=True)
    p = pack_operand(x, spec, key=KEYS.b)
    q = quantize(x, spec, axis=1, key=KEYS.b)
    rows, k = q.codes.shape
    assert p.data.dtype == spec.fmt.elem.torch_dtype
    assert torch.equal(p.data.view(torch.uint8)[:rows, :k], q.codes)
    if spec.fmt.scale == "tensor":
        assert q.global_dec is not None and p.scale.dtype == torch.float32
        assert float(p.scale) == float(q.global_dec)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("hadamard", [None, (16, "none"), (32, "fixed")], ids=str)
@pytest.mark.parametrize("shape", RAGGED)
def test_dequantized_packed_operand_equals_fake_quantize(fmt, sr, hadamard, shape):
    x = _x(*shape).to(torch.bfloat16)
    spec = _spec(fmt, sr)
    had = None
    if hadamard is not None:
        size, policy = hadamard
        had = (size, _signs(size) if policy == "fixed" else None)
    p = pack_operand(x, spec, key=KEYS.a, hadamard=had)
    # the quantizer's documented semantics: transform, then quantize
    xt = x if had is None else hadamard_transform(x, 1, had[0], had[1])
    ref = fake_quantize(xt, spec, axis=1, key=KEYS.a, out_dtype=torch.float32)
    got = dequantize_packed(p)
    rows, k = ref.shape
    torch.testing.assert_close(got[:rows, :k], ref, rtol=0, atol=0)
    assert not got[rows:].any() and not got[:, k:].any()


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_non_finite_blocks_stay_nan_through_packing(fmt):
    x = _x(64, 64)
    x[3, 5] = float("nan")
    x[10, 40] = float("inf")
    spec = QuantSpec(format=fmt)
    for layout in (CUDA_LAYOUT, layout_for("gfx942"), layout_for("gfx950")):
        got = dequantize_packed(pack_operand(x, spec, layout=layout))[:64, :64]
        ref = fake_quantize(x, spec, axis=1, out_dtype=torch.float32)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "gfx942", "gfx950"])
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_packed_shapes_meet_the_scaled_mm_checks(arch, fmt):
    # the element counts torch._scaled_mm checks (aten/src/ATen/native/cuda/ScaledBlas.cpp)
    layout = layout_for(arch)
    spec = QuantSpec(format=fmt)
    x = _x(65, 100)
    p = pack_operand(x, spec, layout=layout)
    R, width = p.data.shape
    K = width * 2 if spec.fmt.is_fp4 else width
    assert R % layout.row_align == 0 and K % layout.k_align == 0 and p.rows == 65
    assert p.data.is_contiguous() and p.scale.is_contiguous()
    if spec.fmt.scale == "tensor":
        assert p.scale.dtype == torch.float32 and p.scale.numel() == 1
        return
    B = spec.block
    if layout.swizzle:  # round_up(rows, 128) * round_up(ceil(K / block), 4), flat
        assert p.scale.numel() == -(-R // 128) * 128 * (-(-(K // B) // 4) * 4)
    else:  # ROCm: row-major (rows, K / block)
        assert p.scale.shape == (R, K // B)
    want = torch.float8_e8m0fnu if spec.fmt.scale == "e8m0" else torch.float8_e4m3fn
    assert p.scale.dtype == want


@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=lambda e: e.name)
def test_fnuz_codes_mean_exactly_half_the_ocp_value(elem):
    # MI300's FP8 (FNUZ) has an exponent bias one larger: the same bits mean half as much, so the
    # codes carry over with a doubled scale; -0 (FNUZ's NaN bit pattern) becomes +0, non-finite
    # codes (NaN; E5M2's +-inf, which the saturating quantizer never emits) become NaN (0x80).
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ocp = codes.view(elem.torch_dtype).float()
    ocp = torch.where(torch.isfinite(ocp), ocp, torch.nan)
    fnuz = to_fnuz(codes, elem).view(
        torch.float8_e4m3fnuz if elem is E4M3 else torch.float8_e5m2fnuz
    )
    torch.testing.assert_close(fnuz.float() * 2, ocp, rtol=0, atol=0, equal_nan=True)
    assert int(to_fnuz(torch.tensor([0x80], dtype=torch.uint8), elem)) == 0


# ----------------------------------------------------------------------------------------------
# the GEMM path against emulated (CPU)


@pytest.mark.parametrize("fa,fb", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e4m3")])
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_native_fp8_through_torch_scaled_mm_matches_emulated(fa, fb, sr, arch):
    # torch._scaled_mm has a CPU kernel for per-tensor FP8, so the real call runs here
    a, b = _x(70, 200, seed=1), _x(33, 200, seed=2).t().contiguous().t()
    gemm = GemmRecipe(a=_spec(fa, sr), b=_spec(fb, sr))
    native = NativeBackend()
    native._layouts[a.device] = layout_for(arch)  # the MI300 layout (FNUZ codes) on the CPU too
    try:
        got = native.mm(a, b, gemm, KEYS, None)
    except RuntimeError as e:
        # the oneDNN kernel that an AVX-512 CPU's torch._scaled_mm takes for two E4M3 operands
        # refuses FNUZ codes (the reference kernel other CPUs take accepts them): the same packed
        # operands then go through the reference GEMM, so the FNUZ packing is still checked
        if not (arch == "gfx942" and "itensor_view_from_dense" in str(e)):
            raise
        native.gemm = scaled_mm_reference
        got = native.mm(a, b, gemm, KEYS, None)
    ref = EmulatedBackend().mm(a, b, gemm, KEYS, None)
    assert got.shape == ref.shape == (70, 33) and got.dtype == torch.float32
    assert _within_fp32_accumulation(got, ref, a, b, gemm)


def test_a_cpu_without_the_v2_kernel_multiplies_through_v1(monkeypatch):
    # torch 2.11 has torch.nn.functional.scaled_mm for CUDA only: its CPU runs torch._scaled_mm.
    # Forced through v1, the backend's GEMM is torch._scaled_mm to the bit; v1 and v2 agree to
    # FP32 accumulation, not always to the bit: the oneDNN kernel an AVX-512 CPU's v1 takes sums K
    # in its own order (a few ulps off v2's on the Intel Xeon); the reference kernel other CPUs'
    # v1 takes (the AMD EPYC's) gives v2's bits
    a, b = _x(70, 200, seed=1), _x(33, 200, seed=2)
    gemm = GemmRecipe(a=_spec("fp8_e4m3", False), b=_spec("fp8_e4m3", False))
    got = NativeBackend().mm(a, b, gemm, KEYS, None)  # the route this torch takes (2.11: v1)
    monkeypatch.setitem(native.V2_ON, "cpu", False)
    v1 = NativeBackend().mm(a, b, gemm, KEYS, None)
    pa, pb = pack_operand(a, gemm.a, key=KEYS.a), pack_operand(b, gemm.b, key=KEYS.b)
    direct = torch._scaled_mm(pa.data, pb.data.t(), pa.scale, pb.scale, out_dtype=torch.float32)
    assert torch.equal(v1.view(torch.int32), direct[:70, :33].contiguous().view(torch.int32))
    assert _within_fp32_accumulation(got, v1, a, b, gemm)
    if torch.version.cuda:  # a CUDA build has the v2 kernel for CUDA (2.11 and 2.13 alike)
        assert native.V2_ON["cuda"] == native.HAS_V2


def _reference_path_vs_emulated(fmt: str, sr: bool, signs: str | None) -> None:
    # quantize, pack, swizzle, GEMM on the packed tensors, cut padding, undo the SR prescale
    a, b = _x(65, 96, seed=4), _x(130, 96, seed=5)
    spec = _spec(fmt, sr)
    h = None if signs is None else HadamardSpec(size=32, signs=signs)  # type: ignore[arg-type]
    gemm = GemmRecipe(a=spec, b=spec, hadamard=h)
    s = _signs(32) if signs == "random" else None
    got = NativeBackend(gemm=scaled_mm_reference).mm(a, b, gemm, KEYS, s)
    ref = EmulatedBackend().mm(a, b, gemm, KEYS, s)
    had = None if h is None else (32, s)
    aq = fake_quantize(a, spec, axis=1, key=KEYS.a, out_dtype=torch.float32, hadamard=had)
    bq = fake_quantize(b, spec, axis=1, key=KEYS.b, out_dtype=torch.float32, hadamard=had)
    assert got.shape == ref.shape == (65, 130)
    assert ((got - ref).abs() <= _accumulation_bound(aq, bq, ref)).all()


@pytest.mark.parametrize(
    "fmt,signs",
    [(f, s) for f in ("mxfp4", "mxfp8_e4m3", "mxfp8_e5m2") for s in (None, "none", "random")]
    + [("nvfp4", None), ("fp8_e4m3", None), ("fp8_e5m2", None)],
)
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
def test_native_path_with_reference_gemm_matches_emulated(fmt, sr, signs):
    _reference_path_vs_emulated(fmt, sr, signs)


@pytest.mark.parametrize("signs", ["none", "random"])
def test_emulated_nvfp4_with_hadamard_matches_the_native_path_on_the_cpu(signs):
    # NVFP4's tensor scale comes from the amax of the transformed operand on every path
    _reference_path_vs_emulated("nvfp4", False, signs)


def test_sr_prescale_is_undone_as_emulated_does():
    # both operands scaled by 3/4 before rounding: the output is multiplied by (4/3)^2 = 16/9
    spec = QuantSpec(format="mxfp4", rounding="sr", prescale=True)
    ones = NativeBackend(gemm=lambda pa, pb: torch.ones(pa.rows, pb.rows))
    out = ones.mm(_x(4, 32), _x(3, 32), GemmRecipe(a=spec, b=spec), KEYS, None)
    assert torch.equal(out, torch.full((4, 3), 16 / 9, dtype=torch.float32))
    one_sided = GemmRecipe(a=spec, b=QuantSpec(format="mxfp4"))
    out = ones.mm(_x(4, 32), _x(3, 32), one_sided, KEYS, None)
    assert torch.equal(out, torch.full((4, 3), 4 / 3, dtype=torch.float32))


def _gemm_views(t: int = 64, d_in: int = 96, d_out: int = 128) -> dict[str, tuple]:
    """Each GEMM's operands as ``backends.layer.linear`` hands them to a backend, unpadded (every
    dimension a multiple of 32): fprop (X, W), dgrad (dY, W^T), wgrad (dY^T, X^T); transposes are
    views with the strides of a transpose."""
    x, w, dy = _x(t, d_in, seed=1), _x(d_out, d_in, seed=2), _x(t, d_out, seed=3)
    return {"fprop": (x, w), "dgrad": (dy, w.t()), "wgrad": (dy.t(), x.t())}


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad"])
def test_packed_operands_have_the_layout_cublaslt_multiplies(fmt, gemm):
    # cuBLASLt's scaled GEMM multiplies only a row-major mat_a by a column-major mat_b, and
    # scaled_mm passes (a, b.t()): both packed operands must be row-major, whatever the strides of
    # the view that was quantized (the CPU's _scaled_mm accepts any layout, so only this shows it)
    a, b = _gemm_views()[gemm]
    pa, pb = (pack_operand(t, QuantSpec(format=fmt)) for t in (a, b))
    assert pa.data.is_contiguous(), pa.data.stride()  # mat_a row-major
    mat_b = pb.data.t()
    assert mat_b.stride() == (1, mat_b.shape[0]), mat_b.stride()  # mat_b column-major


@pytest.mark.parametrize(
    "quantizer",
    ["opaque", pytest.param("traced", marks=pytest.mark.slow)],
)
def test_native_fp8_gemms_compile_with_inductor_as_cuda_needs_them(quantizer, monkeypatch):
    # Inductor's lowering of _scaled_mm applies cuBLASLt's layout rule on the CPU too ("mat_a must
    # be row_major"): each GEMM's operands, transposed views included, packed and multiplied in one
    # Inductor-compiled graph, and the products equal the eager ones; with the quantizer as an
    # opaque op (the default) and traced into the graph (ABLATE_QUANT_OPS=0)
    monkeypatch.setenv("ABLATE_QUANT_OPS", "1" if quantizer == "opaque" else "0")
    views = _gemm_views()
    e4m3, e5m2 = QuantSpec(format="fp8_e4m3"), QuantSpec(format="fp8_e5m2")
    specs = {"fprop": (e4m3, e4m3), "dgrad": (e5m2, e4m3), "wgrad": (e5m2, e4m3)}

    def gemms(*ts: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for i, g in enumerate(specs):
            sa, sb = specs[g]
            out.append(scaled_mm(pack_operand(ts[2 * i], sa), pack_operand(ts[2 * i + 1], sb)))
        return out

    args = [t for g in specs for t in views[g]]
    torch._dynamo.reset()
    compiled = torch.compile(gemms, backend="inductor", fullgraph=True, dynamic=False)
    for got, ref in zip(compiled(*args), gemms(*args), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_the_explicit_api_compiles_where_dynamo_cannot_trace_it(monkeypatch):
    """torch 2.11's Dynamo stops at ``F.scaled_mm`` (the builtin ``_scaled_mm_v2``): every native
    FP8 cell's ``fullgraph`` block failed to compile on an H200. Made untraceable here the same
    way, the GEMM still compiles in one graph (``ablate::scaled_mm_v2``, an opaque op) and
    multiplies as the eager call."""
    real = torch.nn.functional.scaled_mm
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", torch._dynamo.disable(real))
    e4m3, e5m2 = QuantSpec(format="fp8_e4m3"), QuantSpec(format="fp8_e5m2")

    def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return scaled_mm(pack_operand(a, e5m2), pack_operand(b, e4m3))

    a, b = _x(48, 96, seed=3), _x(40, 96, seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(gemm, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(a, b), gemm(a, b), rtol=0, atol=0)
    torch._dynamo.reset()


def test_scaled_mm_refuses_operands_of_different_k():
    pa = pack_operand(_x(16, 64), QuantSpec(format="fp8_e4m3"))
    pb = pack_operand(_x(16, 96), QuantSpec(format="fp8_e4m3"))
    with pytest.raises(ValueError, match="differ in K"):
        scaled_mm(pa, pb)


def test_mm_refuses_a_high_precision_operand():
    gemm = GemmRecipe(a=QuantSpec(format="fp8_e4m3"), b=None)
    with pytest.raises(UnsupportedFormatError, match="backend: emulated"):
        NativeBackend().mm(_x(16, 32), _x(16, 32), gemm, KEYS, None)


# ----------------------------------------------------------------------------------------------
# on the hardware

_ARCH = device_arch("cuda") if torch.cuda.is_available() else None
_HAS = supported_formats("cuda") if _ARCH else set()
_HERE = device_name("cuda") if _ARCH else "no GPU"
_NEEDS = {
    "fp8": "a GPU with FP8 GEMMs: NVIDIA sm_89 (Ada), sm_90 (Hopper) or newer, or AMD MI300+",
    "mxfp8_e4m3": "a GPU with MXFP8 GEMMs: NVIDIA Blackwell (sm_100, sm_103, sm_120) or AMD MI355X",
    "mxfp4": "a GPU with MXFP4 GEMMs: NVIDIA B200/B300 (sm_100, sm_103) or AMD MI355X (gfx950)",
    "nvfp4": "a GPU with NVFP4 GEMMs: NVIDIA Blackwell (sm_100, sm_103, sm_120)",
}


def _needs(fmt: str, key: str) -> Callable[[Any], Any]:
    """The marks of a test that needs ``fmt``'s native GEMM: ``gpu`` (``make gpu-check`` selects
    it), skipped without the hardware."""
    skip = pytest.mark.skipif(fmt not in _HAS, reason=f"needs {_NEEDS[key]}; this machine: {_HERE}")
    return lambda f: pytest.mark.gpu(skip(f))


def _tolerances(fmt: str) -> tuple[int, int]:
    """(acc_bits, out_bits) of the hardware GEMM for ``fmt`` on this device: the self-check's
    accumulation model (``selfcheck.accumulation_bits``: FP8 on Ada/Hopper adds in fixed point),
    and an 8-bit (bf16) output for MXFP4 on CUDA and the block formats on ROCm."""
    acc = accumulation_bits(fmt, _ARCH)
    block = FORMATS[fmt].scale != "tensor"
    out = 8 if block and (fmt == "mxfp4" or (_ARCH or "").startswith("gfx")) else 24
    return acc, out


def _gpu_parity(fa: str, fb: str, sr: bool) -> None:
    dev = torch.device("cuda")
    a = _x(8192 // 16, 1024, seed=7).to(dev, torch.bfloat16)
    b = _x(1536, 1024, seed=8).to(dev, torch.bfloat16).t().contiguous().t()
    gemm = GemmRecipe(a=_spec(fa, sr), b=_spec(fb, sr))
    got = NativeBackend().mm(a, b, gemm, KEYS, None)
    ref = EmulatedBackend().mm(a, b, gemm, KEYS, None)
    assert gemm.a is not None and gemm.b is not None
    aq = fake_quantize(a, gemm.a, axis=1, key=KEYS.a, out_dtype=torch.float32)
    bq = fake_quantize(b, gemm.b, axis=1, key=KEYS.b, out_dtype=torch.float32)
    acc, out = _tolerances(fa)
    err = (got - ref).abs()
    bound = _accumulation_bound(aq, bq, ref, acc, out)
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"
    assert float((got - ref).norm() / ref.norm()) < 2.0**-8  # and small overall, not only bounded


@_needs("fp8_e4m3", "fp8")
@pytest.mark.parametrize("fa,fb", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e4m3")])
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
def test_native_fp8_matches_emulated_on_the_gpu(fa, fb, sr):
    _gpu_parity(fa, fb, sr)


@pytest.mark.parametrize(
    "fmt,key", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4")]
)
@pytest.mark.parametrize("sr", [False, True], ids=["rne", "sr"])
@pytest.mark.gpu
def test_native_block_formats_match_emulated_on_the_gpu(fmt, key, sr):
    if fmt not in _HAS:
        pytest.skip(f"needs {_NEEDS[key]}; this machine: {_HERE}")
    _gpu_parity(fmt, fmt, sr)


@_needs("fp8_e4m3", "fp8")
def test_fp8_layer_trains_on_native_as_on_emulated():
    dev = torch.device("cuda")
    recipe = Recipe.from_shorthand(base="fp8")
    grads = {}
    for backend in ("emulated", "native"):
        torch.manual_seed(0)
        layer = QuantLinear(256, 512, recipe=recipe, backend=backend, device=dev)
        x = torch.randn(128, 256, device=dev, requires_grad=True)
        layer(x).square().mean().backward()
        assert layer.weight.grad is not None and x.grad is not None
        grads[backend] = (layer.weight.grad, x.grad)
    # the same quantized operands; dY's E5M2 codes may flip where the two forwards differ in the
    # last bits, so compare the gradients as wholes
    for g_nat, g_emu in zip(grads["native"], grads["emulated"], strict=True):
        assert float((g_nat - g_emu).norm() / g_emu.norm()) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(_ARCH is None, reason="needs a CUDA or ROCm GPU; this machine: no GPU")
def test_device_arch_names_the_gpu():
    assert _ARCH is not None and (_ARCH.startswith("sm_") or _ARCH.startswith("gfx"))
    assert device_name("cuda").endswith(f"({_ARCH})")


def test_a_weight_quantized_once_packs_as_it_is_and_matches_emulated():
    # NVIDIA's recipe: W quantized in 16x16 tiles once; fprop packs W, dgrad packs its transpose
    from backends.gemm.native import dequantize_packed, pack_operand, pack_quantized
    from backends.quant import quantize
    from backends.recipes import named_recipe

    r = named_recipe("nvidia_nvfp4")
    assert r.fprop.b is not None and r.dgrad.a is not None
    w, x, dy = _x(48, 80, seed=1), _x(33, 80, seed=2), _x(33, 48, seed=3)
    wq = quantize(w, r.fprop.b, axis=1, key=KEYS.b)
    for a, b, gemm in ((x, wq, r.fprop), (dy, wq.t(), r.dgrad)):
        got = NativeBackend(gemm=scaled_mm_reference).mm(a, b, gemm, KEYS, None)
        ref = EmulatedBackend().mm(a, b, gemm, KEYS, None)
        aq = fake_quantize(a, gemm.a, axis=1, key=KEYS.a, out_dtype=torch.float32)
        assert ((got - ref).abs() <= _accumulation_bound(aq, b.dequantize(), ref)).all()
    # packing the one quantization is packing a fresh quantization of W^T (round to nearest)
    p1 = pack_quantized(wq.t())
    p2 = pack_operand(w.t().contiguous(), r.dgrad.b, key=KEYS.b)
    assert torch.equal(p1.data.view(torch.uint8), p2.data.view(torch.uint8))
    assert torch.equal(p1.scale.view(torch.uint8), p2.scale.view(torch.uint8))
    assert torch.equal(dequantize_packed(p1), dequantize_packed(p2))


@pytest.mark.parametrize(
    ("fmt", "layout", "v2", "call"),
    [
        ("fp8_e4m3", "row-major", True, ("scaled_mm", "TensorWise", None)),
        ("mxfp8_e4m3", "128x4", True, ("scaled_mm", "BlockWise1x32", "SWIZZLE_32_4_4")),
        ("mxfp8_e4m3", "row-major", True, ("scaled_mm", "BlockWise1x32", "NO_SWIZZLE")),  # ROCm
        ("mxfp4", "128x4", True, ("scaled_mm", "BlockWise1x32", "SWIZZLE_32_4_4")),
        ("mxfp4", "row-major", True, ("scaled_mm", "BlockWise1x32", "NO_SWIZZLE")),  # < 7.13
        ("nvfp4", "128x4", True, ("scaled_mm", "BlockWise1x16", "SWIZZLE_32_4_4")),
        ("fp8_e5m2", "row-major", False, ("_scaled_mm", "TensorWise", None)),  # no v2
        ("nvfp4", "128x4", False, ("_scaled_mm", "BlockWise1x16", "SWIZZLE_32_4_4")),
    ],
)
def test_every_call_names_its_scaling_and_layout(fmt, layout, v2, call):
    got = native.gemm_call(QuantSpec(format=fmt), layout, v2=v2)
    assert (got.api, got.scaling, got.swizzle) == call
    F = torch.nn.functional  # the names exist in this torch's enums
    assert hasattr(F.ScalingType, got.scaling)
    assert got.swizzle is None or hasattr(F.SwizzleType, got.swizzle)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
def test_pre_swizzled_scales_go_only_through_the_call_that_names_them(fmt):
    spec = QuantSpec(format=fmt)
    call = native.gemm_call(spec, "32x8", v2=True, swizzle_32_8=True)
    assert (call.api, call.scaling, call.swizzle) == ("scaled_mm", "BlockWise1x32", "SWIZZLE_32_8")
    for v2, named in [(True, False), (False, True), (False, False)]:  # v1 would guess by count
        with pytest.raises(UnsupportedFormatError, match="needs torch.nn.functional.scaled_mm wi"):
            native.gemm_call(spec, "32x8", v2=v2, swizzle_32_8=named)


def test_mxfp4_on_cuda_without_the_explicit_api_is_refused():
    with pytest.raises(UnsupportedFormatError, match="needs torch.nn.functional.scaled_mm"):
        native.gemm_call(QuantSpec(format="mxfp4"), "128x4", v2=False)


@pytest.mark.parametrize(("rows", "K"), [(128, 256), (256, 1024), (4096, 4096)])
def test_swizzled_and_row_major_mx_scales_can_have_the_same_element_count(rows, K):
    """Why the layout must be named: for rows % 32 == 0 and K % 256 == 0 (every LLM shape of a
    multiple of 128 rows) the swizzled scales of ``swizzle_scales`` hold as many elements as the
    row-major ones, so a call that infers the layout from the count (v1) cannot tell them apart."""
    scales = torch.randint(100, 140, (rows, K // 32), dtype=torch.uint8)
    blocked = swizzle_scales(scales)
    assert blocked.numel() == scales.numel()
    assert not torch.equal(blocked, scales.flatten())  # the same count, other bytes
    assert torch.equal(unswizzle_scales(blocked, rows, K // 32), scales)  # the round trip


def test_the_explicit_api_multiplies_fp8_as_torch_scaled_mm_does_on_the_cpu():
    a, b = _x(70, 200, seed=1), _x(33, 200, seed=2)
    e4m3 = QuantSpec(format="fp8_e4m3")
    pa, pb = pack_operand(a, e4m3), pack_operand(b, e4m3)
    v1 = torch._scaled_mm(pa.data, pb.data.t(), pa.scale, pb.scale, out_dtype=torch.float32)
    v1 = v1[:70, :33]
    got = scaled_mm(pa, pb)
    assert native.HAS_V2 and got.shape == v1.shape
    # to FP32 accumulation: the two CPU kernels may sum K in different orders
    # (test_a_cpu_without_the_v2_kernel_multiplies_through_v1)
    assert _within_fp32_accumulation(got, v1, a, b, GemmRecipe(a=e4m3, b=e4m3))
