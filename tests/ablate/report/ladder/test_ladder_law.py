"""The ladder fits (``ablate.report.ladder.law``) on a ladder drawn from a known law: the law fitted
on the baseline predicts its loss at 10x the largest rung; a configuration's effD and effN are
recovered with the law held fixed; the token ratio follows Quartet's algebra (1/effD at every scale
for a data-efficiency loss, ``inf`` where a parameter-efficiency loss leaves a floor above the
baseline's loss); the model-free ratios per rung and their trend (``ablate.report.ladder.trend``)
say the same without the law."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ablate.report.ladder.law import (
    COLUMNS,
    Efficiency,
    Law,
    check_frame,
    fit_efficiency,
    fit_law,
    token_ratio,
)
from ablate.report.ladder.trend import fit_trend, pair_ratios

TRUE = Law(a=400.0, alpha=0.34, b=410.0, beta=0.28, gamma=1.0, e=1.7)
"""Chinchilla's published fit (Hoffmann et al. 2022, approach 3), gamma = 1."""
SIZES = (1e6, 3e6, 1e7, 3e7)
BUDGETS = (10.0, 20.0, 40.0)  # tokens per parameter
EFFS = {"fp8": (1.0, 1.0), "wgrad": (1.0, 0.8), "fprop": (0.3, 1.0)}


def ladder(noise: float = 0.003, seeds: int = 3, rng: int = 0) -> pd.DataFrame:
    """Every (config, size, seed) run evaluated at each budget: a seed shifts its whole run's log
    loss (``noise``), each evaluation adds a third of that."""
    g = np.random.default_rng(rng)
    rows = []
    for cfg, (en, ed) in EFFS.items():
        for n in SIZES:
            for s in range(seeds):
                z = g.normal(0, noise)
                for m in BUDGETS:
                    d = m * n
                    loss = float(TRUE.loss(n, d, en, ed)) * math.exp(z + g.normal(0, noise / 3))
                    rows.append(
                        {"config": cfg, "params": n, "tokens": d, "seed": s, "val_loss": loss}
                    )
    return pd.DataFrame(rows, columns=list(COLUMNS))


@pytest.fixture(scope="module")
def fitted():
    f = ladder()
    return f, fit_law(f, "fp8")


def test_the_law_fitted_on_the_baseline_predicts_it_at_10x_the_largest_rung(fitted):
    _, law = fitted
    n, d = 10 * SIZES[-1], 20 * 10 * SIZES[-1]
    assert abs(float(law.loss(n, d)) / float(TRUE.loss(n, d)) - 1) < 0.01


def test_efficiencies_are_recovered_with_the_law_held_fixed(fitted):
    f, law = fitted
    w = fit_efficiency(f, law, "wgrad")
    assert abs(w.eff_d - 0.8) < 0.04 and abs(w.eff_n - 1.0) < 0.06
    p = fit_efficiency(f, law, "fprop")
    assert abs(p.eff_n - 0.3) < 0.03


def test_the_token_ratio_follows_quartets_algebra():
    data_only = Efficiency("wgrad", 1.0, 0.8)
    for n, d in ((1e8, 2e9), (8e9, 1e12), (7e10, 2e13)):
        assert token_ratio(TRUE, data_only, n, d) == pytest.approx(1 / 0.8, rel=1e-12)
    params_only = Efficiency("fprop", 0.3, 1.0)
    assert 1 < token_ratio(TRUE, params_only, 8e9, 1e12) < math.inf
    # B / D^beta below the floor A / N^alpha (0.3^-alpha - 1): no budget reaches the baseline
    assert token_ratio(TRUE, params_only, 8e9, 1e14) == math.inf
    assert token_ratio(TRUE, Efficiency("same", 1.0, 1.0), 8e9, 1e12) == pytest.approx(1.0)


def test_the_fitted_ratio_at_8b_is_near_the_true_one(fitted):
    f, law = fitted
    w = fit_efficiency(f, law, "wgrad")
    assert token_ratio(law, w, 8e9, 1e12) == pytest.approx(1.25, rel=0.05)
    p = fit_efficiency(f, law, "fprop")
    assert token_ratio(law, p, 8e9, 1e14) == math.inf


def test_model_free_ratios_per_rung_and_their_trend():
    f = ladder()
    r = pair_ratios(f, "fp8", tokens_per_param=20)
    w = r[r["config"] == "wgrad"]
    assert (w["side"] == "").all() and len(w) == len(SIZES) * 3  # every size and seed
    assert w["ratio"].median() == pytest.approx(1.25, rel=0.05)
    t = fit_trend(r, "wgrad")
    assert t is not None and not t.changes  # a constant cost: no trend with N
    assert abs(t.slope) < 3 * t.slope_se + 0.02
    # fprop never gets down to the baseline's loss at 20 tokens per parameter within its own
    # budgets (up to 40): every pair is a bound, kept, and no line is drawn through bounds alone
    p = r[r["config"] == "fprop"]
    assert len(p) == len(SIZES) * 3 and (p["side"] == "at least").all()
    assert fit_trend(r, "fprop") is None


def test_a_frame_without_the_columns_or_with_bad_values_is_refused():
    f = ladder(seeds=1)
    with pytest.raises(ValueError, match=r"missing columns \['seed'\]"):
        check_frame(f.drop(columns="seed"))
    bad = f.copy()
    bad.loc[0, "val_loss"] = math.inf
    with pytest.raises(ValueError, match="val_loss must be finite"):
        check_frame(bad)
    with pytest.raises(ValueError, match="two sizes and two budgets"):
        fit_law(f[f["params"] == SIZES[0]], "fp8")
