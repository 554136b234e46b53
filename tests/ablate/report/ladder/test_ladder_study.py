"""A ladder study end to end, small but real: three explicit model sizes x two wsd budgets (each
size's smaller budget a decay branch of its larger one), FP8 against MXFP4 wgrad, two seeds, on
the in-process executor and a real MLflow store; ``ablate report`` then writes each rung's
report, the ladder's prediction, back-test and figure, ``ladder.csv`` and the parent run's
metrics; every run records the N the fits read. And what ``validate`` refuses of a ladder."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.driver.runner import run_study
from ablate.errors import StudyError
from ablate.model import ModelConfig, non_embedding_params
from ablate.report.ladder.predict import LADDER_COLUMNS
from ablate.report.study import report_study
from ablate.study import parse_study

SHAPES = {"model.dim": [32, 48, 64], "model.n_layers": [1, 2, 2], "model.ffn_dim": [64, 128, 192]}


def raw(tmp_path: Path, **over) -> dict:
    return {
        "name": "mini-ladder",
        "base": {
            "device": "cpu",
            "model": {"preset": "tiny", "n_heads": 2, "n_kv_heads": 1},
            "data": {"val_tokens": 2048},
            "train": {
                "batch_size": 4, "seq_len": 32, "warmup_steps": 2, "eval_every": 4,
                "eval_batches": 1, "schedule": "wsd", "decay_fraction": 0.25, "lr": 3e-3,
            },
            "base_format": "fp8",
        },
        "grid": {
            "zip": SHAPES, "train.steps": [8, 16], "fp4_gemms": [[], ["wgrad"]], "seed": [0, 1],
        },
        "baseline": {"fp4_gemms": []},
        "ladder": {"predict": {"params": 5e5, "tokens": 1e5}, "boot": 200},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        **over,
    }  # fmt: skip


@pytest.mark.slow
def test_a_ladder_study_runs_and_reports_per_rung_with_a_prediction(tmp_path):
    study = parse_study(raw(tmp_path), output=tmp_path / "out", text="# a ladder\n")
    assert {c.rung for c in study.cells} == {
        f"dim={d}/n_layers={n}/ffn_dim={f}/steps={s}"
        for d, n, f in zip(*SHAPES.values(), strict=True)
        for s in (8, 16)
    }
    assert {c.ladder_config for c in study.cells} == {"fp8", "mxfp4[wgrad]/fp8"}
    res = run_study(study, executor="local", progress=False, stream=io.StringIO())
    assert not res.failed and len(res.outcomes) == len(study.cells) == 24
    # every run records the N the fits read
    client = MlflowClient(study.tracking_uri)
    for c in study.cells[:3]:
        run = next(r for r in client.search_runs(
            [client.get_experiment_by_name(study.experiment).experiment_id],
            filter_string=f"tags.`ablate.key` = '{c.key}'",
        ))  # fmt: skip
        want = non_embedding_params(ModelConfig(**c.config.model.to_dict()))
        assert int(run.data.params["model.n_params_non_embedding"]) == want
    rep = report_study(study, tmp_path / "report")
    assert len(rep.rungs) == 6
    table = pd.read_csv(rep.ladder_csv)
    assert list(table.columns) == list(LADDER_COLUMNS)
    assert set(table["config"]) == {"mxfp4[wgrad]/fp8"}
    assert set(table["method"]) >= {"sloped", "quartet"}
    md = rep.report_md.read_text()
    assert "## Prediction at N* = 500k, D* = 100k" in md and "## Back-test" in md
    assert (tmp_path / "report" / "token_ratio.png").is_file()
    parent = client.search_runs(
        [client.get_experiment_by_name(study.experiment).experiment_id],
        filter_string="tags.`ablate.role` = 'study'",
    )
    assert parent and any(k.startswith("ladder.") for k in parent[0].data.metrics)
    # attached: every file the report wrote, each at its place under report/, and nothing else
    wrote = {f"report/{f.relative_to(tmp_path / 'report').as_posix()}" for f in rep.files}
    on_disk = {f"report/{f.relative_to(tmp_path / 'report').as_posix()}"
               for f in (tmp_path / "report").rglob("*") if f.is_file()}  # fmt: skip
    assert wrote == on_disk and "report/ladder_points.csv" in wrote

    def attached(path: str) -> set[str]:
        got = set()
        for a in client.list_artifacts(parent[0].info.run_id, path):
            got |= attached(a.path) if a.is_dir else {a.path}
        return got

    assert attached("report") == wrote


@pytest.mark.parametrize(
    ("over", "said"),
    [
        (
            {"ladder": {"size": "model.heads"}},
            "ladder.size: model.heads is not an axis of the grid",
        ),
        ({"baseline": None}, "ladder: compares each rung's configurations with its baseline"),
        ({"ladder": {"budget": "train.lr"}}, "ladder.budget: train.lr is not an axis"),
        ({"ladder": {"boot": 10}}, "ladder.boot"),
        ({"ladder": {"predict": {"params": -1, "tokens": 1e9}}}, "ladder.predict.params"),
        ({"baseline_extend": 0.5}, "ladder: a ladder reads each budget as trained to it"),
    ],
)
def test_a_ladder_that_cannot_be_compared_is_refused_naming_the_field(tmp_path, over, said):
    spec = raw(tmp_path, **over)
    with pytest.raises(StudyError, match=r"(?s).*" + said.replace("(", r"\(").replace("*", r"\*")):
        parse_study(spec, output=tmp_path / "out", check_files=False)


def test_validate_refuses_a_ladder_with_one_size_exit_2(tmp_path):
    spec = raw(tmp_path)
    spec["grid"]["zip"] = {k: v[:1] for k, v in SHAPES.items()}
    p = tmp_path / "one.yaml"
    import yaml

    p.write_text(yaml.safe_dump(spec))
    out = CliRunner().invoke(main, ["validate", str(p)])
    assert out.exit_code == 2 and "a ladder needs two sizes" in out.output


def test_sizes_whose_budgets_do_not_bracket_the_target_are_named_with_the_budgets_that_would(
    tmp_path,
):
    from click.testing import CliRunner

    from ablate.cli import main
    from ablate.driver.planning import ladder_brackets

    # 128 tokens a step; 4 and 64 steps: the three sizes (N = 9,312, 50,928, 98,624) train
    # 0.055-0.88, 0.010-0.16 and 0.0052-0.083 tokens per parameter; the prediction's is 0.12,
    # bracketed by 2x (0.06 to 0.24) by the first size's budgets only
    r = raw(tmp_path, ladder={"predict": {"params": 1e6, "tokens": 1.2e5}, "boot": 200})
    r["grid"]["train.steps"] = [4, 64]
    study = parse_study(r, output=tmp_path / "out", text="# a ladder\n")
    got = ladder_brackets(study)
    assert [line.split(" trains ")[0] for line in got] == [
        "ladder: the size of N = 0.0509M",
        "ladder: the size of N = 0.0986M",
    ]
    assert "add a budget at or above 0.24 tokens per parameter (train.steps >= 96)" in got[0]
    assert "(train.steps >= 185)" in got[1] and "at or below" not in got[1]
    r["ladder"] = {"predict": {"params": 1e6, "tokens": 1e3}, "boot": 200}  # 0.001: below all
    low = ladder_brackets(parse_study(r, output=tmp_path / "out", text="# a ladder\n"))
    assert len(low) == 3 and all("at or below 0.0005 tokens per parameter" in x for x in low)
    r["ladder"] = {"boot": 200}  # no prediction: nothing to bracket
    assert ladder_brackets(parse_study(r, output=tmp_path / "out", text="# a ladder\n")) == []
    # validate says so, and still accepts the study
    path = tmp_path / "ladder.yaml"
    r["ladder"] = {"predict": {"params": 1e6, "tokens": 1.2e5}, "boot": 200}
    path.write_text(yaml.safe_dump(r))
    res = CliRunner().invoke(main, ["validate", "-o", str(tmp_path / "o"), str(path)])
    assert res.exit_code == 0, res.output
    assert res.output.count("warning: ladder: the size of N") == 2


def test_plan_says_the_width_the_design_is_expected_to_give_at_the_target(tmp_path, monkeypatch):
    import numpy as np

    from ablate.driver.planning import ladder_width
    from ablate.report.ladder import simulate
    from ablate.report.ladder.simulate import CHINCHILLA, draw_design, quartet_truth

    r = raw(tmp_path, ladder={"predict": {"params": 1e6, "tokens": 1.2e5}, "boot": 200})
    study = parse_study(r, output=tmp_path / "out", text="# a ladder\n")
    line = ladder_width(study, ladders=4)
    assert line is not None and "at N* = 1e+06, D* = 1.2e+05: x" in line
    assert "3 sizes and 2 seed(s)" in line and "assumed 1% run-to-run spread" in line
    assert float(line.split(": x")[1].split(" ")[0]) > 1
    # a report's points measure the law and the noise instead: a 3% spread here
    budgets = {9312.0: (512.0, 1024.0), 50928.0: (512.0, 1024.0), 98624.0: (512.0, 1024.0)}
    truth = quartet_truth(CHINCHILLA, {"mxfp4[wgrad]/fp8": (1.0, 0.8)})
    f = draw_design(truth, budgets, 4, sigma_run=0.03, sigma_eval=0.0, rng=np.random.default_rng(0))
    f["config"] = f["config"].replace({"baseline": "fp8"})
    points = tmp_path / "ladder_points.csv"
    f.to_csv(points, index=False)
    measured = ladder_width(study, points, ladders=4)
    assert measured is not None and f"measured in {points}" in measured
    spread = float(measured.split("spread (")[1].split("%")[0])
    assert 1.5 < spread < 4.5
    # a damaged file is said, and the assumption stands (one simulated ladder from here on: what is
    # checked is which law and noise the line names, not its width)
    points.write_text("config,params\nfp8,-1\n")
    damaged = ladder_width(study, points, ladders=1)
    assert damaged is not None and "not used: " in damaged and "assumed 1%" in damaged
    # so is one of another study (no evaluations of this baseline), and one too large to read
    f.assign(config=f["config"].replace({"fp8": "bf16"})).to_csv(points, index=False)
    other = ladder_width(study, points, ladders=1)
    assert other is not None and "not used: " in other and "'fp8'" in other
    with points.open("r+b") as fh:
        fh.truncate(65 * 2**20)  # sparse: no 65 MiB written
    big = ladder_width(study, points, ladders=1)
    assert big is not None and "more than a ladder's points" in big
    # ablate plan prints it (its 16 simulated ladders cut to one)
    real = simulate.expected_width
    monkeypatch.setattr(simulate, "expected_width", lambda *a, **k: real(*a, **{**k, "ladders": 1}))
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump(r))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["plan", "-o", str(tmp_path / "o"), str(path)])
    assert res.exit_code == 0, res.output
    assert "ladder: expected width of each configuration's 95% interval at N* = 1e+06" in res.output
