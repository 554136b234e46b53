"""Sequential seeds (``ablate.report.sequential``): the confidence sequence's critical values hold
their level on fresh draws at every number of pairs at once; the decision rule's outcomes,
including the one-sided decisions censored pairs allow; the seed plan's looks and its refusals;
and whole sequential studies (shared seed effects, stalls, censoring, waves) decided wrongly in at
most 5% of studies over every look and comparison, where the same waves judged by fixed-n t
intervals err several times as often."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ablate.bench.sequential import SETTINGS, run
from ablate.report.sequential import (
    MARGIN,
    N_MIN,
    _abs_t,
    critical_value,
    decide,
    judge,
    seeds_to_decide,
    tail_level,
)
from ablate.report.stats import t_quantile
from ablate.study.seeds import SeedPlan


@pytest.mark.parametrize("comparisons", [1, 4])
def test_the_sequence_crosses_its_boundary_at_its_level_on_fresh_draws(comparisons):
    """Draws other than the calibration's: some n in [3, 10] crosses c_n in alpha / J of the
    sequences (to three standard errors), while one look's t_0.975 is crossed far more often."""
    rng = np.random.default_rng(7)
    draws = 100_000
    t = _abs_t(rng.standard_normal((draws, 10)))[:, N_MIN - 1 :]
    c = np.array([critical_value(n, 10, comparisons) for n in range(N_MIN, 11)])
    crossed = float((t > c).any(axis=1).mean())
    level = 0.05 / comparisons
    assert abs(crossed - level) < 3 * math.sqrt(level * (1 - level) / draws), crossed
    naive = np.array([t_quantile(0.975, n - 1) for n in range(N_MIN, 11)])
    assert float((t > naive).any(axis=1).mean()) > 0.15  # peeking at fixed-n intervals


def test_the_critical_values_fall_with_pairs_and_rise_with_comparisons():
    c = [critical_value(n, 10, 4) for n in range(N_MIN, 11)]
    assert all(a > b for a, b in zip(c, c[1:], strict=False))
    assert critical_value(10, 10, 8) > critical_value(10, 10, 4) > critical_value(10, 10, 1)
    assert 0.05 / 8 < tail_level(10, 1) < 0.05  # looks share the error, correlated: not Bonferroni
    with pytest.raises(ValueError, match="n 2: between 3 and n_max 10"):
        critical_value(2, 10)


@pytest.mark.parametrize(
    ("lo", "hi", "lower", "upper", "state"),
    [
        (-0.02, 0.03, False, False, "equivalent"),
        (0.01, 0.04, False, False, "equivalent"),  # slower, but within the margin: said so
        (0.02, 0.30, False, False, "slower"),
        (-0.30, -0.06, False, False, "faster"),
        (-0.10, 0.20, False, False, "open"),
        (0.02, 0.30, True, False, "slower"),  # lower bounds support slower
        (-0.02, 0.03, True, False, "open"),  # ... and nothing else
        (-0.30, -0.06, True, False, "open"),
        (-0.30, -0.06, False, True, "faster"),  # upper bounds support faster
        (0.02, 0.30, False, True, "open"),
        (0.02, 0.30, True, True, "open"),
        (math.nan, math.nan, False, False, "open"),
    ],
)
def test_what_an_interval_decides(lo, hi, lower, upper, state):
    assert decide(lo, hi, MARGIN, lower, upper) == state


def test_a_comparison_is_judged_from_three_pairs_on_its_own_critical_value():
    assert judge([0.3, 0.31], n_max=10).state == "open"  # too few pairs
    j = judge([0.30, 0.31, 0.29, 0.30], n_max=10, comparisons=4)
    assert j.state == "slower" and j.pairs == 4 and j.critical == critical_value(4, 10, 4)
    assert j.lo > 0 and math.isclose(j.cost[0], math.expm1(0.30))
    half = j.critical * float(np.std([0.30, 0.31, 0.29, 0.30], ddof=1)) / 2
    assert math.isclose(j.hi - j.lo, 2 * half)
    bounded = judge([0.3, 0.31, 0.29], n_max=10, lower=[False, True, False])
    assert bounded.state == "slower" and bounded.censored == 1
    naive = judge([0.0, 0.1, -0.05], n_max=10, naive=True)
    assert naive.critical == t_quantile(0.975, 2)


def test_an_open_comparison_says_how_many_pairs_would_decide_it():
    j = judge([0.10, 0.02, 0.15, 0.05, 0.08], n_max=10, comparisons=2)
    assert j.state == "open"
    n = seeds_to_decide(j, n_max=10, comparisons=2, up_to=14)
    assert n is not None and n > 5
    # at that many pairs, with the same mean and spread, the interval excludes 0
    sd = float(np.std([0.10, 0.02, 0.15, 0.05, 0.08], ddof=1))
    assert j.log_ratio - critical_value(n, 14, 2) * sd / math.sqrt(n) > 0
    assert seeds_to_decide(judge([0.3, 0.31, 0.29], n_max=10), n_max=10) is None  # decided


def test_a_censored_open_comparison_is_counted_to_the_decision_its_bounds_allow():
    d = [0.10, 0.02, 0.15, 0.05, 0.08]
    free = judge(d, n_max=10, comparisons=2)
    low = judge(d, n_max=10, comparisons=2, lower=[False, False, True, False, False])
    assert low.state == "open" and low.censored == low.lower_bounds == 1
    # a lower bound allows "slower" only: the count is the one that takes the interval above 0
    assert seeds_to_decide(low, n_max=10, comparisons=2, up_to=14) == seeds_to_decide(
        free, n_max=10, comparisons=2, up_to=14
    )
    # near zero, an uncensored comparison is decided equivalent long before it could be slower;
    # one with a lower bound can only become slower, which these pairs never do
    flat = [0.04, -0.05, 0.05, 0.0, -0.03]
    assert seeds_to_decide(judge(flat, n_max=10), n_max=10, up_to=50) is not None
    assert seeds_to_decide(judge(flat, n_max=10, lower=[True] + [False] * 4), n_max=10) is None
    # an upper bound allows "faster" only; bounds on both sides allow nothing
    up = judge([-x for x in d], n_max=10, comparisons=2, upper=[False, True, False, False, False])
    assert up.lower_bounds == 0 and seeds_to_decide(up, n_max=10, comparisons=2, up_to=14)
    both = judge(d, n_max=10, lower=[True] + [False] * 4, upper=[False, True] + [False] * 3)
    assert both.state == "open" and seeds_to_decide(both, n_max=10) is None


def test_a_seed_plan_looks_in_waves_and_refuses_what_cannot_be_judged():
    assert SeedPlan(initial=3, step=2, max=10).looks() == [3, 5, 7, 9, 10]
    assert SeedPlan(initial=4, step=3, max=10).looks() == [4, 7, 10]
    assert SeedPlan(initial=10, step=2, max=10).looks() == [10]
    with pytest.raises(ValueError, match=r"initial\n  Input should be greater than or equal to 3"):
        SeedPlan(initial=2, step=2, max=10)
    with pytest.raises(ValueError, match=r"step\n  Input should be greater than or equal to 1"):
        SeedPlan(initial=3, step=0, max=10)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_whole_sequential_studies_err_at_most_5_percent_over_every_look(name):
    studies = 800
    seq, naive = run(SETTINGS[name], studies, seed=1)
    se = math.sqrt(0.05 * 0.95 / studies)
    assert seq.family_error <= 0.05 + 2 * se, seq
    if name != "quiet runs (sd 0.02): 0, +2%, +10.5%, +35%":  # large effects: little to peek at
        assert naive.family_error > 3 * max(seq.family_error, 0.02), naive
    assert seq.mean_seeds <= seq.fixed_seeds
    assert sum(seq.decided) >= sum(seq.fixed_decided) - 0.05  # stopping early loses no decisions
