"""`ablate plan`'s memory estimate per device and its warning (real study files, no training)."""

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from ablate.cli import main

QUICKSTART = Path(__file__).resolve().parents[3] / "studies" / "quickstart.yaml"

BIG = """
name: big
base:
  device: cpu
  model: {preset: llama3_8b, vocab_size: 128256}
  data: {corpus: builtin, val_tokens: 8192}
  train: {steps: 10, batch_size: 8, grad_accum: 8, seq_len: 2048, precision: bf16}
grid:
  seed: [0, 1]
"""


def test_plan_prints_the_quickstart_estimate_and_fits_without_a_limit(tmp_path):
    res = CliRunner().invoke(main, ["plan", str(QUICKSTART), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "memory per device (estimate):" in res.output
    # one configuration of memory for all 18 cells: tiny, fp32 on the CPU, micro-batch 8 x 128
    line = next(ln for ln in res.output.splitlines() if ln.startswith("  18 cell(s)"))
    assert "MiB per device = params" in line and "fp32, micro-batch 8 x 128" in line
    assert "warning: memory" not in res.output  # a CPU study: no device memory to compare with


def test_plan_warns_when_the_device_is_too_small(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["plan", str(QUICKSTART), "-o", str(out), "--device-memory", "1MiB"]
    )
    assert res.exit_code == 0, res.output  # a warning, not an error
    assert "warning: memory: 18 cell(s)" in res.output and "will not fit" in res.output
    res = CliRunner().invoke(
        main, ["plan", str(QUICKSTART), "-o", str(out), "--device-memory", "1MiB", "--json"]
    )
    assert res.exit_code == 0, res.output
    body = res.output[res.output.index("{") : res.output.rindex("}") + 1]
    mem = json.loads(body)["cells"][0]["memory"]
    assert mem["device_memory"] == 1 << 20 and mem["total"] > 1 << 20
    assert "warning: memory" in res.output


def test_plan_says_llama3_8b_does_not_fit_80gib_without_building_it(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(BIG)
    t0 = time.perf_counter()
    res = CliRunner().invoke(
        main, ["plan", str(p), "-o", str(tmp_path / "out"), "--device-memory", "80GiB"]
    )
    elapsed = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    assert "8,030.3M params, bf16, micro-batch 1 x 2048" in res.output
    # 16 bytes per parameter: 128.5 GB = 120 GiB before any activation
    assert "gradients and AdamW state alone: 120 GiB" in res.output
    assert "warning: memory: 2 cell(s)" in res.output and "80 GiB" in res.output
    assert elapsed < 20  # nothing of 8B parameters was allocated


@pytest.mark.parametrize("bad", ["80", "80TB", "lots", "0GiB"])
def test_plan_refuses_a_bad_device_memory(tmp_path, bad):
    res = CliRunner().invoke(
        main, ["plan", str(QUICKSTART), "-o", str(tmp_path / "out"), "--device-memory", bad]
    )
    assert res.exit_code == 2
    assert "--device-memory" in res.output and "GiB, GB, MiB or MB" in res.output
    assert not (tmp_path / "out").exists()


def _json(output: str) -> dict:
    return json.loads(output[output.index("{") : output.rindex("}") + 1])


DDP = """
name: ddp
base:
  device: cpu
  model: {preset: small}
  data: {corpus: builtin, val_tokens: 8192}
  train: {steps: 10, batch_size: 16, grad_accum: 2, seq_len: 128, precision: fp32}
grid:
  seed: [0]
resources: {cpus: 0.5, workers: 4}
"""


def test_plan_shows_ddp_per_worker_micro_batches_and_buckets(tmp_path):
    from ablate.model import ModelConfig
    from ablate.train.memory import estimate

    p = tmp_path / "ddp.yaml"
    p.write_text(DDP)
    out = ["-o", str(tmp_path / "out")]
    res = CliRunner().invoke(main, ["plan", str(p), *out])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("  1 cell(s)"))
    assert "ddp x4: " in line and "+ ddp buckets " in line
    assert "fp32, micro-batch 2 x 128 per worker" in line  # 16 / 4 workers / 2 micro-batches
    res = CliRunner().invoke(main, ["plan", str(p), *out, "--json"])
    mem = _json(res.output)["cells"][0]["memory"]
    whole = estimate(
        ModelConfig(preset="small"), 257, batch_size=16, grad_accum=2, seq_len=128, precision="fp32"
    )
    assert (mem["parallel"], mem["workers"]) == ("ddp", 4)
    assert mem["parameters"] == whole.parameters and mem["optimizer"] == whole.optimizer
    assert mem["ddp_buckets"] == whole.gradients  # one more fp32 gradient set
    assert mem["activations"] * 4 == whole.activations  # a quarter of the batch per worker


def test_a_gpu_study_plans_without_the_gpus_with_the_studys_own_checks(tmp_path):
    """Without the GPUs here, plan and validate skip this machine's checks, not the study's: the
    one-GPU 125M study plans (with a warning), and a device no Ray task of its cells can see is
    refused as before."""
    import torch

    if torch.cuda.device_count():
        pytest.skip("checks a machine without a GPU")
    gpu = QUICKSTART.parent / "mxfp4_wgrad.yaml"
    out = ["-o", str(tmp_path / "out")]
    for cmd in ("plan", "validate"):
        res = CliRunner().invoke(main, [cmd, str(gpu), *out])
        assert res.exit_code == 0, (cmd, res.output)
        assert "warning: each cell asks for 1 GPU(s) (resources.gpus 1 x resources.workers 1)" in (
            res.output
        )
    p = tmp_path / "s.yaml"
    p.write_text(gpu.read_text().replace("  backend: emulated\n", "  device: 'cuda:1'\n"))
    res = CliRunner().invoke(main, ["plan", str(p), *out])
    assert res.exit_code == 2, res.output
    assert "a Ray task sees only the resources.gpus: 1 GPU(s) it asks for" in res.output
    assert not (tmp_path / "out").exists()


STUDY_8B = QUICKSTART.parent / "mxfp4_wgrad_8b.yaml"


BREAKDOWN = {
    "parameters",
    "gradients",
    "optimizer",
    "activations",
    "weight_copies",
    "quant_extras",
    "ddp_buckets",
    "fsdp_unsharded",
    "allowance",
}


def test_the_8b_study_plans_here_with_its_fsdp_estimate_per_device(tmp_path):
    """The paper-scale study (8 GPUs a cell, FSDP) plans on this machine, without building the 8B
    model: each GPU holds 1/8 of the parameters, gradients and AdamW state, a micro-batch of one
    8192-token sequence, and FSDP's unsharded working set."""
    import torch

    from ablate.study import load_study
    from ablate.train.memory import GIB, estimate, estimate_run

    out = tmp_path / "out"
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["plan", str(STUDY_8B), "-o", str(out)])
    assert time.perf_counter() - t0 < 20  # shapes only
    assert res.exit_code == 0, res.output
    assert "study mxfp4_wgrad_8b: 15 cells" in res.output and "would: run 15" in res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("  15 cell(s)"))
    assert "fsdp x8: 45.5 GiB per device = params 3.74 GiB" in line, line
    assert "8,030.3M params, bf16, micro-batch 1 x 8192 per worker, blocks checkpointed" in line
    assert "(training 14 GiB, evaluation " in line  # evaluation's peak is counted too
    if torch.cuda.device_count() < 8:  # a study for other machines: checked, and said so
        assert "each cell asks for 8 GPU(s)" in res.output
        assert "`ablate run` refuses the study here" in res.output
    assert not out.exists()

    cell = load_study(STUDY_8B, output=out).cells[0].config
    assert (cell.train.workers, cell.train.resolved_parallel, cell.device) == (8, "fsdp", "cuda")
    fsdp = estimate_run(cell)
    tc = cell.train
    one = estimate(
        cell.model,
        None,
        batch_size=tc.batch_size,
        grad_accum=tc.grad_accum,
        seq_len=tc.seq_len,
        precision="bf16",
        recipe=cell.recipe,
    )
    assert one.total > 700 * GIB  # one process: the whole batch's activations and all the state
    assert fsdp.total < one.total / 4
    assert 44 * GIB < fsdp.total < 47 * GIB  # the 45.5 GiB the header comment promises
    plain = estimate_run(replace(cell, train=replace(tc, activation_checkpointing="none")))
    assert 115 * GIB < plain.total < 125 * GIB  # and the 118 GiB without checkpointing


def test_the_8b_study_fits_80gib_gpus_and_warns_without_checkpointing(tmp_path):
    out = ["-o", str(tmp_path / "out")]
    res = CliRunner().invoke(main, ["plan", str(STUDY_8B), *out, "--device-memory", "80GiB"])
    assert res.exit_code == 0, res.output
    assert "warning: memory" not in res.output  # 45.5 GiB: an H100 holds it
    # the same study without activation checkpointing: 118 GiB, and the warning says so
    plain = tmp_path / "plain.yaml"
    text = STUDY_8B.read_text()
    assert "    activation_checkpointing: blocks" in text
    plain.write_text(text.replace("    activation_checkpointing: blocks", ""))
    res = CliRunner().invoke(main, ["plan", str(plain), *out, "--device-memory", "80GiB"])
    assert res.exit_code == 0, res.output  # a warning, not a refusal
    assert "warning: memory: 15 cell(s)" in res.output
    assert "need about 118 GiB per device (fsdp x8), more than the device's 80 GiB" in res.output
    assert "gradients and AdamW state alone: 15 GiB" in res.output  # 16 bytes x 8.03B / 8
    assert "raise resources.workers" in res.output
    assert "raise train.grad_accum" not in res.output  # the micro-batch is one sequence already
    res = CliRunner().invoke(
        main, ["plan", str(STUDY_8B), *out, "--device-memory", "180GB", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert "warning: memory" not in res.output
    cells = _json(res.output)["cells"]
    assert len(cells) == 15 and len({json.dumps(c["memory"]) for c in cells}) == 1
    mem = cells[0]["memory"]
    assert (mem["parallel"], mem["workers"], mem["device_memory"]) == ("fsdp", 8, 180 * 10**9)
    n = 8_030_261_248
    assert (mem["parameters"], mem["optimizer"]) == (4 * n // 8, 8 * n // 8)
    assert mem["ddp_buckets"] == 0 and 0 < mem["fsdp_unsharded"] < 4 * n / 2  # sharded grads
    assert mem["total"] == sum(v for k, v in mem.items() if k in BREAKDOWN)


def test_the_8b_study_validates_here_and_run_still_refuses_it(tmp_path):
    import torch

    if torch.cuda.device_count() >= 8:
        pytest.skip("checks a machine with fewer GPUs than a cell asks for")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["validate", str(STUDY_8B), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "ok: mxfp4_wgrad_8b: 15 cells, 5 configurations" in res.output
    assert "each cell asks for 8 GPU(s) (resources.gpus 1 x resources.workers 8)" in res.output
    res = CliRunner().invoke(main, ["run", str(STUDY_8B), "-o", str(out)])
    assert res.exit_code == 2, res.output  # refused before Ray starts
    assert "this machine cannot run the study" in res.output
    assert not out.exists()
