"""Tokens to target, per cell and per configuration, on hand-built curves with known answers."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest

from ablate.errors import ReportError
from ablate.report.metrics import clean_evals, per_cell, per_config, report_notes, resolve_target
from ablate.targets import tokens_to_target

# --- tokens_to_target -------------------------------------------------------------------------


def test_exact_hit_at_an_evaluation_returns_its_tokens():
    # ppl 10 -> 5 -> 3.3, target 5: the second evaluation is exactly on target
    assert tokens_to_target([100, 200, 300], [10, 5, 3.3], 5.0) == 200


def test_crossing_is_linear_in_log_perplexity_between_bracketing_evaluations():
    # (1000, ppl 4) -> (2000, ppl 2), target 2*sqrt(2): log p falls from 2 ln2 to ln2, the target's
    # log is 1.5 ln2, halfway -> 1500 (linear in ppl would give 1000 + 1000 * 1.172/2 = 1586)
    assert tokens_to_target([1000, 2000], [4, 2], 2 * math.sqrt(2)) == pytest.approx(
        1500, rel=1e-12
    )
    # target 3: frac = ln(4/3) / ln(4/2) = 0.2876821 / 0.6931472 = 0.4150375 -> 1415.0375
    assert tokens_to_target([1000, 2000], [4, 2], 3.0) == pytest.approx(1415.0375, rel=1e-7)


def test_first_evaluation_already_below_target_returns_its_tokens():
    assert tokens_to_target([100, 200], [3.0, 2.9], 3.3) == 100


def test_never_reaching_the_target_returns_none():
    assert tokens_to_target([100, 200, 300], [9, 8, 7], 3.3) is None
    assert tokens_to_target([], [], 3.3) is None


def test_only_the_first_crossing_counts():
    # 5 -> 3 crosses 3.5 first: frac = ln(5/3.5)/ln(5/3) = 0.3566749/0.5108256 = 0.6982323 -> 169.82323
    got = tokens_to_target([100, 200, 300, 400], [5, 3, 4, 2], 3.5)
    assert got == pytest.approx(169.82323, rel=1e-7)


def test_non_finite_perplexities_are_skipped():
    # the NaN at 200 is ignored: the crossing is between (100, 4) and (300, 2) -> halfway at 200
    assert tokens_to_target([100, 200, 300], [4, math.nan, 2], 2 * math.sqrt(2)) == pytest.approx(
        200
    )
    # a perplexity of 0 (a loss of -inf, as a damaged store can hold) has no log: skipped too
    assert tokens_to_target([100, 200, 300], [4, 0.0, 2], 2 * math.sqrt(2)) == pytest.approx(200)


# --- per_cell ---------------------------------------------------------------------------------


def test_duplicate_steps_keep_the_last_logged_row(study):
    cells, evals = study(
        {"a": {"config": "fp8", "baseline": True, "ppl": [8, 9, 2], "steps": [100, 200, 300]}}
    )
    # a resumed run re-logged step 200 with ppl 4 after the first (9): the 4 wins, an exact hit
    evals.loc[len(evals)] = {"key": "a", "step": 200, "tokens": 200_000.0, "val_loss": math.log(4)}
    assert len(clean_evals(cells, evals)) == 3
    row = per_cell(cells, evals, 4.0).iloc[0]
    assert (
        row["tokens_to_target"] == 200_000
    )  # with the first row it would cross between 200 and 300
    assert row["n_evals"] == 3 and row["best_ppl"] == pytest.approx(2)


def test_diverged_run_is_marked_with_its_step_and_does_not_count(study):
    cells, evals = study(
        {
            "b0": {"config": "fp8", "baseline": True, "ppl": [10, 5, 3]},
            # crossed ppl 6 between 100 and 200, then diverged at step 300: it must not count
            "d0": {
                "config": "x",
                "ppl": [10, 5, math.nan],
                "status": "diverged",
                "diverged_at": 300,
            },
            "d1": {"config": "x", "seed": 1, "ppl": [10, 6, 4]},
        }
    )
    table = per_cell(cells, evals, 6.0)
    d0 = table.set_index("key").loc["d0"]
    assert d0["outcome"] == "diverged" and d0["diverged_at"] == 300
    assert math.isnan(d0["tokens_to_target"]) and not d0["reached"]
    # it did cross before diverging: 100k + 100k * ln(10/6) / ln(10/5) = 173,697
    assert d0["crossed_tokens"] == pytest.approx(173_696.6, abs=0.1)
    assert d0["best_ppl"] == pytest.approx(5)  # over the finite evaluations before divergence
    cfg = per_config(table).set_index("config").loc["x"]
    # a failure in the success rate...
    assert (cfg["seeds_total"], cfg["seeds_reached"], cfg["n_diverged"]) == (2, 1, 1)
    # ...but its crossing is data for the tokens estimate: geometric mean of 173.7k and 200k
    assert cfg["tokens_to_target"] == pytest.approx(math.sqrt(173_696.6 * 200_000), rel=1e-6)
    assert "seed 0 at step 300" in cfg["note"]


def test_a_nan_loss_in_a_finished_run_marks_divergence_at_that_step(study):
    cells, evals = study({"a": {"config": "fp8", "baseline": True, "ppl": [10, 8, math.inf, 2]}})
    row = per_cell(cells, evals, 3.0).iloc[0]
    assert row["outcome"] == "diverged" and row["diverged_at"] == 300
    assert row["final_ppl"] == pytest.approx(8)  # the curve ends before the inf (step 400 ignored)


def test_never_reached_reports_best_perplexity_and_incomplete_runs_are_not_called_failures(study):
    cells, evals = study(
        {
            "a": {"config": "fp8", "baseline": True, "ppl": [9, 4.2, 4.5]},
            "b": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [9, 5], "status": "running"},
            "c": {"config": "fp8", "seed": 2, "baseline": True, "status": "pending"},
        }
    )
    table = per_cell(cells, evals, 4.0).set_index("key")
    assert table.loc["a", "outcome"] == "not reached" and table.loc[
        "a", "best_ppl"
    ] == pytest.approx(4.2)
    assert table.loc["a", "final_ppl"] == pytest.approx(4.5)
    assert table.loc["b", "outcome"] == "incomplete"
    assert table.loc["c", "outcome"] == "no evals" and table.loc["c", "n_evals"] == 0


# --- per_config -------------------------------------------------------------------------------


def _three_configs(study, baseline_reaches=True):
    """Baseline crosses ppl 4 exactly at steps 100/200/300 (or never: 9 down to 5); ``x`` at
    200/300/400; ``y`` has seeds 0 and 2 only (a missing seed), crossing at 200 and 400."""

    def curve(hit):  # exact hit of 4 at step `hit` (100-step evaluations up to 500)
        return [8.0 if s < hit else 4.0 if s == hit else 3.0 for s in range(100, 600, 100)]

    runs = {}
    for s, hit in enumerate((100, 200, 300)):
        ppl = curve(hit) if baseline_reaches else [9.0, 8.0, 7.0, 6.0, 5.0]
        runs[f"b{s}"] = {"config": "fp8", "seed": s, "baseline": True, "ppl": ppl}
    for s, hit in enumerate((200, 300, 400)):
        runs[f"x{s}"] = {
            "config": "mxfp4[fprop]/fp8",
            "seed": s,
            "fp4_gemms": "fprop",
            "ppl": curve(hit),
        }
    for s, hit in ((0, 200), (2, 400)):
        runs[f"y{s}"] = {
            "config": "mxfp4[fprop,dgrad]/fp8",
            "seed": s,
            "fp4_gemms": "fprop+dgrad",
            "ppl": curve(hit),
        }
    return study(runs)


def test_relative_token_cost_without_censoring_is_the_two_way_t_interval_on_log_tokens(study):
    cells, evals = _three_configs(study)
    table = per_config(per_cell(cells, evals, 4.0), evals=clean_evals(cells, evals))
    table = table.set_index("config")
    base, x = table.loc["fp8"], table.loc["mxfp4[fprop]/fp8"]
    assert base["rel_token_cost"] == 0 and base["rel_token_cost_kind"] == "reference"
    # the baseline's median tokens: geometric mean of 100k, 200k, 300k
    assert base["tokens_to_target"] == pytest.approx((100e3 * 200e3 * 300e3) ** (1 / 3))
    # seeds pair the configurations: log T = configuration + seed + noise over all 8 runs (b and
    # x seeds 0-2, y seeds 0 and 2), least squares; df = 8 - 3 configurations - 3 seeds + 1 = 3
    runs = [("b", 0, 1e5), ("b", 1, 2e5), ("b", 2, 3e5), ("x", 0, 2e5), ("x", 1, 3e5),
            ("x", 2, 4e5), ("y", 0, 2e5), ("y", 2, 4e5)]  # fmt: skip
    design = np.array(
        [[c == "b", c == "x", c == "y", s == 1, s == 2] for c, s, _ in runs], dtype=float
    )
    logs = np.log([t for *_, t in runs])
    coef = np.linalg.solve(design.T @ design, design.T @ logs)
    resid = logs - design @ coef
    s2 = float(resid @ resid) / 3
    d = coef[1] - coef[0]
    contrast = np.array([-1.0, 1.0, 0, 0, 0])
    half = 3.182446305284263 * math.sqrt(
        s2 * contrast @ np.linalg.inv(design.T @ design) @ contrast
    )
    # t(0.975, 3), scipy.stats
    assert x["rel_token_cost_kind"] == "observed" and x["rel_token_cost_method"] == "paired"
    assert x["rel_token_cost_df"] == 3
    assert x["rel_token_cost"] == pytest.approx(math.exp(d) - 1, rel=1e-9)
    assert x["rel_token_cost_lo"] == pytest.approx(math.expm1(d - half), abs=1e-6)
    assert x["rel_token_cost_hi"] == pytest.approx(math.expm1(d + half), abs=1e-6)
    # mi355x model, fprop in MXFP4, the rest FP8, vs all FP8: 0.75 / (0.5 + (1/6)/4 + (2/6)/2)
    assert x["speedup_source"] == "model:mi355x"
    assert x["throughput_gain"] == pytest.approx(0.75 / (0.5 + 1 / 24 + 1 / 6))
    gain = x["throughput_gain"]
    assert x["projected_speedup"] == pytest.approx(gain / math.exp(d))
    assert x["projected_speedup_lo"] == pytest.approx(gain / (1 + x["rel_token_cost_hi"]))
    assert x["projected_speedup_hi"] == pytest.approx(gain / (1 + x["rel_token_cost_lo"]))


def test_a_missing_seed_is_counted_and_reported(study):
    cells, evals = _three_configs(study)
    table = per_config(per_cell(cells, evals, 4.0))
    y = table.set_index("config").loc["mxfp4[fprop,dgrad]/fp8"]
    assert (y["seeds_total"], y["seeds_reached"], bool(y["partial"])) == (2, 2, False)
    assert y["tokens_to_target"] == pytest.approx(math.sqrt(200e3 * 400e3))
    notes = report_notes(table, 4.0)
    assert any("fewer than 3 seeds" in n and "mxfp4[fprop,dgrad]/fp8" in n for n in notes)
    assert not any("sequential" in n for n in notes)
    # a study of sequential seeds says why: a configuration stops once it is decided
    (short,) = [n for n in report_notes(table, 4.0, sequential=True) if "fewer than" in n]
    assert "mxfp4[fprop,dgrad]/fp8" in short
    assert short.endswith("(sequential seeds: each stopped once its comparison was decided).")


def test_a_seed_that_never_reaches_the_target_raises_the_cost_instead_of_vanishing(study):
    # the survivor mean would say "+0%": x0 reaches exactly when the baseline seeds do, x1 never
    # does in its budget. Censored at its last evaluation (500k), x1 must push the cost up.
    runs = {
        "b0": {"config": "fp8", "baseline": True, "ppl": [8, 4, 3, 3, 3]},
        "b1": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [8, 5, 4, 3, 3]},
        "x0": {"config": "x", "ppl": [8, 4, 3, 3, 3]},
        "x1": {"config": "x", "seed": 1, "ppl": [8, 7, 6, 5, 4.5]},  # finished above the target
    }
    cells, evals = study(runs)
    x = per_config(per_cell(cells, evals, 4.0)).set_index("config").loc["x"]
    assert (x["seeds_total"], x["seeds_reached"], x["n_not_reached"]) == (2, 1, 1)
    assert bool(x["partial"]) and x["rel_token_cost_kind"] == "censored"
    survivor_mean_cost = 200e3 / math.sqrt(200e3 * 300e3) - 1  # x0 alone vs the baseline: -18%
    assert x["rel_token_cost"] > 0.15 > survivor_mean_cost
    assert "censored" in x["note"]


def test_a_configuration_no_seed_of_which_reaches_the_target_gets_a_lower_bound_only(study):
    runs = {
        "b0": {"config": "fp8", "baseline": True, "ppl": [8, 4, 3]},
        "b1": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [8, 5, 4]},
        "b2": {"config": "fp8", "seed": 2, "baseline": True, "ppl": [8, 4.5, 3.5]},
        "x0": {"config": "x", "ppl": [8, 7, 6]},
        "x1": {"config": "x", "seed": 1, "ppl": [8, 6, 5]},
    }
    cells, evals = study(runs)
    x = per_config(per_cell(cells, evals, 4.0)).set_index("config").loc["x"]
    assert x["rel_token_cost_kind"] == "bound" and math.isnan(x["rel_token_cost"])
    # the bound allows for the seed noise (sigma from the baseline's three seeds): below the
    # naive "censored tokens / baseline" ratio, above -100%
    crossings = (200e3, 300e3, 200e3 + 100e3 * math.log(4.5 / 4) / math.log(4.5 / 3.5))
    naive = 300e3 / statistics.geometric_mean(crossings) - 1
    assert -1 < x["rel_token_cost_lo"] < naive and x["rel_token_cost_hi"] == math.inf
    # no point speedup for a cost that is only bounded; the speedup is at most gain / (1 + lo)
    assert math.isnan(x["projected_speedup"])
    assert x["projected_speedup_hi"] == pytest.approx(
        x["throughput_gain"] / (1 + x["rel_token_cost_lo"])
    )
    # the note says what was observed (still above the target after this many baseline medians)
    assert "cost only bounded" in x["note"] and f"after {naive + 1:.2f}x" in x["note"]


def test_a_negative_lower_bound_reads_as_what_was_observed(study):
    # two configuration seeds still above the target after 1.5x the baseline's tokens, but with
    # two seeds each the 95% lower bound stays below zero: the report says what it saw
    from ablate.report.verdict import cost_and_speedup

    runs = {
        "b0": {"config": "fp8", "baseline": True, "ppl": [8, 4.5, 3.9, 3.5]},
        "b1": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [8, 4.2, 4.1, 3.0]},
        "x0": {"config": "x", "ppl": [8, 6, 5, 4.4]},
        "x1": {"config": "x", "seed": 1, "ppl": [8, 5, 4.4, 4.2]},
    }
    cells, evals = study(runs)
    table = per_config(per_cell(cells, evals, 4.0), evals=clean_evals(cells, evals))
    x = table.set_index("config").loc["x"]
    assert x["rel_token_cost_kind"] == "bound" and x["rel_token_cost_lo"] < 0
    assert x["not_reached_after"] > 1
    cost, speed = cost_and_speedup(x.to_dict())
    assert cost == f"not reached after {x['not_reached_after']:.2f}x the baseline's tokens"
    assert speed.startswith("at most")
    # a bound above zero reads as one
    row = {**x.to_dict(), "rel_token_cost_lo": 0.05}
    assert cost_and_speedup(row)[0] == "at least +5.0% (95% lower bound)"


def test_a_baseline_trained_past_the_budget_counts_up_to_it_and_says_so(study):
    # baseline seeds: 4 evaluations in the budget (steps 100-400), then 2 more (baseline_extend)
    runs = {
        "b0": {"config": "fp8", "baseline": True, "ppl": [8, 6, 5, 4.5, 4.2, 4.0]},
        "b1": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [8, 6.5, 5.5, 5.0, 4.4, 4.1]},
        "x0": {"config": "x", "ppl": [8, 6.2, 5.2, 4.6]},
        "x1": {"config": "x", "seed": 1, "ppl": [8, 6.4, 5.3, 4.7]},
    }
    for key in ("b0", "b1"):
        runs[key]["schedule_steps"] = 400
    cells, evals = study(runs)
    # a target from the baseline's final perplexity: the budget's (4.5, 5.0), not the end's
    assert resolve_target({"from_baseline": "final"}, evals, cells) == pytest.approx(4.75)
    cell = per_cell(cells, evals, 4.8).set_index("key")
    assert cell.loc["b0", "outcome"] == "reached" and cell.loc["b0", "last_tokens"] == 400e3
    # b1 gets below 4.8 only after the budget: censored there, as an ordinary cell would be
    assert cell.loc["b1", "outcome"] == "not reached"
    assert cell.loc["b1", "final_ppl"] == pytest.approx(5.0)
    assert 400e3 < cell.loc["b1", "extended_crossing"] < 500e3
    assert cell.loc["b1", "extended_tokens"] == 600e3 and math.isnan(
        cell.loc["x0", "extended_tokens"]
    )
    table = per_config(per_cell(cells, evals, 4.8), evals=clean_evals(cells, evals)).set_index(
        "config"
    )
    assert "trained 1.50x the budget (baseline_extend)" in table.loc["fp8", "note"]
    assert "seed 1 reached the target only after the budget" in table.loc["fp8", "note"]
    # the equal-loss ratio reads the whole curves: x ends (4.6, 4.7) on both baseline seeds';
    # x shares seeds 0 and 1 with the baseline: paired, seed by seed
    assert table.loc["x", "equal_loss_token_ratio_kind"] == "observed"
    assert table.loc["x", "equal_loss_token_ratio_method"] == "paired"
    cut = evals[~(evals["key"].isin(["b0", "b1"]) & (evals["step"] > 400))]
    plain = per_config(per_cell(cells, cut, 4.8), evals=clean_evals(cells, cut)).set_index("config")
    # paired, no pair is censored without the extension either: each pair is read at the higher of
    # its two final losses, which both runs reached (x1 against b1 at b1's 5.0)
    assert plain.loc["x", "equal_loss_token_ratio_kind"] == "observed"
    assert plain.loc["x", "equal_loss_token_ratio_method"] == "paired"
    b0_at = 300e3 + 100e3 * math.log(5.0 / 4.6) / math.log(5.0 / 4.5)  # b0 first at x0's 4.6
    x1_at = 300e3 + 100e3 * math.log(5.3 / 5.0) / math.log(5.3 / 4.7)  # x1 first at b1's 5.0
    x_pairs = [math.log(400e3 / b0_at), math.log(x1_at / 400e3)]
    assert plain.loc["x", "equal_loss_token_ratio"] == pytest.approx(math.exp(np.mean(x_pairs)))
    # unpaired (x's seeds 2 and 3 are not the baseline's): without the extension b1 never gets
    # down to x's losses: censored pairs, said in the notes
    other = {**runs, "x0": {**runs["x0"], "seed": 2}, "x1": {**runs["x1"], "seed": 3}}
    cells2, evals2 = study(other)
    cut2 = evals2[~(evals2["key"].isin(["b0", "b1"]) & (evals2["step"] > 400))]
    plain = per_config(per_cell(cells2, cut2, 4.8), evals=clean_evals(cells2, cut2))
    plain = plain.set_index("config")
    assert plain.loc["x", "equal_loss_token_ratio_kind"] == "censored"
    assert plain.loc["x", "equal_loss_token_ratio_method"] == "unpaired"
    assert "pairs are off the baseline's curve" in plain.loc["x", "note"]
    # a baseline seed that diverges only in its extension is, up to the budget, a finished run
    runs["b1"].update(ppl=[8, 6.5, 5.5, 5.0, 4.4, math.nan], status="diverged", diverged_at=600)
    cells, evals = study(runs)
    cell = per_cell(cells, evals, 4.8).set_index("key")
    assert cell.loc["b1", "outcome"] == "not reached" and cell.loc["b1", "diverged_at"] == 600
    assert resolve_target({"from_baseline": "final"}, evals, cells) == pytest.approx(4.75)
    table = per_config(per_cell(cells, evals, 4.8), evals=clean_evals(cells, evals)).set_index(
        "config"
    )
    assert "seed 1 diverged at step 600, after the budget" in table.loc["fp8", "note"]
    assert table.loc["x", "equal_loss_token_ratio_kind"] == "observed"  # b1's curve to step 500


def test_baseline_that_never_reaches_the_target_gives_nan_costs_and_a_message(study):
    cells, evals = _three_configs(study, baseline_reaches=False)
    table = per_config(per_cell(cells, evals, 4.0))
    assert table["rel_token_cost"].isna().all()
    assert table["projected_speedup"].isna().all()
    notes = report_notes(table, 4.0)
    assert "never reached the target perplexity 4" in notes[0] and "best was 5" in notes[0]


def test_baseline_comes_first_then_more_fp4_gemms(study):
    cells, evals = _three_configs(study)
    order = list(per_config(per_cell(cells, evals, 4.0))["config"])
    assert order == ["fp8", "mxfp4[fprop]/fp8", "mxfp4[fprop,dgrad]/fp8"]


# --- resolve_target ---------------------------------------------------------------------------


class Target:
    def __init__(self, val_ppl=None, val_loss=None, from_baseline=None, tolerance=0.0):
        self.val_ppl, self.val_loss, self.from_baseline, self.tolerance = (
            val_ppl,
            val_loss,
            from_baseline,
            tolerance,
        )


def test_absolute_targets(study):
    cells, evals = _three_configs(study)
    assert resolve_target(Target(val_ppl=3.3), evals, cells) == 3.3
    assert resolve_target(Target(val_loss=math.log(3.3)), evals, cells) == pytest.approx(3.3)


def test_target_from_baseline_final_perplexity_with_tolerance(study):
    cells, evals = study(
        {
            "b0": {"config": "fp8", "baseline": True, "ppl": [9, 3.0]},
            "b1": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [9, 3.4, 3.2]},
            "b2": {
                "config": "fp8",
                "seed": 2,
                "baseline": True,
                "ppl": [9, 1.0],
                "status": "running",
            },
            "x0": {"config": "x", "ppl": [9, 2.0]},
        }
    )
    # finished baseline runs only: final ppl 3.0 and 3.2 -> mean 3.1, * 1.01 = 3.131
    assert resolve_target(
        Target(from_baseline="final", tolerance=0.01), evals, cells
    ) == pytest.approx(3.131)
    # best: 3.0 and 3.2 (b1's best is its last) -> 3.1
    assert resolve_target({"from_baseline": "best"}, evals, cells) == pytest.approx(3.1)


def test_target_from_a_baseline_without_finished_runs_is_a_plain_error(study):
    cells, evals = study(
        {"b0": {"config": "fp8", "baseline": True, "ppl": [9, 5], "status": "running"}}
    )
    with pytest.raises(ReportError, match="baseline config 'fp8' has no finished run.*1 running"):
        resolve_target(Target(from_baseline="final"), evals, cells)


def test_target_needs_exactly_one_kind(study):
    cells, evals = _three_configs(study)
    with pytest.raises(
        ReportError, match="exactly one of val_ppl, val_loss, from_baseline; got val_ppl, val_loss"
    ):
        resolve_target(Target(val_ppl=3.3, val_loss=1.2), evals, cells)
    with pytest.raises(ReportError, match="got none"):
        resolve_target(Target(), evals, cells)


def test_inputs_without_exactly_one_baseline_config_are_rejected(study):
    cells, evals = study({"a": {"config": "fp8", "ppl": [9, 5]}})
    with pytest.raises(ReportError, match="exactly one config must be the baseline; found none"):
        per_cell(cells, evals, 4.0)


def test_target_from_the_slowest_baseline_seed_is_reached_by_every_seed_in_time(study):
    # budgets 500k; at 0.75 -> 375k: b0 has reached 3.0 (at 300k), b1 is between 3.6 (300k) and
    # 3.2 (400k): log-interpolated at 375k -> exp(0.25 ln 3.6 + 0.75 ln 3.2) = 3.2956
    cells, evals = study(
        {
            "b0": {"config": "fp8", "baseline": True, "ppl": [9, 5, 3.0, 2.9, 2.8]},
            "b1": {"config": "fp8", "seed": 1, "baseline": True, "ppl": [9, 6, 3.6, 3.2, 3.0]},
            "x0": {"config": "x", "ppl": [9, 8, 7, 6, 5]},
        }
    )
    expected = math.exp(0.25 * math.log(3.6) + 0.75 * math.log(3.2))
    got = resolve_target({"from_baseline": "slowest"}, evals, cells)
    assert got == pytest.approx(expected, rel=1e-12)
    table = per_cell(cells, evals, got).set_index("key")
    assert table.loc["b0", "tokens_to_target"] <= 375_000
    assert table.loc["b1", "tokens_to_target"] == pytest.approx(375_000)
    assert resolve_target({"from_baseline": "slowest", "at": 1.0}, evals, cells) == pytest.approx(
        3.0
    )
    # median: the median seed's perplexity at 75% (with two seeds, the mean of b0's 2.95 at 375k,
    # between 3.0 and 2.9, and b1's): one slow seed no longer sets it alone
    b0 = math.exp(0.25 * math.log(3.0) + 0.75 * math.log(2.9))
    median = resolve_target({"from_baseline": "median"}, evals, cells)
    assert median == pytest.approx((b0 + expected) / 2, rel=1e-12)
    assert resolve_target({"from_baseline": "median", "at": 1.0}, evals, cells) == pytest.approx(
        2.9
    )


def test_mlflow_gets_only_the_upper_end_of_an_equal_loss_ratio_that_is_a_bound():
    from ablate.report.run_metrics import config_summaries

    def row(config, kind):
        nan = math.nan
        return {
            "config": config, "seeds_reached": 2, "seeds_total": 2, "rel_token_cost": 0.1,
            "rel_token_cost_lo": 0.0, "rel_token_cost_hi": 0.2, "equal_loss_token_ratio": 0.9,
            "equal_loss_token_ratio_lo": 0.0 if kind == "bound" else 0.8,
            "equal_loss_token_ratio_hi": 1.1, "equal_loss_token_ratio_kind": kind,
            "projected_speedup": nan, "projected_speedup_lo": nan, "projected_speedup_hi": nan,
        }  # fmt: skip

    out = config_summaries(pd.DataFrame([row("a", "bound"), row("b", "censored")]), {})
    assert "equal_loss_token_ratio.a" not in out and out["equal_loss_token_ratio_hi.a"] == 1.1
    assert out["equal_loss_token_ratio.b"] == 0.9 and out["equal_loss_token_ratio_lo.b"] == 0.8


@pytest.mark.parametrize(("gamma", "late"), [(3.0, True), (0.0, False)], ids=["late", "constant"])
def test_a_cost_that_grows_after_the_target_is_noted_from_the_paired_end_ratio(study, gamma, late):
    # five paired seeds drawn as ablate.bench.targets draws them: a cost of +60% at the end, which
    # comes late (gamma 3: about +20% where the target is read) or stays constant (gamma 0)
    from ablate.bench.targets import runs

    rng = np.random.default_rng(7)
    seeds = 5
    a = 0.1 * rng.standard_normal(seeds)
    spec = {}
    for config, cost in (("fp8", 0.0), ("x", 0.6)):
        k = np.exp(a + 0.01 * rng.standard_normal(seeds))
        tokens, ppl = runs(rng, k, cost, gamma, 40)
        for i in range(seeds):
            spec[f"{config}{i}"] = {
                "config": config, "seed": i, "baseline": config == "fp8",
                "ppl": ppl[i].tolist(), "tokens": tokens.tolist(),
                "steps": list(range(1, len(tokens) + 1)),
            }  # fmt: skip
    cells, evals = study(spec)
    target = resolve_target({"from_baseline": "slowest"}, evals, cells)
    table = per_config(per_cell(cells, evals, target), evals=clean_evals(cells, evals))
    x = table.set_index("config").loc["x"]
    assert x["equal_loss_token_ratio_method"] == "paired"
    assert ("pays late" in x["note"]) is late, x["note"]
    if late:  # read at the target, the cost is a fraction of what the end of training shows
        assert x["rel_token_cost_hi"] < 0.25 < x["equal_loss_token_ratio_lo"] - 1  # +22%, x1.30
