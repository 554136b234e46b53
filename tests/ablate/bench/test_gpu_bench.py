"""The GPU benchmark (``ablate.bench.gpu``): every code path on the CPU at toy sizes
(``--device cpu --dry-run``: real torch, the trainer's real steps), since CI has no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate.bench import gpu as gpu_bench


def test_dry_run_on_the_cpu_measures_every_row_and_writes_the_report(tmp_path, capsys):
    assert gpu_bench.main(["--device", "cpu", "--dry-run", "--out", str(tmp_path)]) == 0
    (md,) = tmp_path.glob("*-cpu-dry-run.md")
    result = json.loads(md.with_suffix(".json").read_text())
    assert result["dry_run"] and result["arch"] == "cpu" and result["date"] and result["torch"]
    assert "partial" not in result and "Partial" not in md.read_text()  # replaced at its end
    assert (
        result["command"] == f"python -m ablate.bench.gpu --device cpu --dry-run --out {tmp_path}"
    )

    # the step rows: every recipe per preset, fp8 on the CPU's own (native) FP8 GEMM
    steps = {r["recipe"]: r for r in result["steps"]}
    assert list(steps) == list(gpu_bench.RECIPES)
    assert steps["fp8"]["backend"] == "native" and "skipped" not in steps["fp8"]
    for name in ("bf16", "fp8", "mxfp4", "nvfp4", "mxfp4_h16"):
        r = steps[name]
        assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["compiled"] is False
        assert (r["batch"], r["seq_len"]) == gpu_bench.DRY_RUN["batch"]["tiny"]
    assert steps["mxfp4_h16"]["recipe_label"] == "mxfp4[fprop,dgrad,wgrad]+dht16/bf16"
    assert steps["nvfp4"]["recipe_label"].startswith("nvfp4[fprop,dgrad,wgrad]")
    ratios = result["ratios"]["tiny"]
    assert ratios["emulated_mxfp4_step_over_bf16"] == pytest.approx(
        steps["mxfp4"]["step_ms"] / steps["bf16"]["step_ms"]
    )
    assert ratios["native_fp8_step_over_bf16"] == pytest.approx(
        steps["fp8"]["step_ms"] / steps["bf16"]["step_ms"]
    )
    assert result["train"]["compile"] == "auto" and result["train"]["compiled"] is False

    # the quantizer: each path checked bit for bit on the device and against the CPU
    quant = {q["quantizer"]: q for q in result["quantizer"]}
    for name in ("mxfp4_rne", "mxfp4_sr", "mxfp4_h16"):
        q = quant[name]
        assert q["bit_exact"] and q["bit_exact_cpu"] and q["bit_exact_cpu_reference"]
        assert q["gbps"] > 0 and q["copy_fraction"] > 0
    assert all(q["bit_exact_cpu"] for k, q in quant.items() if k != "copy")

    # the goals, evaluated on the run's own figures
    goals = result["goals"]
    step_goal = goals["emulated_mxfp4_step_over_bf16"]
    assert step_goal["measured"] == ratios["emulated_mxfp4_step_over_bf16"]
    assert step_goal["met"] == (step_goal["measured"] <= gpu_bench.STEP_TARGET)
    assert (
        goals["quantizer_mxfp4_rne_copy_fraction"]["measured"]
        == quant["mxfp4_rne"]["copy_fraction"]
    )
    fp8_goal = goals["native_fp8_step_over_bf16"]
    assert fp8_goal["met"] == (fp8_goal["measured"] < 1.0)

    # the profile of the emulated MXFP4 step: the top entries with their share of the step
    prof = result["profile"]
    assert prof["preset"] == "tiny" and prof["recipe"].startswith("mxfp4[")
    assert prof["top"] and all(k["total_ms"] > 0 and k["calls"] > 0 for k in prof["top"])
    assert prof["top"] == sorted(prof["top"], key=lambda k: -k["total_ms"])
    assert "gemm" in prof["by_kind"]

    # the GEMM rows, and the Markdown with every section
    gemms = [g["gemm"] for g in result["gemms"]]
    assert gemms[0] == "bf16" and gemms[-1] == "emulated_mxfp4" and "native_fp8_e4m3" in gemms
    text = md.read_text()
    for heading in ("## Goals", "## Step time, `tiny`", "## Quantizer", "## Profile", "## GEMMs"):
        assert heading in text
    assert "| mxfp4_h16 |" in text and "emulated_mxfp4_step_over_bf16" in text
    assert "dry run" in text and result["command"] in text
    out = capsys.readouterr().out
    assert "goal emulated_mxfp4_step_over_bf16" in out and f"wrote {md}" in out


def test_kernel_kinds():
    kind = gpu_bench.kernel_kind
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert kind("triton_per_fused__to_copy_abs_amax_0") == "triton"
    # Inductor names a kernel after the ops it feeds: the H100's FP8 profile of 2026-11-27 counted
    # the operands' quantization, named after the scaled GEMM it prepares, as GEMM time
    assert kind("triton_red_fused__to_copy_abs_clamp_mul_round_scaled_mm_v2_silu_t_view_13") == (
        "triton"
    )
    assert kind("void pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert kind("void at::native::(anonymous namespace)::fused_adamw_kernel") == "optimizer"
    assert kind("Memcpy HtoD (Pageable -> Device)") == "memory"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_without_a_gpu_it_says_so_and_exits_0(capsys, tmp_path):
    assert gpu_bench.main(["--out", str(tmp_path / "gpu")]) == 0
    assert "no CUDA or ROCm device here" in capsys.readouterr().out
    assert not (tmp_path / "gpu").exists()


def test_a_subset_of_recipes_is_timed_and_each_named_one_profiled(tmp_path, capsys):
    argv = ["--device", "cpu", "--dry-run", "--no-gemms", "--out", str(tmp_path)]
    argv += ["--recipes", "bf16", "fp8", "mxfp4", "--profile", "fp8", "mxfp4"]
    assert gpu_bench.main(argv) == 0
    result = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [r["recipe"] for r in result["steps"]] == ["bf16", "fp8", "mxfp4"]
    assert [p["name"] for p in result["profiles"]] == ["fp8", "mxfp4"]
    assert result["profile"]["name"] == "mxfp4"  # the goals' profile
    md = next(tmp_path.glob("*.md")).read_text()
    assert md.count("## Profile, `tiny`") == 2
    with pytest.raises(SystemExit):  # argparse names the allowed recipes
        gpu_bench.main(["--device", "cpu", "--recipes", "fp4"])
    assert "invalid choice: 'fp4'" in capsys.readouterr().err


def test_a_bench_stopped_at_its_limit_keeps_what_it_measured(tmp_path):
    """A GPU loan's stage is killed at its time limit: on an H100 (2026-11-27) the bench lost its
    step times, its profile and its goals that way. Every part is written as it ends."""
    root = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "ablate.bench.gpu", "--device", "cpu", "--dry-run", "--no-gemms"]
    cmd += ["--out", str(tmp_path), "--name", "bench", "--recipes", "bf16", "fp8", "mxfp4"]
    cmd += ["--profile", "bf16", "mxfp4"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root, env=env)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # killed once the second run is written, before the third ends
        seen.append(line)
        if line.startswith("bench: tiny fp8 "):
            proc.kill()
            break
    proc.wait()
    assert proc.returncode == -9, "".join(seen)
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["partial"] is True and result["dry_run"] is True
    assert result["command"].endswith("--profile bf16 mxfp4")
    assert [r["recipe"] for r in result["steps"]] == ["bf16", "fp8"]
    assert result["steps"][0]["step_ms"] > 0
    assert [p["name"] for p in result["profiles"]] == ["bf16"]  # written with its run
    assert {q["quantizer"] for q in result["quantizer"]} >= {"copy", "mxfp4_rne", "mxfp4_sr"}
    goals = result["goals"]  # evaluated on what was measured; the rest not measured
    assert goals["emulated_mxfp4_step_over_bf16"]["measured"] is None
    assert goals["emulated_mxfp4_step_over_bf16"]["met"] is None
    assert goals["quantizer_mxfp4_rne_copy_fraction"]["measured"] > 0
    md = (tmp_path / "bench.md").read_text()
    assert "(partial)" in md and "**Partial**" in md and "| bf16 |" in md
    assert not list(tmp_path.glob("*.tmp"))  # a line comes after its write, never during it


def test_the_header_names_a_gpus_arch_once():
    """The H200 run of 2026-11-29 read "device: NVIDIA H200 (sm_90) (sm_90)": a GPU's description
    carries its arch already; a CPU's model name does not."""
    from ablate.bench.gpu_render import _device

    assert _device({"device": "NVIDIA H200 (sm_90)", "arch": "sm_90"}) == "NVIDIA H200 (sm_90)"
    assert _device({"device": "Intel Xeon", "arch": "cpu"}) == "Intel Xeon (cpu)"
