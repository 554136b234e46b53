"""The GPU benchmark (``ablate.gpu_bench``): every row it reports is measured, the targets are
evaluated and written with the device and date; on the CPU at toy sizes, since CI has no GPU."""

from __future__ import annotations

import json

import pytest
import torch

from ablate import gpu_bench


def test_benchmark_rows_targets_and_report_at_toy_sizes_on_the_cpu(tmp_path):
    result = gpu_bench.measure(
        torch.device("cpu"),
        tokens=32,
        repeats=1,
        steps=4,
        preset="tiny",
        batch=2,
        seq_len=32,
        kn=[(64, 96)],
        quant_k=256,
    )
    assert result["arch"] == "cpu" and result["date"]
    assert [r["gemm"] for r in result["gemms"]] == ["bf16", "emulated_mxfp4"]  # no native here
    assert all(r["tflops"] > 0 for r in result["gemms"])
    assert all(r["ms"] > 0 for r in result["quantizer"])
    quant = {r["quantizer"]: r for r in result["quantizer"]}
    assert set(quant) == {
        "copy",
        "mxfp4_rne",
        "mxfp4_sr",
        "mxfp4_h16",
        "nvfp4_rne",
        "mxfp4_rne_axis0",
        "fp8_e4m3",
        "fp8_e5m2",
    }
    assert all(quant[k]["bit_exact"] for k in quant if k != "copy")
    steps = {r["recipe"]: r for r in result["steps"]}
    assert set(steps) == {"bf16", "fp8", "mxfp4"} and steps["bf16"]["vs_bf16"] == 1.0
    assert steps["fp8"]["backend"] == "emulated"  # the CPU has no FP8 GEMM
    targets = result["targets"]
    assert targets["mxfp4_step_vs_bf16"]["measured"] == steps["mxfp4"]["vs_bf16"]
    assert targets["quantizer_copy_fraction"]["measured"] == quant["mxfp4_rne"]["copy_fraction"]
    lines = gpu_bench.report_lines(result)
    md = gpu_bench.write(result, lines, tmp_path)
    assert md.name == f"{result['date']}-cpu.md"
    text = md.read_text()
    assert "target mxfp4_step_vs_bf16" in text and "emulated_mxfp4" in text
    assert json.loads(md.with_suffix(".json").read_text())["targets"] == json.loads(
        json.dumps(targets)
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_without_a_gpu_it_says_so_and_exits_0(capsys, tmp_path):
    assert gpu_bench.main(["--out", str(tmp_path / "gpu")]) == 0
    assert "no CUDA or ROCm device here" in capsys.readouterr().out
    assert not (tmp_path / "gpu").exists()
