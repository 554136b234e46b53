"""Sequential seeds through ``ablate run`` (``ablate.driver.waves``): a study with ``seeds:`` trains
in waves on the local executor into a real MLflow store; a configuration decided after the first
wave gets no more seeds, an open one gets ``step`` more up to ``max`` with the baseline beside it;
``ablate status`` replays the waves from the store and says each comparison's state; a second
``ablate run`` trains nothing and reaches the same verdicts, and a requeued SLURM job finds
nothing to run; the report opens with the waves' decisions and reads only the seeds the waves
asked for and trained (not another seed of the same store). And what a study with ``seeds:`` may
not write, refused before anything runs."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.errors import StudyError
from ablate.report.sequential import Judgement
from ablate.report.waves import Comparison, configs_of, grow, wave_cells
from ablate.slurm.session import SlurmRun, _to_run
from ablate.study import load_study, parse_study

BASE = {
    "device": "cpu",
    "model": {"preset": "tiny", "dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "ffn_dim": 64},
    "data": {"val_tokens": 2048},
    "train": {"steps": 40, "batch_size": 4, "seq_len": 32, "eval_every": 4, "eval_batches": 2,
              "warmup_steps": 2, "lr": 0.003},
}  # fmt: skip
SLOW, FP4 = "bf16/lr=3e-05", "mxfp4[fprop,dgrad,wgrad]/bf16/lr=0.003"


def _raw(**over) -> dict:
    raw = {
        "name": "waves",
        "base": BASE,
        "grid": [{"fp4_gemms": [[], ["fprop", "dgrad", "wgrad"]]}, {"train.lr": [0.00003]}],
        "baseline": {"fp4_gemms": [], "train.lr": 0.003},
        "target": {"val_ppl": 120},
        "seeds": {"initial": 3, "step": 1, "max": 4, "margin": 0.01},
    }
    raw.update(over)
    return {k: v for k, v in raw.items() if v is not None}


@pytest.mark.parametrize(
    ("over", "says"),
    [
        (
            {"grid": {"fp4_gemms": [[], ["wgrad"]], "seed": [0, 1]}},
            "grid.seed: a study with seeds:",
        ),
        ({"baseline": None}, "baseline: a study with seeds: compares"),
        ({"exclude": [{"train.lr": 1.0}, {"seed": 1}]}, "exclude[1].seed: a study with seeds:"),
        (
            {"exclude": [{"fp4_gemms": [[]], "seed": [2, 3]}]},
            "exclude[0].seed: a study with seeds: trains seeds 0 to seeds.max - 1",
        ),
        (
            {"baseline": {"fp4_gemms": [], "train.lr": 0.003, "seed": 0}},
            "baseline.seed: a study with seeds: pairs every seed",
        ),
        ({"target": {"from_baseline": "slowest"}}, "target: a study with seeds: needs val_ppl"),
        ({"seeds": {"initial": 2}}, "seeds.initial"),
        ({"seeds": {"initial": 5, "max": 4}}, "initial: 5 is more than max (4)"),
        ({"seeds": {"initial": 3, "stride": 1}}, "seeds.stride: unknown key"),
        ({"seeds": {"margin": True}}, "seeds.margin: a fraction in (0, 1), not True"),
        ({"seeds": {"margin": float("nan")}}, "seeds.margin: Input should be a finite number"),
    ],
)
def test_what_a_study_with_seeds_may_not_write_is_refused(tmp_path, over, says):
    raw = _raw(**over)
    if "base" in over:
        raw["base"] = over["base"]
    with pytest.raises(StudyError) as e:
        parse_study(raw, output=tmp_path / "out")
    assert says in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_an_excluded_seed_is_refused_by_validate_with_exit_2(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_raw(exclude=[{"seed": 1}])))
    res = CliRunner().invoke(main, ["validate", str(p), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert "exclude[0].seed: a study with seeds:" in res.output and "missing pair" in res.output
    assert "Traceback" not in res.output


def test_every_seed_up_to_max_is_a_cell_and_a_wave_asks_for_the_seeds_given():
    study = parse_study(_raw(), output="/nonexistent")
    assert len(study.cells) == 3 * 4 and study.sequential is not None
    assert configs_of(study) == [FP4, SLOW]
    asked = wave_cells(study, {FP4: 4, SLOW: 3})
    assert sorted((c.config_label, c.seed) for c in asked if c.baseline) == [
        ("bf16/lr=0.003", s) for s in range(4)
    ]  # the baseline as many as the most-seeded configuration
    assert sorted(c.seed for c in asked if c.config_label == SLOW) == [0, 1, 2]
    # the same keys as a study that writes the seed axis itself
    fixed = parse_study(
        _raw(seeds=None, grid=[{"fp4_gemms": [[], ["fprop", "dgrad", "wgrad"]], "seed": [0, 1, 2, 3]},
                               {"train.lr": [0.00003], "seed": [0, 1, 2, 3]}]),
        output="/nonexistent",
    )  # fmt: skip
    assert {c.key for c in fixed.cells} == {c.key for c in study.cells}


def test_only_open_comparisons_grow_and_none_past_max():
    study = parse_study(_raw(), output="/nonexistent")
    plan = study.sequential
    assert plan is not None

    def comp(state: str) -> Comparison:
        return Comparison("x", 3, Judgement(state, 3, 0.0, -1.0, 1.0, 9.0), 0, 0)

    assert grow(plan, {FP4: 3, SLOW: 3}, {FP4: comp("open"), SLOW: comp("slower")}) == {
        FP4: 4,
        SLOW: 3,
    }
    assert grow(plan, {FP4: 4, SLOW: 3}, {FP4: comp("open"), SLOW: comp("slower")}) == {
        FP4: 4,
        SLOW: 3,
    }


@pytest.mark.slow
def test_a_study_with_seeds_trains_in_waves_and_stops_each_configuration_when_decided(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the report goes to reports/<study> here
    path = tmp_path / "waves.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(main, ["run", str(path), "-o", str(out), "--executor", "local", "--quiet"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert f"wave 1: seeds per configuration: {FP4} 3, {SLOW} 3" in text
    assert f"wave 2: seeds per configuration: {FP4} 4, {SLOW} 3" in text
    assert f"{SLOW} (3 seeds): slower +" in text and "(3 censored)" in text  # never reaches
    assert "1 configuration(s) open at seeds.max (4)" in text
    assert "wave 3" not in text
    st = runner.invoke(main, ["status", str(path), "-o", str(out), "--json"])
    doc = json.loads(st.output)
    trained = sorted(row["label"] for row in doc["cells"])
    assert len(trained) == 11 and not any(row["status"] != "finished" for row in doc["cells"])
    assert not any(label.startswith(SLOW) and label.endswith("seed3") for label in trained)
    assert doc["comparisons"][SLOW] == {"state": "slower", "seeds": 3, "pairs": 3}
    assert doc["comparisons"][FP4]["state"] == "open" and doc["comparisons"][FP4]["seeds"] == 4
    # a requeued SLURM job finds nothing left either (SLOW's seed 3 no wave asked for): no Ray
    said = io.StringIO()
    assert _to_run(load_study(path, output=out), False, False, SlurmRun(), said) is None
    assert "nothing to run: the study's 11 cells have ended" in said.getvalue()
    # run again: the waves replay from the store, nothing trains, the same verdicts
    again = runner.invoke(
        main, ["run", str(path), "-o", str(out), "--executor", "local", "--quiet", "--no-report"]
    )
    assert again.exit_code == 0, again.output
    # wave 1 replayed from the store without passing through the runner; wave 2 once more
    assert "waves 1-1: replayed from the store" in again.output and "9 cells" not in again.output
    assert "wave 2: seeds per configuration" in again.output and "11 cells: 11 skip" in again.output
    assert f"{SLOW} (3 seeds): slower +" in again.output
    # a wave-2 cell lost from the store: wave 1 still replays, wave 2 trains that cell alone
    lost = next(row for row in doc["cells"] if row["label"].startswith(FP4) and row["label"].endswith("seed3"))  # fmt: skip
    MlflowClient(f"sqlite:///{out / 'mlflow.db'}").delete_run(lost["run_id"])
    third = runner.invoke(
        main, ["run", str(path), "-o", str(out), "--executor", "local", "--quiet", "--no-report"]
    )
    assert third.exit_code == 0, third.output
    assert "waves 1-1: replayed from the store" in third.output
    assert "11 cells: 1 run, 10 skip" in third.output
    assert "1 configuration(s) open at seeds.max (4)" in third.output
    # the lost run's checkpoint is set aside, not resumed into the new run (which would hold no
    # curve): the cell trained again from step 0 and its pair is whole
    cells_dir = out / "cells"
    assert len(list(cells_dir.glob(f"{lost['key']}.orphan-*"))) == 1
    st = runner.invoke(main, ["status", str(path), "-o", str(out), "--json"])
    assert json.loads(st.output)["comparisons"][FP4] == {"state": "open", "seeds": 4, "pairs": 4}
    # a seed no wave asked for, trained into the same store by a study with a written seed axis
    # (the same key as the sequential study's SLOW seed 3): neither the decision nor the report
    # reads it
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        yaml.safe_dump(
            {"name": "waves", "base": BASE, "grid": {"train.lr": [0.00003], "seed": [3]}}
        )
    )
    res = runner.invoke(
        main, ["run", str(extra), "-o", str(out), "--executor", "local", "--quiet", "--no-report"]
    )
    assert res.exit_code == 0 and "1 cells: 1 run" in res.output, res.output
    rep = runner.invoke(main, ["report", str(path), "--runs", str(out)])
    assert rep.exit_code == 0, rep.output
    report = tmp_path / "reports" / "waves" / "report.md"
    assert report.exists()
    md = report.read_text()
    assert "not ended" not in md  # the seeds never asked for are not pending
    assert f"{SLOW}/seed3" not in md and "11 runs" in md, md[:400]
    # the verdict opens with the sequential decision, the lines `ablate run` printed
    verdict = md[md.index("## Verdict") : md.index("## Summary")]
    assert "**Sequential decision** (the study's `seeds:` rule, after 2 wave(s)" in verdict
    last = [ln.strip() for ln in text.splitlines() if ln.strip().startswith((f"{SLOW} (3 seeds)", f"{FP4} (4 seeds)"))]  # fmt: skip
    assert len(last) >= 2 and all(f"- {ln}" in verdict for ln in last[-2:])
    assert verdict.index("Sequential decision") < verdict.index("Faster than the baseline")


def test_plan_says_the_cells_are_the_most_and_what_the_first_wave_trains(tmp_path):
    path = tmp_path / "waves.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    res = CliRunner().invoke(main, ["plan", str(path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "would: run 12" in res.output
    assert "sequential seeds: at most these 12 cells (seeds.max 4); the first wave trains 9" in (
        res.output
    )
