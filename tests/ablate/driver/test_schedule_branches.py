"""Precision schedules' shared prefixes in a study (``ablate.study.families.schedule_families``): an
FP8 run (a baseline trained past its budget) is the trunk of MXFP4 runs with FP8 warmups, an MXFP4 run the trunk of one with a BF16
tail; each branch starts from its trunk's checkpoint where their recipes part, on real MLflow and
the in-process executor, and every recorded number and the final weights equal those of the cell
trained from step 0; the branch checkpoints are removed once their branches have results;
``plan`` counts the steps saved."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.driver.runner import run_study
from ablate.study import Study, parse_study
from ablate.study.families import branch_root, schedule_families
from ablate.train.checkpoint import CHECKPOINT, load_file

TIMING = {"tokens_per_s"}
FULL = ["fprop", "dgrad", "wgrad"]


def raw(name: str) -> dict:
    return {
        "name": name,
        "base": {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 2048},
            "train": {
                "steps": 8, "batch_size": 4, "seq_len": 32, "warmup_steps": 2, "eval_every": 3,
                "eval_batches": 1,
            },
            "base_format": "fp8",
            "fp4_gemms": FULL,
            "intervention": "sr",  # stochastic rounding: the random streams must match too
            "warmup": {"recipe": "fp8", "first": 0},
            "tail": {"recipe": "bf16", "gemms": ["fprop"], "last": 0},
        },
        "grid": [
            {"fp4_gemms": [[]], "intervention": ["none"]},  # FP8: the warmups' trunk
            {"warmup.first": [0, 2, 3]},  # 0: plain MXFP4, the tail's trunk
            {"tail.last": [3]},
        ],
        "baseline": {"fp4_gemms": []},
        "baseline_extend": 0.5,  # the FP8 trunk trains 12 steps, its schedule's 8 and 4 more
        "resources": {"cpus": 1},
    }  # fmt: skip


def study(tmp_path: Path, name: str) -> Study:
    spec = raw(name) | {"tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    return parse_study(spec, output=tmp_path / name, text="# test\n")


def run(s: Study, **kw):
    return run_study(s, executor="local", progress=False, stream=io.StringIO(), **kw)


def recorded(s: Study) -> dict[str, dict[str, list[tuple[int, float]]]]:
    client = MlflowClient(tracking_uri=s.tracking_uri)
    exp = client.get_experiment_by_name(s.name)
    out = {}
    for r in client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'"):
        out[r.data.tags["ablate.key"]] = {
            k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
            for k in r.data.metrics
            if k not in TIMING
        }
    return out


def test_the_families_are_the_prefixes_the_cells_share(tmp_path):
    s = study(tmp_path, "sched")
    by_label = {c.label: c for c in s.cells}
    fams = {f.trunk.label: f for f in schedule_families(s.cells)}
    assert set(fams) == {"fp8/warmup=0/tail=0", "mxfp4[fprop,dgrad,wgrad]+sr/fp8/warmup=0/tail=0"}
    fp8 = fams["fp8/warmup=0/tail=0"]
    assert [(c.label, p) for c, p in fp8.branches] == [
        ("mxfp4[fprop,dgrad,wgrad]+sr/fp8/warmup=2/tail=0", 2),
        ("mxfp4[fprop,dgrad,wgrad]+sr/fp8/warmup=3/tail=0", 3),
    ]
    mx = fams["mxfp4[fprop,dgrad,wgrad]+sr/fp8/warmup=0/tail=0"]
    assert [(c.label, p) for c, p in mx.branches] == [
        ("mxfp4[fprop,dgrad,wgrad]+sr/fp8/warmup=0/tail=3", 5)
    ]
    assert by_label["fp8/warmup=0/tail=0"].baseline and fp8.kind == "schedule"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_distributed_cells_share_their_prefixes_alike(tmp_path, parallel):
    """Cells of two workers make the same families (their branch checkpoints are sharded:
    ``tests/ablate/train/test_distributed.py`` trains a warmup as a branch on two ranks)."""
    spec = raw("dist") | {"tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    spec["base"]["train"]["parallel"] = parallel
    spec["resources"] = {"cpus": 1, "workers": 2}
    s = parse_study(spec, output=tmp_path / "dist", text="# test\n")
    one = study(tmp_path, "one")
    shape = [(f.trunk.label, [(c.label, p) for c, p in f.branches]) for f in schedule_families(one.cells)]  # fmt: skip
    fams = schedule_families(s.cells)
    assert [(f.trunk.label, [(c.label, p) for c, p in f.branches]) for f in fams] == shape
    assert all(c.config.train.resolved_parallel == parallel for f in fams for c, _ in f.branches)


@pytest.mark.slow
def test_schedule_branches_record_what_the_cells_trained_from_step_0_record(tmp_path):
    s = study(tmp_path, "sched")
    outcomes = run(s).outcomes
    assert [o.status for o in outcomes.values()] == ["finished"] * 5
    for f in schedule_families(s.cells):  # every branch has its result: no checkpoint is kept
        assert not any(branch_root(s.output_dir, f.key).iterdir())
    direct = study(tmp_path, "direct")
    assert [o.status for o in run(direct, branches=False).outcomes.values()] == ["finished"] * 5
    got, want = recorded(s), recorded(direct)
    for cell in s.cells:
        assert got[cell.key].keys() == want[cell.key].keys(), cell.label
        for name in got[cell.key]:  # every metric at every step, recipe_phase included
            assert got[cell.key][name] == want[cell.key][name], (cell.label, name)
        a = load_file(s.output_dir / "cells" / cell.key / CHECKPOINT)["model"]
        b = load_file(direct.output_dir / "cells" / cell.key / CHECKPOINT)["model"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), cell.label


def test_plan_counts_the_steps_the_shared_prefixes_save(tmp_path):
    path = tmp_path / "sched.yaml"
    path.write_text(yaml.safe_dump(raw("sched")))
    res = CliRunner().invoke(main, ["plan", str(path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "trunk of 2 schedule branches: checkpoints at steps 2, 3" in res.output
    assert "2 families of precision schedules" in res.output
    # 4 runs of 8 steps and the FP8 baseline's 12; the branches train 6, 5 and 3 of theirs
    assert "train 34 steps (trunks, then each branch from its branch point), 44 without" in (
        res.output
    )
    assert "[0, 2) fp8, [2, 8) mxfp4[fprop,dgrad,wgrad]+sr/fp8" in res.output
