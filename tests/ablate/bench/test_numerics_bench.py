"""The numerics benchmark (``ablate.bench.numerics``): every GEMM and quantizer row is measured, each
quantize path is bit for bit the reference, and the command line keeps its flags and JSON keys; on
the CPU at small sizes (the GPU rows run the same code with CUDA timing)."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.bench import numerics as bench

CPU = torch.device("cpu")
QUANTIZER_ROWS = [
    "copy",
    "mxfp4_rne",
    "mxfp4_sr",
    "mxfp4_h16",
    "nvfp4_rne",
    "mxfp4_rne_axis0",
    "fp8_e4m3",
    "fp8_e5m2",
]


def test_gemm_rows_run_on_the_cpu_at_small_sizes():
    rows = bench.gemm_rows(CPU, [(64, 64, 32)], repeats=1, native=["fp8_e4m3"])
    assert [r["gemm"] for r in rows] == [
        "bf16",
        "native_fp8_e4m3",  # torch._scaled_mm has a CPU kernel for per-tensor FP8
        "native_fp8_e4m3_mm",
        "emulated_mxfp4",
    ]
    assert all(float(r["tflops"]) > 0 for r in rows)  # type: ignore[arg-type]


def test_quantizer_rows_are_measured_and_bit_exact():
    quant = bench.quantizer_rows(CPU, (64, 64), repeats=1)
    assert [r["quantizer"] for r in quant] == QUANTIZER_ROWS
    assert quant[0]["copy_fraction"] == 1.0 and "bit_exact" not in quant[0]
    assert all(float(r["ms"]) > 0 for r in quant)  # type: ignore[arg-type]
    assert all(r["bit_exact"] is True for r in quant[1:])


def test_torchao_row_is_measured_or_says_why_not():
    quant = bench.quantizer_rows(CPU, (64, 64), repeats=1, check=False, torchao=True)
    assert [r["quantizer"] for r in quant] == [*QUANTIZER_ROWS, "torchao_to_mx"]
    assert not any("bit_exact" in r for r in quant)
    ao = quant[-1]
    assert ao["ms"] is not None or str(ao["note"]).startswith("unavailable")


def test_measure_and_report_with_and_without_gemms():
    result = bench.measure(CPU, 16, 1, kn=[(64, 96)], quant_shape=(32, 64))
    gemms = [r["gemm"] for r in result["gemms"]]  # the CPU's own FP8 GEMM is a native one
    assert gemms[0] == "bf16" and gemms[-1] == "emulated_mxfp4" and "native_fp8_e4m3" in gemms
    assert {(r["M"], r["K"], r["N"]) for r in result["gemms"]} == {(16, 64, 96)}
    assert result["quantizer_shape"] == [32, 64]
    assert result["native_formats"] == ["fp8_e4m3", "fp8_e5m2"]
    text = "\n".join(bench.report_lines(result))
    assert all(name in text for name in ["bf16", "emulated_mxfp4", *QUANTIZER_ROWS])
    assert text.count("bit-exact: True") == len(QUANTIZER_ROWS) - 1
    assert "fp8_over_mxfp4" in text and result["fp8_over_mxfp4"] > 0
    assert "gemms" not in bench.measure(CPU, 16, 1, kn=None, quant_shape=(32, 64))


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_command_line_json_keeps_the_flat_keys(capsys):
    assert bench.main(["--size", "64", "--repeats", "1", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["size"] == 64 and result["repeats"] == 1 and result["threads"] >= 1
    for row in [*QUANTIZER_ROWS, "torchao_to_mx"]:
        assert {f"{row}_ms", f"{row}_gbps", f"{row}_copy_fraction"} <= set(result)
    assert result["mxfp4_rne_copy_fraction"] > 0 and result["copy_copy_fraction"] == 1.0
    assert result["fp8_over_mxfp4"] == result["fp8_e4m3_ms"] / result["mxfp4_rne_ms"]
    assert "gemms" not in result and "mxfp4_rne_bit_exact" not in result  # no check by default


def test_command_line_gemms_and_check_on_the_cpu(capsys, monkeypatch):
    monkeypatch.setattr(bench, "LLAMA3_8B", ((64, 96),))  # toy GEMM shapes for the test
    argv = ["--device", "cpu", "--size", "64", "--repeats", "1", "--gemms", "--tokens", "16"]
    assert bench.main([*argv, "--check", "--json"]) == 0
    out = capsys.readouterr().out
    result = _last_json(out)
    gemms = [r["gemm"] for r in result["gemms"]]
    assert gemms[0] == "bf16" and gemms[-1] == "emulated_mxfp4" and "native_fp8_e4m3" in gemms
    assert all(result[f"{row}_bit_exact"] for row in QUANTIZER_ROWS[1:])
    assert "emulated_mxfp4" in out and "TFLOP/s" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_cuda_without_a_gpu_says_so_and_exits_0(capsys):
    assert bench.main(["--device", "cuda", "--gemms"]) == 0
    assert "no CUDA or ROCm device here" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--device", "mps"], ["--device", "nonsense"], ["--size", "48"]])
def test_command_line_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
