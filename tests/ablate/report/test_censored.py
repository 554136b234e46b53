"""The censored tokens-to-target estimate: known answers, and simulated studies whose true token
cost is known: coverage of the 95% intervals and bias with censored seeds (of the configuration,
of the baseline, with a target derived from the baseline's own seeds), and the lower bound when no
seed reached the target (how often it exceeds the true cost, how far below it sits). The
equal-loss ratio has its own file (``test_equal_loss.py``)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from ablate.report import censored
from ablate.report.censored import Seeds, half_width, relative_cost, tokens_estimate
from ablate.report.equal_loss import seed_offsets
from ablate.report.stats import t975
from ablate.report.synthetic import T_SCALE, base_loss, crossings, seed_curves
from ablate.targets import Curve, target_ppl


def test_without_censoring_the_interval_is_the_pooled_two_sample_t_interval():
    cfg, base = [100.0, 120.0, 110.0], [90.0, 95.0, 105.0]
    e = relative_cost(Seeds.of(cfg), Seeds.of(base))
    lc, lb = [math.log(x) for x in cfg], [math.log(x) for x in base]
    d = statistics.fmean(lc) - statistics.fmean(lb)
    s2 = (2 * statistics.variance(lc) + 2 * statistics.variance(lb)) / 4
    half = t975(4) * math.sqrt(s2 * 2 / 3)
    assert e.kind == "observed" and e.df == 4
    assert e.value == pytest.approx(math.expm1(d), rel=1e-12)
    assert (e.lo, e.hi) == pytest.approx((math.expm1(d - half), math.expm1(d + half)), abs=1e-7)


def test_identical_token_counts_give_no_interval_rather_than_an_exact_one():
    e = relative_cost(Seeds.of([100.0, 100.0]), Seeds.of([100.0, 100.0]))
    assert e.value == 0 and math.isnan(e.lo) and math.isnan(e.hi)
    t = tokens_estimate(Seeds.of([5.0, 5.0, 5.0]))
    assert t.value == pytest.approx(5.0) and math.isnan(t.lo)


def test_a_censored_seed_raises_the_estimate_above_the_survivors():
    base = Seeds.of([100.0, 110.0, 90.0])
    survivors = relative_cost(Seeds.of([100.0, 105.0]), base)
    censored = relative_cost(Seeds.of([100.0, 105.0], [120.0]), base)
    assert censored.kind == "censored" and survivors.kind == "observed"
    assert censored.value > survivors.value
    assert censored.lo < censored.value < censored.hi


def test_no_reached_seed_gives_a_lower_bound_and_one_seed_a_plain_ratio():
    base = Seeds.of([100.0, 110.0, 90.0])
    e = relative_cost(Seeds.of([], [150.0, 160.0]), base)
    assert e.kind == "bound" and math.isnan(e.value) and e.hi == math.inf
    assert -1 < e.lo < 150 / statistics.geometric_mean([100, 110, 90]) - 1
    # the seeds' own offsets (from their curves) add what they say: a higher, still valid bound
    tighter = relative_cost(Seeds.of([], [150.0, 160.0]), base, offsets=[0.01, -0.01])
    assert e.lo < tighter.lo < 160 / statistics.geometric_mean([100, 110, 90]) - 1
    # one seed each: no noise estimate, the bound is the censored tokens over the baseline's
    one = relative_cost(Seeds.of([], [150.0]), Seeds.of([100.0]))
    assert one.kind == "bound" and one.lo == pytest.approx(0.5)
    assert relative_cost(Seeds.of([120.0]), Seeds.of([100.0])).value == pytest.approx(0.2)
    assert relative_cost(Seeds.of([120.0]), Seeds.of([], [100.0])).kind == "none"


def test_half_width_shrinks_with_seeds_as_t_times_sigma_root_two_over_n():
    assert half_width(0.1, 3) == pytest.approx(math.expm1(t975(4) * 0.1 * math.sqrt(2 / 3)))
    assert half_width(0.1, 5) < half_width(0.1, 3) and math.isnan(half_width(0.1, 1))


# --- simulated studies --------------------------------------------------------------------------
#
# ``synthetic.seed_curves``: a seed's curve is the synthetic baseline curve stretched by
# k = r * exp(sigma * z), z ~ N(0, 1) (r = 1 for the baseline), 40 evaluations up to the budget,
# evaluation noise 0.002 in loss: the true relative token cost is r - 1 at any target. Seeds that
# have not reached the target at the budget are censored there.


def _seeds(tokens_to: np.ndarray) -> Seeds:
    return Seeds.of(tokens_to[np.isfinite(tokens_to)], [T_SCALE] * int(np.isnan(tokens_to).sum()))


def _cost_studies(r, sigma, seeds, n, target, seed=20261125):
    """Per simulated study: (configuration seeds, baseline seeds, configuration curves).
    ``target``: an absolute loss, or how the target derives from each study's baseline seeds
    (``from_baseline`` of ``ablate.targets.target_ppl``)."""
    rng = np.random.default_rng(seed)
    tokens, pb = seed_curves(rng, np.exp(sigma * rng.standard_normal((n, seeds))), T_SCALE)
    _, pc = seed_curves(rng, r * np.exp(sigma * rng.standard_normal((n, seeds))), T_SCALE)
    if isinstance(target, str):
        ppl = np.array([target_ppl(from_baseline=target, baseline=[Curve(tokens, p) for p in b])
                        for b in pb])  # fmt: skip
    else:
        ppl = np.full(n, math.exp(target))
    cb, cc = crossings(tokens, pb, ppl[:, None]), crossings(tokens, pc, ppl[:, None])
    for s in range(n):
        yield _seeds(cc[s]), _seeds(cb[s]), [Curve(tokens, p) for p in pc[s]]


def _coverage_and_bias(r, sigma, seeds, n, target):
    covered, logs, cens_c, cens_b = 0, [], 0, 0
    for sc, sb, _ in _cost_studies(r, sigma, seeds, n, target):
        cens_c, cens_b = cens_c + len(sc.censored), cens_b + len(sb.censored)
        e = relative_cost(sc, sb)
        covered += e.lo <= r - 1 <= e.hi  # a lower bound covers when lo <= truth
        if math.isfinite(e.value):
            logs.append(math.log1p(e.value))
    bias = (statistics.fmean(logs) - math.log(r)) * 100
    bias_se = statistics.stdev(logs) * 100 / math.sqrt(len(logs))
    return covered / n, bias, bias_se, cens_c / (n * seeds), cens_b / (n * seeds)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("r", "sigma", "censored_share"),
    [(1.0, 0.1, (0.0, 0.01)), (1.42, 0.2, (0.15, 0.3)), (1.6, 0.2, (0.35, 0.5))],
)
def test_the_95_percent_intervals_cover_the_true_cost_in_93_to_97_percent_of_studies(
    r, sigma, censored_share
):
    # target: the loss the baseline's median seed reaches at 0.6 of the budget; 3 seeds. The
    # censored estimate is unbiased (within 1.5% in log tokens); the survivor mean is biased low
    # once seeds are censored (it keeps only the fast ones)
    n, seeds = 1000, 3
    target = float(base_loss(np.array([0.6 * T_SCALE]))[0])
    coverage, bias, _, share, _ = _coverage_and_bias(r, sigma, seeds, n, target)
    assert censored_share[0] <= share <= censored_share[1]  # the scenario censors as intended
    assert 0.93 <= coverage <= 0.97
    assert abs(bias) < 1.5
    if share > 0.1:
        survivor = []
        for sc, sb, _ in _cost_studies(r, sigma, seeds, 300, target):
            if sc.reached and sb.reached:
                survivor.append(math.log(np.mean(sc.reached) / np.mean(sb.reached)))
        assert statistics.fmean(survivor) - math.log(r) < -0.05


# Censored baseline seeds, and a target derived from the baseline's own seeds (the study's
# ``target.from_baseline``): 3 seeds, seed noise 0.1, 1000 studies each, measured:
#
#   target                                  cost   censored cfg / base   coverage   bias (se)
#   absolute: the median seed's loss at 0.9   0         15% / 15%          94.5%    +0.1 (0.3)
#   absolute: the median seed's loss at 0.9  +10%       46% / 15%          95.6%    -0.7 (0.3)
#   from_baseline: slowest (at 0.75)          0          0  /  0           94.7%    +0.0 (0.3)
#   from_baseline: slowest (at 0.75)         +20%        6% /  0           94.7%    +0.1 (0.3)
#   from_baseline: final                      0         49% / 49%          97.0%    -3.3 (0.3)
#
# A final (or best) target is placed among the baseline's own last evaluations: its censored seeds
# fall just short of it, not anywhere beyond as the model assumes, and the cost comes out ~3 points
# low (at +20% nearly every configuration seed is censored too: that target leaves no room for a
# cost). Slowest, the default, keeps every baseline seed reaching the target and is unbiased.


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "r", "base_share", "bias_stated"),
    [
        (float(base_loss(np.array([0.9 * T_SCALE]))[0]), 1.0, (0.08, 0.25), 0.1),
        (float(base_loss(np.array([0.9 * T_SCALE]))[0]), 1.1, (0.08, 0.25), -0.7),
        ("slowest", 1.0, (0.0, 0.0), 0.0),
        ("slowest", 1.2, (0.0, 0.0), 0.1),
        ("final", 1.0, (0.3, 0.7), -3.3),
    ],
    ids=["base-censored-cost-0", "base-censored-cost-10%", "slowest-cost-0",
         "slowest-cost-20%", "final-cost-0"],
)  # fmt: skip
def test_censored_baseline_seeds_and_a_target_from_the_baseline_keep_coverage_and_bias(
    target, r, base_share, bias_stated
):
    coverage, bias, bias_se, _, share_b = _coverage_and_bias(r, 0.1, 3, 1000, target)
    what = (
        f"coverage {coverage:.3f}, bias {bias:+.2f} +/- {bias_se:.2f}, base censored {share_b:.2f}"
    )
    assert base_share[0] <= share_b <= base_share[1], what
    assert coverage - 2 * math.sqrt(0.95 * 0.05 / 1000) >= 0.93 and coverage <= 0.985, what
    assert abs(bias - bias_stated) <= 3 * bias_se, what  # the figure above, within its error
    if target != "final":
        assert abs(bias) <= 1.0, what


def _bound_before(cfg: Seeds, base: Seeds) -> float:
    """The lower bound as the report printed it before the seeds' offsets counted: the profile
    deviance with the seed noise of the baseline alone (its seeds - 1 degrees of freedom), for
    the comparison below."""
    sigma, n_obs, df = censored._fit_sigma([base])
    s = sigma * math.sqrt(n_obs / df)
    gc, gb = censored._Group(cfg, s), censored._Group(base, s)
    mu_b = censored._maximize(gb.ll, gb.d1, gb.d2, gb.start())

    def dev(delta: float) -> float:
        m = censored._maximize(
            lambda u: gc.ll(u + delta) + gb.ll(u),
            lambda u: gc.d1(u + delta) + gb.d1(u),
            lambda u: gc.d2(u + delta) + gb.d2(u),
            mu_b,
        )
        return 2 * (gb.ll(mu_b) - gc.ll(m + delta) - gb.ll(m))

    far = max(math.log(c) for c in cfg.censored) - mu_b + 60 * s
    return math.expm1(censored.profile_interval(dev, far, t975(df) ** 2, s)[0])


# No seed of the configuration reached the target (the loss the baseline's median seed reaches at
# 0.75 of the budget: the budget shows costs up to +33%), 2 seeds each, 1000 studies. Exceedance:
# bounds above the true cost, as a share of all simulated studies [of the printed bounds]; distance:
# the median over printed bounds of true cost - bound, in points. Measured, now / before (the
# bound with the baseline's seed noise alone, ``_bound_before``):
#
#   cost   sigma  printed  exceedance now [printed]  before   median distance now / before
#   +35%   0.03    42%        0.5% [1.2%]             0.4%     12.5 /  33.0  (0.38)
#   +35%   0.10    30%        0.6% [2.0%]             0.2%     34.5 /  82.5  (0.42)
#   +40%   0.03    90%        0.1% [0.1%]             0        18.1 /  36.2  (0.50)
#   +40%   0.10    46%        0.7% [1.5%]             0.2%     39.1 /  84.9  (0.46)
#   +60%   0.10    93%        0                       0        60.6 / 102.9  (0.59)
#   +100%  0.10   100%        0                       0       101.8 / 142.9  (0.71)
#
# Halved where the true cost is just past what the budget shows (the quickstart's case: "not
# reached after 1.36x the baseline's tokens"); further out the distance is mostly the gap between
# the true cost and the +33% the budget can show, which no bound from unreached seeds closes.


def _bound_studies(r, sigma, n=1000, seed=20261126):
    target = float(base_loss(np.array([0.75 * T_SCALE]))[0])
    for sc, sb, curves in _cost_studies(r, sigma, 2, n, target, seed=seed):
        if not sc.reached and len(sb.reached) == 2:
            yield sc, sb, seed_offsets(curves)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("r", "sigma", "halved"), [(1.35, 0.03, True), (1.35, 0.1, True), (1.4, 0.1, True),
                               (1.6, 0.1, False)]
)  # fmt: skip
def test_the_lower_bound_without_a_reached_seed_is_valid_and_nearer_the_true_cost(r, sigma, halved):
    n = 1000
    now, before = [], []
    for sc, sb, offsets in _bound_studies(r, sigma, n):
        now.append(relative_cost(sc, sb, offsets).lo)
        before.append(_bound_before(sc, sb))
    now_a, before_a = np.array(now), np.array(before)
    exceed = float(np.sum(now_a > r - 1)) / n
    distance = float(np.median((r - 1) - now_a)) * 100
    distance_before = float(np.median((r - 1) - before_a)) * 100
    what = f"exceedance {exceed:.4f}, distance {distance:.1f} vs {distance_before:.1f} points"
    assert exceed + 2 * math.sqrt(0.025 * 0.975 / n) <= 0.025, what  # valid, beyond the sim's error
    assert distance <= (0.5 if halved else 0.75) * distance_before, what
