"""A study's data prepared once before any cell starts (ablate.driver.preparing, `ablate data`): one set per
data configuration, runs that tokenize nothing and record which set they read, refusals before
anything is recorded, and the held-out study with a loss target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ablate.cli import main

ROOT = Path(__file__).resolve().parents[3]

TWO_CORPORA = """
name: twodata
base:
  device: cpu
  model: {preset: tiny}
  data: {corpus: jsonl, path: a.jsonl, val_tokens: 2048}
  train: {steps: 3, batch_size: 2, seq_len: 32, eval_every: 3, warmup_steps: 1}
data_cache: cache
grid:
  data.path: [a.jsonl, b.jsonl]
  fp4_gemms: [[], [wgrad]]
"""


def _corpus(path: Path, word: str) -> None:
    docs = [f"{word} document {i}: " + f"{word} and more {word} text. " * 30 for i in range(60)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))


def _mlflow_params(out: Path) -> list[dict[str, str]]:
    from mlflow.tracking import MlflowClient

    from ablate.tracking import default_uri

    client = MlflowClient(tracking_uri=default_uri(out))
    exp = client.get_experiment_by_name("twodata")
    runs = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'")
    return [r.data.params for r in runs]


@pytest.mark.slow
def test_prepare_writes_one_set_per_data_configuration_and_run_tokenizes_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "a.jsonl", "alpha")
    _corpus(tmp_path / "b.jsonl", "beta")
    (tmp_path / "s.yaml").write_text(TWO_CORPORA)
    res = CliRunner().invoke(main, ["data", "show", "s.yaml", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 2 and not any(r["prepared"] for r in rows)
    assert all(len(r["cells"]) == 2 for r in rows)

    res = CliRunner().invoke(main, ["data", "prepare", "s.yaml"])
    assert res.exit_code == 0, res.output
    assert res.output.count("data: prepared ") == 2
    sets = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir())
    assert sets == sorted(r["key"] for r in rows)

    res = CliRunner().invoke(main, ["run", "s.yaml", "--executor", "local", "--no-report"])
    assert res.exit_code == 0, res.output
    assert "data: tokenizing" not in res.output and "data: prepared " not in res.output
    assert res.output.count("prepared already") == 2
    params = _mlflow_params(tmp_path / "runs" / "twodata")
    assert len(params) == 4
    by_path = {p["data.path"]: p["data.prepared"] for p in params}
    assert sorted(by_path.values()) == sets
    assert {p["data.prepared"] for p in params if p["data.path"] == "a.jsonl"} == {
        by_path["a.jsonl"]
    }


def test_each_data_configuration_is_keyed_once_however_many_seeds_read_it(
    tmp_path: Path, monkeypatch
) -> None:
    """A key stats every corpus file and hashes a tokenizer file; each seed has its own
    data_seed, which splits and orders the tokens only. `status`, `plan` and `run` key a study's
    data, and every command checks it first: each once per cell, 2000 cells of a 200-file corpus
    took 14 s to key and 11 s to check."""
    import ablate.driver.preparing as preparing
    from ablate.study import load_study

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "a.jsonl", "alpha")
    _corpus(tmp_path / "b.jsonl", "beta")
    seeds = TWO_CORPORA.replace("fp4_gemms: [[], [wgrad]]", "seed: [0, 1, 2, 3]")
    (tmp_path / "s.yaml").write_text(seeds)
    import ablate.study.expand as expand

    checked: list[str | None] = []  # and the study's checks, every command's first step
    real_check = expand.check_sources
    monkeypatch.setattr(expand, "check_sources", lambda c: checked.append(c.path) or real_check(c))
    study = load_study(tmp_path / "s.yaml")
    assert sorted(checked) == ["a.jsonl", "b.jsonl"]
    keyed: list[str | None] = []
    real = preparing.data_key
    monkeypatch.setattr(preparing, "data_key", lambda cfg: keyed.append(cfg.path) or real(cfg))
    sets = preparing.study_data(study)
    assert sorted(keyed) == ["a.jsonl", "b.jsonl"]
    assert [len(s.cells) for s in sets] == [4, 4]
    assert len({c.config.data.data_seed for c in sets[0].cells}) == 4  # each seed its own order


def test_too_few_tokens_is_refused_before_anything_is_recorded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "a.jsonl", "alpha")
    _corpus(tmp_path / "b.jsonl", "beta")
    (tmp_path / "s.yaml").write_text(TWO_CORPORA.replace("val_tokens: 2048", "val_tokens: 200000"))
    res = CliRunner().invoke(main, ["run", "s.yaml", "--executor", "local"])
    assert res.exit_code == 2, res.output
    assert "fewer than data.val_tokens (200000)" in res.output and "a.jsonl" in res.output
    assert not (tmp_path / "runs").exists()  # no store, no folder: nothing recorded
    # prepared now, validate sees the counts too, in seconds
    res = CliRunner().invoke(main, ["validate", "s.yaml"])
    assert res.exit_code == 2 and "fewer than data.val_tokens (200000)" in res.output


def test_more_tokenizing_processes_than_cpus_are_refused_before_any_starts(
    tmp_path: Path, monkeypatch
) -> None:
    """Each worker is a forked process: `--workers 100000` forked that many before. The bound is
    the CPUs this process may use (its affinity, as SLURM sets it), not the machine's."""
    import os

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "a.jsonl", "alpha")
    _corpus(tmp_path / "b.jsonl", "beta")
    (tmp_path / "s.yaml").write_text(TWO_CORPORA)
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one CPU: no affinity narrower than the machine to set")
    os.sched_setaffinity(0, {min(mine)})  # this thread, where the command runs
    try:
        res = CliRunner().invoke(main, ["data", "prepare", "s.yaml", "--workers", "2"])
    finally:
        os.sched_setaffinity(0, mine)
    assert res.exit_code == 2 and "--workers" in res.output, res.output
    assert "2 tokenizing processes, but this process may use 1 CPUs" in res.output
    assert "give at most 1" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "cache").exists()


def test_ui_takes_more_server_workers_than_cpus_up_to_a_bound_that_says_why(
    tmp_path: Path, monkeypatch
) -> None:
    """UI server workers are mostly idle: `ablate ui --workers 4` was refused on two cores."""
    import os

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "a.jsonl", "alpha")
    _corpus(tmp_path / "b.jsonl", "beta")
    (tmp_path / "s.yaml").write_text(TWO_CORPORA)
    for n in (str((os.cpu_count() or 1) + 1), "64"):  # taken: the study has no store yet
        res = CliRunner().invoke(main, ["ui", "s.yaml", "--workers", n])
        assert res.exit_code == 2 and "no MLflow store yet" in res.output, (n, res.output)
    res = CliRunner().invoke(main, ["ui", "s.yaml", "--workers", "65"])
    assert res.exit_code == 2 and "--workers" in res.output, res.output
    assert "65 server workers is more than 64: each is a process of about 300 MB" in res.output


def test_a_validation_corpus_with_too_few_tokens_keeps_what_a_study_recorded(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "a.jsonl", "alpha")
    _corpus(tmp_path / "v.jsonl", "gamma")
    study = """
name: twodata
base:
  device: cpu
  model: {preset: tiny}
  data: {corpus: jsonl, path: a.jsonl, val_tokens: 2048, val: {corpus: jsonl, path: v.jsonl}}
  train: {steps: 2, batch_size: 2, seq_len: 32, eval_every: 2, warmup_steps: 1}
data_cache: cache
grid:
  seed: [0]
"""
    (tmp_path / "s.yaml").write_text(study)
    res = CliRunner().invoke(main, ["run", "s.yaml", "--executor", "local", "--no-report"])
    assert res.exit_code == 0, res.output
    (params,) = _mlflow_params(tmp_path / "runs" / "twodata")
    assert params["data.val.path"] == "v.jsonl"
    (tmp_path / "s.yaml").write_text(study.replace("val_tokens: 2048", "val_tokens: 900000"))
    res = CliRunner().invoke(main, ["run", "s.yaml", "--executor", "local", "--no-report"])
    assert res.exit_code == 2
    assert "data.val: jsonl:v.jsonl has" in res.output and "data.val_tokens (900000)" in res.output
    assert len(_mlflow_params(tmp_path / "runs" / "twodata")) == 1  # the first run is still there


def test_the_c4_studies_validate_offline_with_the_llama_tokenizer_and_c4_validation() -> None:
    from ablate.study import load_study

    for name in ("mxfp4_wgrad_8b", "recipes_gpu"):
        study = load_study(ROOT / "studies" / f"{name}.yaml")
        data = study.cells[0].config.data
        assert data.hf_dataset == "allenai/c4" and data.tokenizer == "meta-llama/Llama-3.1-8B"
        assert data.val is not None and data.val.hf_split == "validation"
    assert load_study(ROOT / "studies" / "mxfp4_wgrad_8b.yaml").target.val_loss == 3.3


@pytest.mark.slow
def test_the_heldout_study_runs_and_reports_against_its_loss_target(
    tmp_path: Path, monkeypatch
) -> None:
    """studies/heldout.yaml as written but shorter (its kept report in reports/heldout/ is the full
    run): a separate validation corpus (docs/*.md) and a target given as a loss."""
    import yaml

    from ablate.driver.runner import run_study
    from ablate.report.study import report_study
    from ablate.study import parse_study

    monkeypatch.chdir(ROOT)  # the study reads docs/*.md from the repository's root
    raw = yaml.safe_load((ROOT / "studies" / "heldout.yaml").read_text())
    assert raw["base"]["data"]["val"] == {"corpus": "text", "path": "docs/*.md"}
    assert raw["target"] == {"val_loss": 3.3}
    raw["base"]["train"].update(steps=12, eval_every=4, eval_batches=4)  # of 16
    raw["target"] = {"val_loss": 4.0}  # what 12 steps reach
    raw["grid"] = [{"fp4_gemms": [[]], "seed": [0, 1]}]
    study = parse_study(raw, output=tmp_path / "out")
    res = run_study(study, executor="local", progress=False)
    assert [o.status for o in res.outcomes.values()] == ["finished", "finished"]
    rep = report_study(study, out_dir=tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "`val_loss: 4`" in md and "Target: validation perplexity **54.6" in md
    import pandas as pd

    summary = pd.read_csv(tmp_path / "rep" / "summary.csv")
    assert summary["tokens_to_target"].notna().all(), rep
