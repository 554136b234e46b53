"""Stalls (``ablate.report.stalls``): which runs are taken for stalled, the exact rate interval and
test against scipy-free references, and what the report does with them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ablate.bench.seeds import SETTINGS, Setting, draw
from ablate.report.metrics import (
    clean_evals,
    equal_loss_curves,
    per_cell,
    per_config,
    resolve_target,
)
from ablate.report.stalls import clopper_pearson, fisher_greater, stall_rate, stalled_runs
from ablate.report.verdict import verdict
from ablate.study.schema import Target


def test_a_run_far_above_what_its_configurations_other_seeds_predict_is_stalled():
    # seed 1 is 3% slower everywhere (a seed effect); the baseline's seed 1 sits on the plateau
    ppl = {("fp8", 0): 16.0, ("fp8", 1): 28.0, ("a", 0): 17.0, ("a", 1): 17.5,
           ("b", 0): 19.0, ("b", 1): 19.6, ("c", 0): math.nan, ("d", 0): 20.0}  # fmt: skip
    flags = stalled_runs(ppl)
    assert flags[("fp8", 1)] is True
    assert [k for k, v in flags.items() if v] == [("fp8", 1)]  # its partner is not blamed
    assert flags[("c", 0)] is None and flags[("d", 0)] is None  # not judged: no value, no partner


def test_a_costly_configuration_and_a_slow_seed_are_not_stalls():
    # every seed of "slow" is 60% above the baseline: a cost; seed 2 is 40% above everywhere
    base = {0: 16.0, 1: 16.4, 2: 22.4}
    ppl = {("fp8", s): v for s, v in base.items()}
    ppl |= {("slow", s): v * 1.6 for s, v in base.items()}
    ppl |= {("x", s): v * 1.05 for s, v in base.items()}
    assert not any(stalled_runs(ppl).values())


def test_the_exact_rate_interval_and_fisher_test_match_their_closed_forms():
    # k = 0: (0, 1 - 0.025^(1/n)); k = n: (0.025^(1/n), 1); scipy.stats.binomtest(1, 2) exact CI
    assert clopper_pearson(0, 3) == pytest.approx((0.0, 1 - 0.025 ** (1 / 3)))
    assert clopper_pearson(3, 3) == pytest.approx((0.025 ** (1 / 3), 1.0))
    assert clopper_pearson(1, 2) == pytest.approx((0.0125791170934, 0.9874208829066))
    # 3/3 against 0/3: one table of C(6, 3) = 20 is as extreme; scipy's fisher_exact agrees
    assert fisher_greater(3, 3, 0, 3) == pytest.approx(1 / 20)
    assert fisher_greater(0, 3, 3, 3) == pytest.approx(1.0)
    assert fisher_greater(2, 4, 1, 4) == pytest.approx(0.5)
    assert not stall_rate(3, 3, base=(0, 3)).more_than_baseline  # p = 0.05 exactly: not below
    r = stall_rate(4, 4, base=(0, 4))
    assert r.more_than_baseline and r.rate == 1.0 and r.p == pytest.approx(1 / 70)


@pytest.mark.parametrize(
    ("setting", "false_at_most", "found_at_least"),
    [("shared seed effect", 0.01, None), ("stall-prone baseline (0.3 vs 0.05)", 0.015, 0.9)],
)
def test_stalls_are_found_and_ordinary_runs_are_not_taken_for_them(
    setting, false_at_most, found_at_least
):
    # the simulated studies of docs/report.md's table: seed effect sd 0.2, residual sd 0.06 in
    # log tokens, a stall holds a run on the early plateau for 25-75% of its budget
    s: Setting = SETTINGS[setting]
    n = 200
    runs = len(s.costs) * s.seeds * n
    false = found = drawn = 0
    for study in draw(s, n, 20261126):
        false += len(study.stalled - study.drawn_stalls)
        found += len(study.stalled & study.drawn_stalls)
        drawn += len(study.drawn_stalls)
    assert false / (runs - drawn) <= false_at_most
    if found_at_least is not None:
        assert found / drawn >= found_at_least


def _plateau_study(study, stalled_seed: int | None, x_stretch: float = 0.9):
    """Baseline and x, two seeds each, 10 evaluations; ``stalled_seed`` of the baseline sits on
    the plateau until its last evaluations."""

    def curve(stretch, stall=False):
        t = np.arange(1, 11) / 10
        ppl = 10 * (t / stretch) ** -0.5
        return [max(float(p), 25.0) if stall and i < 8 else float(p) for i, p in enumerate(ppl)]

    runs = {}
    for s in (0, 1):
        runs[f"b{s}"] = {"config": "fp8", "seed": s, "baseline": True,
                         "ppl": curve(1.0 + 0.02 * s, stall=s == stalled_seed)}  # fmt: skip
        runs[f"x{s}"] = {"config": "x", "seed": s, "fp4_gemms": "fprop",
                         "ppl": curve(x_stretch + 0.02 * s)}  # fmt: skip
    return study(runs)


def test_a_stalled_baseline_seed_sets_neither_the_target_nor_the_costs(study):
    cells, evals = _plateau_study(study, stalled_seed=1)
    clean, _ = _plateau_study(study, stalled_seed=None)
    target = Target(from_baseline="slowest")
    assert resolve_target(target, evals, cells) == pytest.approx(
        resolve_target(target, _plateau_study(study, None)[1], clean), rel=0.05
    )
    ppl = resolve_target(target, evals, cells)
    table = per_config(per_cell(cells, evals, ppl)).set_index("config")
    base, x = table.loc["fp8"], table.loc["x"]
    assert (base["seeds_stalled"], base["seeds_judged"]) == (1, 2)
    assert "stalled" in base["note"] and "seed 1" in base["note"]
    assert x["seeds_stalled"] == 0 and x["stall_p"] == pytest.approx(1.0)
    assert verdict(x.to_dict() | {"baseline": False})[0] != "worse"
    # the figure of the equal-loss ratio leaves the stalled seed out as the table does: it ends
    # at the table's ratio (x slower than the baseline here, so that the ratio is observed)
    cells, evals = _plateau_study(study, stalled_seed=1, x_stretch=1.2)
    ev = clean_evals(cells, evals)
    cell_table = per_cell(cells, ev, ppl)
    ratio = per_config(cell_table, None, ev).set_index("config").loc["x", "equal_loss_token_ratio"]
    _, curve, _ = equal_loss_curves(cell_table, ev)["x"]
    assert np.isfinite(ratio) and curve[-1] == pytest.approx(ratio, rel=1e-6)


def test_a_configuration_that_stalls_more_often_than_its_baseline_is_worse():
    row = {"baseline": False, "stall_p": 0.02, "seeds_stalled": 4, "seeds_judged": 4,
           "projected_speedup_lo": 1.1, "projected_speedup_hi": 1.3}  # fmt: skip
    v, why = verdict(row)
    assert v == "worse" and "stalls more often" in why and "4/4" in why
