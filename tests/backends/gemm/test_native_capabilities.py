"""The ``native`` backend's capability checks, before anything trains: which formats each device
runs natively (the capability table and this torch build's limits), the refusals that name the
device, the format, the GEMMs that need it, what the device runs and the fix, and the operand
layout each device's GEMM takes. All on the CPU, by architecture name.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backends.gemm import (
    UnsupportedFormatError,
    available_backends,
    check_recipe,
    get_backend,
    supported_formats,
)
from backends.gemm.native import (
    CAPABILITIES,
    CUDA_LAYOUT,
    NativeBackend,
    build_limits,
    device_arch,
    device_name,
    layout_for,
)
from backends.layer import QuantLinear, convert_model
from backends.quant import FORMATS, QuantSpec
from backends.recipes import GemmRecipe, Recipe

ALL_FORMATS = list(FORMATS)


def _gemm(fa: str, fb: str | None = None) -> GemmRecipe:
    return GemmRecipe(a=QuantSpec(format=fa), b=QuantSpec(format=fb or fa))


def _recipe(fa: str, fb: str | None = None) -> Recipe:
    g = _gemm(fa, fb)
    return Recipe(fprop=g, dgrad=g, wgrad=g)


def _runnable(fmt: str) -> Recipe:
    """Every GEMM in ``fmt``, E5M2 paired with E4M3 as FP8 recipes pair gradients with weights."""
    return _recipe(fmt, fmt.replace("e5m2", "e4m3"))


def test_native_is_a_registered_backend():
    assert "native" in available_backends()
    backend = get_backend("native")
    assert backend.name == "native" and isinstance(backend, NativeBackend)


def test_capability_table_names_known_formats_only():
    for arch, formats in CAPABILITIES.items():
        assert formats <= set(FORMATS), arch
        assert {"fp8_e4m3", "fp8_e5m2"} <= formats, arch  # every listed device runs FP8


def test_cpu_has_no_arch_and_runs_per_tensor_fp8_alone():
    assert device_arch("cpu") is None
    assert device_name(torch.device("cpu")) == "cpu"
    assert supported_formats("cpu") == {"fp8_e4m3", "fp8_e5m2"}  # torch._scaled_mm's CPU kernel
    assert build_limits(None) == {}


@pytest.mark.parametrize("fmt", [f for f in ALL_FORMATS if not f.startswith("fp8")])
def test_cpu_refuses_every_block_format_naming_device_format_and_fix(fmt):
    with pytest.raises(UnsupportedFormatError) as e:
        NativeBackend().check(_recipe(fmt), torch.device("cpu"))
    msg = str(e.value)
    assert "on cpu" in msg and f"{fmt} (fprop, dgrad, wgrad) has no native GEMM" in msg
    assert "cpu runs natively: fp8_e4m3, fp8_e5m2" in msg and "backend: emulated" in msg


def test_a_high_precision_recipe_needs_no_native_gemm():
    NativeBackend().check(Recipe.bf16(), torch.device("cpu"))


def test_sm90_runs_fp8_and_refuses_mxfp4_naming_what_it_supports():
    h100 = "NVIDIA H100 80GB HBM3 (sm_90)"
    check_recipe(Recipe.from_shorthand(base="fp8"), "sm_90", h100)
    fp4 = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "sr+rht", base="fp8")
    with pytest.raises(UnsupportedFormatError) as e:
        check_recipe(fp4, "sm_90", h100)
    msg = str(e.value)
    assert f"on {h100}" in msg and "mxfp4 (fprop, dgrad, wgrad) has no native GEMM" in msg
    assert f"{h100} runs natively: fp8_e4m3, fp8_e5m2" in msg
    assert "Use `backend: emulated`" in msg


@pytest.mark.parametrize(
    "arch,runs,refuses",
    [
        ("sm_89", ["fp8_e4m3"], ["mxfp8_e4m3", "mxfp4", "nvfp4"]),
        ("sm_100", ["fp8_e4m3", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"], []),
        ("sm_103", ["mxfp4", "nvfp4"], []),
        ("sm_120", ["mxfp8_e4m3", "nvfp4"], ["mxfp4"]),
        ("gfx942", ["fp8_e4m3"], ["mxfp8_e4m3", "mxfp4", "nvfp4"]),
        ("gfx950", ["fp8_e4m3", "mxfp8_e4m3", "mxfp4"], ["nvfp4"]),
        ("sm_80", [], ["fp8_e4m3", "mxfp4"]),  # A100: no FP8 tensor cores
    ],
)
def test_capability_table(arch, runs, refuses):
    for fmt in runs:
        check_recipe(_runnable(fmt), arch)
    for fmt in refuses:
        with pytest.raises(UnsupportedFormatError, match=f"{fmt} .* has no native GEMM"):
            check_recipe(_runnable(fmt), arch)


def test_build_limits_are_refused_with_their_reason():
    limits = {"mxfp4": "this torch build has no MSLK kernels"}
    with pytest.raises(UnsupportedFormatError, match="no native GEMM on this device .this torch"):
        check_recipe(_recipe("mxfp4"), "sm_100", "NVIDIA B200 (sm_100)", limits)
    check_recipe(_recipe("nvfp4"), "sm_100", "NVIDIA B200 (sm_100)", limits)


def test_build_limits_follow_this_torch_build():
    config = torch.__config__.show()
    mslk = "USE_MSLK" in config or "USE_FBGEMM_GENAI" in config
    assert ("mxfp4" in build_limits("sm_100")) is not mslk
    assert build_limits("sm_90") == {}  # no MXFP4 to limit
    if torch.version.hip is None:
        assert build_limits("gfx950") == {}


def test_e5m2_times_e5m2_is_refused_on_cuda_but_not_rocm():
    with pytest.raises(
        UnsupportedFormatError, match="cuBLAS has no GEMM with both operands in E5M2"
    ):
        check_recipe(_recipe("fp8_e5m2"), "sm_90")
    check_recipe(_recipe("fp8_e5m2"), "gfx942")
    check_recipe(_recipe("fp8_e5m2", "fp8_e4m3"), "sm_90")


def test_mixed_families_and_high_precision_operands_are_refused():
    with pytest.raises(UnsupportedFormatError, match="no native GEMM multiplies mxfp4 by nvfp4"):
        check_recipe(_recipe("mxfp4", "nvfp4"), "sm_100")
    half = GemmRecipe(a=QuantSpec(format="fp8_e4m3"), b=None)
    with pytest.raises(UnsupportedFormatError, match="needs both operands quantized"):
        check_recipe(Recipe(fprop=half), "sm_90")


def test_non_hardware_block_sizes_are_refused():
    spec = QuantSpec(format="mxfp4", block_size=16)
    g = GemmRecipe(a=spec, b=spec)
    with pytest.raises(UnsupportedFormatError, match="block_size 16; the hardware GEMM takes 32"):
        check_recipe(Recipe(wgrad=g), "sm_100")


def test_layouts_per_arch():
    assert layout_for(None) == layout_for("sm_90") == CUDA_LAYOUT
    assert CUDA_LAYOUT.swizzle and not CUDA_LAYOUT.fnuz
    assert layout_for("gfx942").fnuz
    rocm_mx = layout_for("gfx950")
    assert not rocm_mx.swizzle and rocm_mx.row_align == rocm_mx.k_align == 128
    assert rocm_mx.block_out == torch.bfloat16


def test_convert_model_with_native_fails_before_training_on_a_cpu():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], base="fp8")  # MXFP4: no CPU GEMM
    with pytest.raises(UnsupportedFormatError, match="on cpu") as e:
        convert_model(model, recipe, backend="native")
    assert "mxfp4 (fprop, dgrad, wgrad)" in str(e.value)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # nothing was swapped


@pytest.mark.parametrize(
    ("hip", "refused"),
    [
        ("7.12.60610", set()),
        ("7.13.0", {"mxfp4"}),
        ("7.14.1", {"mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"}),
    ],
)
def test_rocm_builds_that_take_pre_swizzled_mx_scales_are_refused_by_their_version(
    hip, refused, monkeypatch
):
    """The MX scale layout follows the ROCm version torch was built against (row-major before
    7.13, hipBLASLt's pre-swizzled tiles from 7.13, MXFP8 from 7.14); this torch's scaled_mm
    cannot name the pre-swizzled tiles (``test_layouts``: one that can is not refused)."""
    monkeypatch.setattr(torch.version, "hip", hip)
    limits = build_limits("gfx950")
    assert set(limits) == refused
    assert all("has no SwizzleType.SWIZZLE_32_8" in why for why in limits.values())
    assert build_limits("gfx942") == {}  # FP8 only: no block scales
