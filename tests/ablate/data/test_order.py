"""The batch order follows the seed: each seed of a study reads its own order (``data.data_seed``
left out), so a comparison between configurations does not rest on one order; a study can still
fix one order, and a study recorded when every seed read order 0 is found again that way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ablate.cli import main
from ablate.data import BatchSampler, DataConfig
from ablate.driver.planning import plan
from ablate.study import load_study
from ablate.tracking import StudyTracker
from ablate.train.config import RunConfig, config_hash

STUDY = """\
name: order
base:
  device: cpu
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 4, batch_size: 2, seq_len: 32, eval_every: 2}
grid:
  base_format: [bf16, fp8]
  seed: [0, 1, 2]
baseline: {base_format: fp8}
"""


def test_a_runs_batch_order_is_its_seed_unless_the_data_section_fixes_one():
    assert RunConfig(seed=3).data.data_seed == 3
    assert RunConfig(seed=3, data=DataConfig(data_seed=0)).data.data_seed == 0
    shared = DataConfig()  # one data section for every seed, as a study's base gives it
    a, b = RunConfig(seed=1, data=shared), RunConfig(seed=2, data=shared)
    assert (a.data.data_seed, b.data.data_seed, shared.data_seed) == (1, 2, None)
    # the key holds the number: seed 0's key is the one it always had, a later seed's is new and
    # differs from the same seed on the shared order 0
    assert config_hash(RunConfig()) == config_hash(RunConfig(data=DataConfig(data_seed=0)))
    assert config_hash(RunConfig(seed=1)) != config_hash(
        RunConfig(seed=1, data=DataConfig(data_seed=0))
    )
    assert config_hash(RunConfig(seed=1)) == config_hash(
        RunConfig(seed=1, data=DataConfig(data_seed=1))
    )
    # a run's recorded config reads back to the same key
    c = RunConfig(seed=5)
    back = RunConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back.data.data_seed == 5 and config_hash(back) == config_hash(c)


def test_two_seeds_read_two_orders_of_the_same_windows():
    tokens = torch.arange(20_001)
    one, two = (BatchSampler(tokens, 32, 8, RunConfig(seed=s).data.data_seed or 0) for s in (1, 2))
    first = [one.next()[0] for _ in range(3)]
    assert not all(torch.equal(x, two.next()[0]) for x in first)


@pytest.mark.parametrize("bad", ["'seed'", "-1", "4294967296", "1.5"])
def test_a_bad_data_seed_is_refused_naming_the_field(tmp_path, bad):
    path = tmp_path / "s.yaml"
    path.write_text(STUDY.replace("val_tokens: 4096}", f"val_tokens: 4096, data_seed: {bad}}}"))
    res = CliRunner().invoke(main, ["validate", str(path)])
    assert res.exit_code == 2, res.output
    assert "data.data_seed" in res.output and ("[0, 2^32)" in res.output or "integer" in res.output)


def test_a_study_fixes_one_order_for_every_seed(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(STUDY)
    own = load_study(path, output=tmp_path / "runs")
    assert {c.config.seed: c.config.data.data_seed for c in own.cells} == {0: 0, 1: 1, 2: 2}
    path.write_text(STUDY.replace("val_tokens: 4096}", "val_tokens: 4096, data_seed: 0}"))
    fixed = load_study(path, output=tmp_path / "runs")
    assert {c.config.data.data_seed for c in fixed.cells} == {0}
    # seed 0 is the same cell either way; seeds 1 and 2 are other cells
    same = {c.key for c in own.cells} & {c.key for c in fixed.cells}
    assert same == {c.key for c in own.cells if c.config.seed == 0}


def test_runs_recorded_on_the_shared_order_are_kept_and_named_not_reused(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(STUDY)
    study = load_study(path, output=tmp_path / "runs")
    # what the code before recorded: every seed on order 0, each run under the key it had then
    tracker = StudyTracker(study.tracking_uri, study.name, experiment=study.experiment)
    parent = tracker.parent_run(study.text)
    for c in study.cells:
        d = c.config.to_dict()
        d["data"]["data_seed"] = 0
        run_id = tracker.create_run(parent, config_hash(RunConfig.from_dict(d)), c.label, {}, {})
        tracker.set_status(run_id, "finished")
    actions = {(p.cell.config.seed, p.action) for p in plan(study)}
    assert actions == {(0, "skip"), (1, "run"), (2, "run")}  # seed 0's cells are the same cells
    res = CliRunner().invoke(main, ["status", str(path), "--output", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output
    assert "seed(s) 1, 2: runs recorded when every seed read batch order 0 are kept" in res.output
    assert "data: {data_seed: 0}" in res.output
    # fixing the order finds them again: nothing to train
    path.write_text(STUDY.replace("val_tokens: 4096}", "val_tokens: 4096, data_seed: 0}"))
    fixed = load_study(path, output=tmp_path / "runs")
    assert {p.action for p in plan(fixed)} == {"skip"}
    res = CliRunner().invoke(main, ["status", str(path), "--output", str(tmp_path / "runs")])
    assert "batch order 0" not in res.output
