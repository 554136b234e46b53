"""The paired token cost (``ablate.report.paired``): exact against closed forms where they exist,
its fallbacks, and its coverage on simulated studies with shared seed effects, censoring and
stalls (``ablate.bench.seeds``, the harness behind docs/report.md's table)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ablate.bench.seeds import SETTINGS, coverage
from ablate.report.censored import Seeds, relative_cost
from ablate.report.paired import Design, heterogeneity_p, paired_costs
from ablate.report.stats import t975


def _groups(logs: np.ndarray, seeds=None) -> dict[str, Seeds]:
    seeds = list(range(logs.shape[1])) if seeds is None else seeds
    return {f"c{j}": Seeds.of(np.exp(row).tolist(), ids=seeds) for j, row in enumerate(logs)}


def _two_way(n_configs=4, n_seeds=3, noise=0.05, seed=1):
    rng = np.random.default_rng(seed)
    mu = np.linspace(0, 0.3, n_configs)[:, None]
    a = rng.normal(0, 0.3, (1, n_seeds))
    return 11 + mu + a + rng.normal(0, noise, (n_configs, n_seeds))


def test_a_complete_design_gives_the_two_way_anova_interval():
    y = _two_way()
    j, n = y.shape
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    s = math.sqrt(float((resid**2).sum()) / ((j - 1) * (n - 1)))
    for c, est in paired_costs(_groups(y), "c0").items():
        d = y[int(c[1:])].mean() - y[0].mean()
        half = t975((j - 1) * (n - 1)) * s * math.sqrt(2 / n)
        assert est.method == "paired" and est.df == (j - 1) * (n - 1)
        assert est.value == pytest.approx(math.expm1(d), rel=1e-9)
        assert (est.lo, est.hi) == pytest.approx((math.expm1(d - half), math.expm1(d + half)))


def test_two_configurations_give_the_paired_t_interval_on_seed_differences():
    y = _two_way(n_configs=2, n_seeds=4)
    (est,) = paired_costs(_groups(y), "c0").values()
    diff = y[1] - y[0]
    half = t975(3) * diff.std(ddof=1) / 2
    assert est.df == 3
    assert (est.lo, est.hi) == pytest.approx(
        (math.expm1(diff.mean() - half), math.expm1(diff.mean() + half))
    )


def test_a_shared_seed_effect_narrows_the_interval_against_the_unpaired_one():
    y = _two_way(n_seeds=3, noise=0.03)
    g = _groups(y)
    paired = paired_costs(g, "c0")["c2"]
    unpaired = relative_cost(g["c2"], g["c0"])
    assert paired.hi - paired.lo < (unpaired.hi - unpaired.lo) / 3


def test_unmatched_seeds_fall_back_to_the_unpaired_interval():
    y = _two_way(n_configs=2, n_seeds=4)
    g = {"c0": Seeds.of(np.exp(y[0, :2]).tolist(), ids=[0, 1]),
         "c1": Seeds.of(np.exp(y[1, 2:]).tolist(), ids=[2, 3])}  # fmt: skip
    est = paired_costs(g, "c0")["c1"]
    ref = relative_cost(g["c1"], g["c0"])
    assert est.method == "unpaired" and (est.value, est.lo, est.hi) == (ref.value, ref.lo, ref.hi)
    # seeds without numbers cannot be paired either
    bare = {c: Seeds.of(s.reached) for c, s in _groups(y).items()}
    assert paired_costs(bare, "c0")["c1"].method == "unpaired"


def test_unequal_noise_uses_the_comparisons_own_variance():
    rng = np.random.default_rng(3)
    y = _two_way(n_configs=5, n_seeds=6, noise=0.02)
    y[4] += rng.normal(0, 0.4, 6)  # one configuration 20x noisier
    g = _groups(y)
    assert heterogeneity_p(Design.of(g)) < 0.01
    out = paired_costs(g, "c0")
    assert {e.method for e in out.values()} == {"paired-own"}
    own = paired_costs({"c0": g["c0"], "c4": g["c4"]}, "c0")["c4"]
    assert (out["c4"].lo, out["c4"].hi) == pytest.approx((own.lo, own.hi))


def test_a_censored_seed_raises_the_paired_estimate_and_keeps_it_paired():
    y = _two_way(n_configs=3, n_seeds=4, noise=0.02)
    g = _groups(y)
    reached = paired_costs(g, "c0")["c2"]
    # seed 3 of c2 stops short of the target, at tokens just below where it would have reached
    t = np.exp(y[2])
    g["c2"] = Seeds.of(t[:3].tolist(), [float(t[3]) * 0.8], ids=[0, 1, 2, 3])
    censored = paired_costs(g, "c0")["c2"]
    assert censored.kind == "censored" and censored.method == "paired"
    assert censored.value > paired_costs({**g, "c2": Seeds.of(t[:3].tolist(), ids=[0, 1, 2])},
                                         "c0")["c2"].value - 1e-9  # fmt: skip
    assert math.isfinite(censored.lo) and math.isfinite(censored.hi)
    assert censored.lo < reached.value * 1.5


def test_a_configuration_that_never_reached_keeps_its_lower_bound():
    y = _two_way(n_configs=2, n_seeds=3)
    g = _groups(y)
    g["c1"] = Seeds.of([], np.exp(y[1]).tolist(), ids=[0, 1, 2])
    est = paired_costs(g, "c0")["c1"]
    assert est.kind == "bound" and est.method == "unpaired" and math.isinf(est.hi)


# Coverage over simulated studies (``ablate.bench.seeds``: a baseline and configurations of true
# cost 0, +5%, +15%, +30%, seed effect sd 0.2 shared by every configuration, residual sd 0.06 in
# log tokens, stalls on the early plateau for 25-75% of the budget). docs/report.md tables the
# same at 2,000 studies a setting; here 300 studies (900 comparisons), so a method whose
# coverage were 93% would pass with probability about 0.5, one at 91% almost never.


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "shared seed effect",
        "shared seed effect, 2 seeds",
        "stall-prone baseline (0.3 vs 0.05)",
        "stall-prone configuration (0.05 vs 0.3)",
    ],
)
def test_the_paired_intervals_cover_93_to_97_percent_where_the_unpaired_waste_or_break(name):
    found = coverage(SETTINGS[name], 300)
    paired, unpaired, pooled = found["paired"], found["unpaired"], found["pooled"]
    what = {m: (round(r.coverage, 3), round(r.width, 2)) for m, r in found.items()}
    assert 0.93 <= paired.coverage <= 0.975, what
    assert paired.comparisons >= 0.9 * 900, what  # nearly every comparison has an interval
    assert paired.width < unpaired.width / 1.5, what  # the shared seed effect is paired away
    if "stall-prone" in name:  # stalls left in the noise cost width (Bartlett's test then
        assert paired.width < pooled.width / 1.2, what  # takes the comparison's own variance)


@pytest.mark.slow
def test_the_paired_intervals_keep_their_coverage_with_censored_seeds():
    found = coverage(SETTINGS["censored (target at 0.8)"], 150, methods=("paired",))
    assert 0.92 <= found["paired"].coverage <= 0.98, found
