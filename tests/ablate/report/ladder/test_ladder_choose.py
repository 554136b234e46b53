"""The ladder's two models of a penalty and the back-test that scores them, on ladders whose truth
is known exactly (no noise): the sloped model recovers a penalty that changes with N, and the
back-test prefers it; what the law misses at a size drops out of the penalty; with too few sizes
to hold one out, nothing is scored; the trend's degrees of freedom count sizes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.report.ladder.choose import origins
from ablate.report.ladder.fit import design
from ablate.report.ladder.law import COLUMNS
from ablate.report.ladder.predict import fit_ladder, predict
from ablate.report.ladder.simulate import CHINCHILLA, quartet_truth, sloped_truth, true_ratio
from ablate.report.ladder.trend import fit_trend
from ablate.report.stats import t975

SIZES = (2e6, 4.6e6, 1e7, 2e7)
TPP = (10.0, 20.0, 40.0)
BOOT = 50


def _ladder(truth, sizes=SIZES, shift=None) -> pd.DataFrame:
    """Every (configuration, size, seed, budget) at its true loss, times ``shift(n)`` at size n
    for every configuration alike (what the law misses at that size)."""
    rows = []
    for n in sizes:
        for seed in (0, 1):
            for cfg, fn in (("baseline", truth.baseline), *truth.configs.items()):
                for m in TPP:
                    loss = float(fn(np.float64(n), np.float64(m * n)))
                    rows.append((cfg, n, m * n, seed, loss * (shift(n) if shift else 1.0)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_a_penalty_that_changes_with_n_is_recovered_and_preferred_by_the_backtest():
    truth = sloped_truth(CHINCHILLA, {"shrinking": (1.6, 1.1)}, (2e6, 2e9))
    f = _ladder(truth)
    n, d = 10 * SIZES[-1], 200 * SIZES[-1]
    (p,) = predict(f, "baseline", n, d, boot=BOOT)
    true = true_ratio(truth, "shrinking", n, d)
    assert p.prefers == "sloped" and p.scores[1] < p.scores[0]
    assert abs(p.ratio / true - 1) < 0.01
    assert abs(p.quartet[0] / true - 1) > 0.03  # a constant penalty misses it
    # the power of N itself: log(1.6 / 1.1) / log(1000)
    assert abs(p.k[0] - math.log(1.6 / 1.1) / math.log(1000)) < 0.003


def test_what_the_law_misses_at_a_size_drops_out_of_the_penalty():
    truth = quartet_truth(CHINCHILLA, {"wgrad": (1.0, 0.8)})
    # each size 1-3% off the law for the baseline and the configuration alike
    bumps = dict(zip(SIZES, (1.02, 0.99, 1.03, 0.985), strict=True))
    fit = fit_ladder(_ladder(truth, shift=bumps.__getitem__), "baseline", boot=BOOT)
    (en, ed), _ = fit.efficiency("wgrad")
    assert abs(ed - 0.8) < 0.005 and abs(en - 1.0) < 0.02


def test_with_three_sizes_nothing_is_held_out_and_the_constant_penalty_is_found():
    truth = quartet_truth(CHINCHILLA, {"wgrad": (1.0, 0.8)})
    f = _ladder(truth, sizes=SIZES[:3])
    d = design(f, "baseline")
    assert origins(d, np.ones(len(d.loss), bool)) == []
    (p,) = predict(f, "baseline", 2e8, 4e9, boot=BOOT)
    assert p.prefers == "quartet" and p.scores == (0.0, 0.0)
    assert abs(p.ratio - 1.25) < 0.01 and abs(p.quartet[0] - 1.25) < 0.01 and abs(p.k[0]) < 0.003


def test_rolling_origins_hold_out_each_size_from_the_fourth_with_five_or_more():
    truth = quartet_truth(CHINCHILLA, {"wgrad": (1.0, 0.8)})
    sizes = (*SIZES, 4e7, 8e7)
    d = design(_ladder(truth, sizes=sizes), "baseline")
    assert origins(d, np.ones(len(d.loss), bool)) == [2e7, 4e7, 8e7]
    d4 = design(_ladder(truth), "baseline")
    assert origins(d4, np.ones(len(d4.loss), bool)) == [2e7]


def test_the_trends_degrees_of_freedom_count_sizes_not_seeds():
    rng = np.random.default_rng(0)
    rows = [
        ("c", n, s, 1.0, math.exp(0.1 + 0.02 * math.log(n) + rng.normal(0, 0.05)), "")
        for n in SIZES
        for s in range(3)
    ]
    pairs = pd.DataFrame(rows, columns=["config", "params", "seed", "ref_tokens", "ratio", "side"])
    tr = fit_trend(pairs, "c")
    assert tr is not None and tr.n == 12 and tr.sizes == 4
    ratio, lo, hi = tr.predict(2e8)
    x = np.array([1.0, math.log(2e8)])
    se = math.sqrt(float(x @ tr.cov @ x))
    assert math.isclose(math.log(hi / ratio), t975(2) * se, rel_tol=1e-9)
