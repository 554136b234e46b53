"""``ablate plan``'s compute: the FLOPs of the steps the cells to run train (6 N + 12 L C T per
token), decay branches counted from their branch points, and GPU-hours at a sustained rate; the
8B ladder costs a third of the 8B ablation it predicts from, and each of its cells fits one GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ablate.cli import main
from ablate.driver.compute import compute
from ablate.driver.planning import plan
from ablate.model import flops_per_token
from ablate.study import load_study, parse_study

ROOT = Path(__file__).resolve().parents[3]


def test_compute_is_the_flops_of_every_step_to_train(tmp_path):
    study = parse_study(
        {
            "name": "c",
            "base": {
                "model": {"preset": "tiny"},
                "train": {"steps": 10, "batch_size": 4, "seq_len": 32},
            },
            "grid": {"seed": [0, 1]},
        },  # fmt: skip
        output=tmp_path / "out",
        check_files=False,
    )
    cost = compute(study, plan(study))
    per_token = flops_per_token(study.cells[0].config.model, 32)
    assert cost.steps == 20 and cost.tokens == 20 * 4 * 32
    assert cost.flops == 20 * 4 * 32 * per_token
    assert cost.gpu_hours(100.0) == cost.flops / 1e14 / 3600


def test_decay_branches_cost_their_decays_only(tmp_path):
    spec = {
        "name": "b",
        "base": {"model": {"preset": "tiny"}, "train": {"batch_size": 4, "seq_len": 32,
                 "warmup_steps": 2, "schedule": "wsd", "decay_fraction": 0.25}},
        "grid": {"train.steps": [8, 16]},
    }  # fmt: skip
    study = parse_study(spec, output=tmp_path / "out", check_files=False)
    # the trunk trains 16 steps, the branch its decay of 2 from step 6
    assert compute(study, plan(study)).steps == 16 + 2


@pytest.mark.slow
def test_the_8b_ladder_costs_two_thirds_of_the_8b_ablation(monkeypatch):
    # the plan without the ladder's expected width (16 simulated ladders, 16 s of CPU here; that
    # line has its own tests in tests/ablate/report/ladder/test_ladder_study.py)
    monkeypatch.setattr("ablate.cli.plan._ladder_width", lambda study: None)

    def planned(name: str) -> dict:
        res = CliRunner().invoke(
            main, ["plan", str(ROOT / "studies" / f"{name}.yaml"), "--json", "--gpu-tflops", "400"]
        )
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout[res.stdout.index("{") :])

    ladder, study = planned("ladder_8b"), planned("mxfp4_wgrad_8b")
    assert 2000 < ladder["compute"]["gpu_hours"] < 2600  # budgets of 10, 20 and 40 per parameter
    assert 3000 < study["compute"]["gpu_hours"] < 4000
    # one GPU a cell, as the study says: every cell's estimate fits an 80 GB H100 (79.6 GiB)
    peak = max(c["memory"]["total"] for c in ladder["cells"])
    assert peak < 0.9 * 79.6 * 2**30, f"{peak / 2**30:.1f} GiB"
    assert load_study(ROOT / "studies" / "ladder_8b.yaml", check_files=False).file.ladder
