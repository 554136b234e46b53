"""The native GEMMs' start-up self-check (``backends.gemm.selfcheck``): the CPU's own scaled GEMM
(per-tensor FP8, ``torch._scaled_mm``) passes it and the pass is cached; a damaged cache is
rebuilt; faults injected into what the GEMM is handed (a swizzle applied twice, a transposed scale,
an inverted decode scale) are caught and refused, naming the device, the versions, the format,
the GEMM and the first differing element; FP8 accumulated in fixed point, as on Ada and Hopper,
passes only where the device has it; a CPU cell with ``backend: native`` records the check,
and one whose GEMM is faulty is refused before its first step."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ablate.data import DataConfig
from ablate.model import ModelConfig
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train
from ablate.train.provenance import environment
from backends.gemm import native, selfcheck
from backends.gemm.native import NativeBackend, scaled_mm_reference
from backends.gemm.selfcheck import NativeCheckError, self_check
from backends.recipes import GEMMS, Recipe

FP8 = Recipe.from_shorthand([], base="fp8")  # E4M3 forward, E5M2 x E4M3 backward
MXFP4 = Recipe.from_shorthand(list(GEMMS))
NVFP4 = Recipe.from_shorthand(list(GEMMS), "sr+rht16", fp4_format="nvfp4")


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    selfcheck.forget()
    yield
    selfcheck.forget()


def test_the_cpus_fp8_gemm_passes_and_the_pass_is_cached():
    assert self_check(FP8, "cpu") == "passed: fprop fp8_e4m3, dgrad fp8_e5m2|fp8_e4m3"
    cached = json.loads(selfcheck.cache_path().read_text())
    assert cached["version"] == selfcheck.CHECK_VERSION
    (entry,) = cached["passes"].values()
    assert (
        entry["result"] == "passed" and entry["what"] == "fprop fp8_e4m3, dgrad fp8_e5m2|fp8_e4m3"
    )
    selfcheck.forget()  # a new process on the same machine
    assert self_check(FP8, "cpu").startswith("passed (cached 20")


@pytest.mark.parametrize("value", ["0", "false", "OFF", "no"])
def test_a_skipped_check_records_the_value_that_turned_it_off(monkeypatch, value):
    """It said ABLATE_NATIVE_CHECK=0 whatever the off value set."""
    monkeypatch.setenv("ABLATE_NATIVE_CHECK", value)
    assert self_check(FP8, "cpu") == f"skipped: ABLATE_NATIVE_CHECK={value}"
    assert not selfcheck.cache_path().exists()  # nothing checked, nothing cached


ROCM_714 = native.layout_for("gfx950", hip=(7, 14))  # MX scales in hipBLASLt's 32x8 tiles


@pytest.mark.parametrize(
    ("recipe", "layout"),
    [(MXFP4, None), (NVFP4, None), (MXFP4, ROCM_714)],
    ids=["mxfp4", "nvfp4_sr_rht16", "mxfp4_rocm_7.14"],
)
def test_the_block_formats_pass_on_a_gemm_that_reads_their_layout_as_written(
    recipe, layout, monkeypatch
):
    """No CPU GEMM takes block scales: the stand-in is the FP32 GEMM of what the packed operands
    decode to (``scaled_mm_reference``), which reads cuBLAS's swizzled layout (or hipBLASLt's
    pre-swizzled one) as the hardware does."""
    if layout is not None:
        monkeypatch.setattr(native, "layout_for", lambda arch: layout)
    result = self_check(recipe, "cpu", NativeBackend(scaled_mm_reference), use_cache=False)
    assert result.startswith("passed: fprop ")


@pytest.mark.parametrize(
    "text",
    [
        "not json {",
        json.dumps({"version": 999, "passes": {}}),
        json.dumps({"version": selfcheck.CHECK_VERSION, "passes": ["a list"]}),
    ],
)
def test_a_damaged_cache_is_ignored_and_rewritten(text):
    path = selfcheck.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert self_check(FP8, "cpu").startswith("passed: ")  # checked again, not read
    assert json.loads(path.read_text())["version"] == selfcheck.CHECK_VERSION


def test_a_cached_entry_that_is_not_a_pass_counts_for_nothing():
    key = selfcheck.cache_key(torch.device("cpu"), selfcheck.cases(FP8))
    path = selfcheck.cache_path()
    path.parent.mkdir(parents=True)
    forged = {key: {"result": "failed", "when": "x"}, "other": {"result": "passed", "when": 5}}
    path.write_text(json.dumps({"version": selfcheck.CHECK_VERSION, "passes": forged}))
    assert self_check(FP8, "cpu").startswith("passed: ")  # ran: the entry was no pass
    assert set(json.loads(path.read_text())["passes"]) == {key}  # the bad ones are gone


def _refused(recipe: Recipe, backend: NativeBackend) -> str:
    with pytest.raises(NativeCheckError) as e:
        self_check(recipe, "cpu", backend, use_cache=False)
    msg = str(e.value)
    assert f"on cpu, torch {torch.__version__}" in msg  # the device and the versions
    assert "first difference at [" in msg and "emulated" in msg and "backend: emulated" in msg
    return msg


def test_a_swizzle_applied_twice_is_refused(monkeypatch):
    once = native.swizzle_scales
    monkeypatch.setattr(native, "swizzle_scales", lambda s: once(once(s).view(-1, 4)))
    msg = _refused(MXFP4, NativeBackend(scaled_mm_reference))
    assert "fprop mxfp4" in msg  # the GEMM and the format


def test_a_transposed_scale_is_refused(monkeypatch):
    """ROCm's row-major scales, handed over transposed: the same element count, read wrongly."""
    rocm = native.Layout(swizzle=False, row_align=128, k_align=128)
    monkeypatch.setattr(native, "layout_for", lambda arch: rocm)
    real = native.pack_quantized

    def transposed(q, **kw):
        p = real(q, **kw)
        s = p.scale.view(torch.uint8)
        return dataclasses.replace(p, scale=s.t().contiguous().view(s.shape).view(p.scale.dtype))

    monkeypatch.setattr(native, "pack_quantized", transposed)
    msg = _refused(MXFP4, NativeBackend(scaled_mm_reference))
    assert "(M, N, K) = (64, 48, 256)" in msg  # the shape it was found on


def test_row_major_scales_read_as_pre_swizzled_are_refused(monkeypatch):
    """What ``torch._scaled_mm`` would do on a torch built against ROCm 7.13: row-major scales of
    the same element count, read as hipBLASLt's 32x8 tiles."""
    monkeypatch.setattr(native, "layout_for", lambda arch: ROCM_714)
    monkeypatch.setattr(native, "preswizzle_scales", lambda s: s.contiguous().view(-1))
    msg = _refused(MXFP4, NativeBackend(scaled_mm_reference))
    assert "fprop mxfp4" in msg


def test_an_inverted_decode_scale_on_the_cpus_own_fp8_gemm_is_refused(monkeypatch):
    real = native.pack_quantized
    monkeypatch.setattr(
        native,
        "pack_quantized",
        lambda q, **kw: dataclasses.replace(p := real(q, **kw), scale=1 / p.scale),
    )
    msg = _refused(FP8, NativeBackend())  # torch._scaled_mm's CPU kernel
    assert "fprop fp8_e4m3" in msg


def _fixed_point_mm(pa, pb):
    """A GEMM that adds like Hopper's FP8 tensor cores: each 32-product chunk of K in fixed point,
    every product aligned to 13 bits below the chunk's largest (truncated), the chunks in FP32."""
    a, b = native.dequantize_packed(pa).double(), native.dequantize_packed(pb).double()
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    for k in range(0, a.shape[1], 32):
        prods = a[:, None, k : k + 32] * b[None, :, k : k + 32]
        top = prods.abs().amax(-1).clamp(min=2.0**-126)
        ulp = torch.exp2(torch.floor(torch.log2(top)) - 13)
        out += (torch.trunc(prods / ulp[..., None]) * ulp[..., None]).sum(-1).float()
    return native._unpad(out, pa.rows, pb.rows)


def test_fixed_point_fp8_accumulation_passes_where_the_device_has_it(monkeypatch):
    """Ada and Hopper add FP8 products in fixed point (H200, torch 2.11: 0.0046 off on an output
    of 6.08, past the FP32 bound): the check allows it there (``accumulation_bits``), nowhere
    else, and still refuses a wrong scale there."""
    hopper = NativeBackend(_fixed_point_mm)
    msg = _refused(FP8, hopper)  # a CPU claims FP32 accumulation: held to it
    assert "FP32 accumulation order" in msg
    monkeypatch.setattr(selfcheck, "device_arch", lambda device: "sm_90")
    assert self_check(FP8, "cpu", hopper, use_cache=False).startswith("passed: fprop fp8_e4m3")
    assert selfcheck.accumulation_bits("mxfp8_e4m3", "sm_100") == 24
    assert selfcheck.accumulation_bits("fp8_e5m2", "sm_89") == 8
    selfcheck.forget()
    real = native.pack_quantized
    monkeypatch.setattr(
        native,
        "pack_quantized",
        lambda q, **kw: dataclasses.replace(p := real(q, **kw), scale=2 * p.scale),
    )
    _refused(FP8, hopper)


def _cell(tmp_path) -> RunConfig:
    return RunConfig(
        model=ModelConfig(preset="tiny"),
        data=DataConfig(val_tokens=1024),
        train=TrainConfig(steps=2, batch_size=2, seq_len=32, eval_every=2, warmup_steps=1),
        recipe=FP8,
        backend="native",
        device="cpu",
    )


def test_a_cpu_cell_on_native_fp8_records_its_check(tmp_path):
    cfg = _cell(tmp_path)
    res = train(cfg, MemoryLogger())
    assert res.status == "finished"
    assert environment(cfg)["native_check"] == ("passed: fprop fp8_e4m3, dgrad fp8_e5m2|fp8_e4m3")
    emulated = dataclasses.replace(cfg, backend="emulated")
    assert "native_check" not in environment(emulated)


def test_a_cell_whose_native_gemm_is_faulty_is_refused_before_its_first_step(tmp_path, monkeypatch):
    real = native.pack_quantized
    monkeypatch.setattr(
        native,
        "pack_quantized",
        lambda q, **kw: dataclasses.replace(p := real(q, **kw), scale=p.scale * 2),
    )
    logger = MemoryLogger()
    with pytest.raises(NativeCheckError, match="does not compute what the emulation does"):
        train(_cell(tmp_path), logger)
    assert not logger.series("train_loss")  # no step was taken


def test_the_command_checks_every_format_the_device_runs():
    from click.testing import CliRunner

    from ablate.cli import main

    res = CliRunner().invoke(main, ["native-check", "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""  # a CUDA build on a CPU
    assert out["device"] == f"cpu, torch {torch.__version__}{cuda}"
    assert out["results"] == {"fp8": "passed: fprop fp8_e4m3, dgrad fp8_e5m2|fp8_e4m3"}
    # a format the CPU has no native GEMM for is a usage error, not a GEMM that differs (exit 1)
    for fmts in (["nvfp4"], ["fp8_e4m3", "mxfp4"]):
        args = [a for f in fmts for a in ("--format", f)]
        res = CliRunner().invoke(main, ["native-check", "--device", "cpu", *args])
        assert res.exit_code == 2 and "--format" in res.output, (fmts, res.output)
        assert f"{fmts[-1]}: no native GEMM on cpu" in res.output, res.output
        assert "it runs natively: fp8_e4m3, fp8_e5m2" in res.output and "FAILED" not in res.output
    for name in ("ABLATE_NATIVE_CHECK", "ABLATE_EMULATED_GEMM"):  # a typo was a traceback
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(name, "garbage")
            res = CliRunner().invoke(main, ["native-check", "--device", "cpu"])
        assert res.exit_code == 2 and f"environment variable {name}: unknown" in res.output
        assert "Traceback" not in res.output and "passed" not in res.output, res.output
    res = CliRunner().invoke(main, ["native-check", "--format", "mxfp9"])
    assert res.exit_code == 2 and "allowed: mxfp4" in res.output


def test_what_is_not_native_is_the_same_to_native_check_and_check_device():
    """``not_native`` (the command's refusal) and ``check_device``'s ``not native here`` ask one
    question: the CPU runs FP8 natively, not MXFP4."""
    assert selfcheck.not_native("cpu", ["fp8_e4m3", "mxfp4", "nvfp4"]) == ["mxfp4", "nvfp4"]
    results = selfcheck.check_device("cpu", ["fp8_e4m3", "mxfp4"])
    assert results["fp8"] == "passed: fprop fp8_e4m3, dgrad fp8_e5m2|fp8_e4m3"
    (other,) = (v for k, v in results.items() if k != "fp8")
    assert other.startswith("FAILED: not native here: ") and len(other) > 25, results
