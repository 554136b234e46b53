"""The ladder's prediction, proven by simulation: synthetic ladders drawn from a known law with
seed noise like a CPU ladder's, from a penalty that changes with size, and from laws that are not
Quartet's form. The prediction's 95% interval covers the true token ratio at 10x and 30x the
largest rung in at least 90% of the ladders, and under a penalty that changes with size its point
lands within 0.05 of the truth on average; the back-test says "covered" about as often as
a 95% interval should; censored rungs are kept; a configuration that cannot reach the baseline's
loss is said to be so, never given a finite ratio.

The coverage table in docs/ladders.md comes from the same simulation at more ladders:
``python -m ablate.bench.ladder``."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ablate.bench import ladder as ladder_bench
from ablate.report.ladder.predict import backtest, fit_ladder, predict, predictions
from ablate.report.ladder.simulate import (
    CHINCHILLA,
    additive_truth,
    draw_ladder,
    quartet_truth,
    sloped_truth,
    true_ratio,
)
from ablate.report.ladder.trend import fit_trend, pair_ratios, tokens_to_loss

# the ladders of the benchmark whose table docs/ladders.md shows: 4 sizes over 10x, 3 budgets
SIZES, TPP, _ = ladder_bench.DESIGNS["10x"]
NOISE = {"sigma_run": 0.01, "sigma_eval": 0.003}
"""Seed noise of the order a CPU ladder measures (docs/ladders.md)."""
LADDERS = 24
BOOT = 100


def _coverage(
    truth, seeds: int = 2, ladders: int = LADDERS, errors: dict | None = None
) -> dict[tuple[str, int], float]:
    """The share of ``ladders`` whose interval holds the truth, per (configuration, scale);
    ``errors`` gathers the points' errors (ratio - truth) per the same key."""
    hits: dict[tuple[str, int], int] = {}
    for i in range(ladders):
        f = draw_ladder(truth, SIZES, TPP, seeds, **NOISE, rng=np.random.default_rng(100 + i))
        targets = [(k * SIZES[-1], 20 * k * SIZES[-1]) for k in (10, 30)]
        # predict_many's fit without the models' back-test: the intervals do not read it
        fit = fit_ladder(f, "baseline", boot=BOOT, seed=i, scored=False)
        for k, preds in zip((10, 30), predictions(fit, f, targets), strict=True):
            n, d = k * SIZES[-1], 20 * k * SIZES[-1]
            for p in preds:
                true = true_ratio(truth, p.config, n, d)
                hits[(p.config, k)] = hits.get((p.config, k), 0) + (p.lo <= true <= p.hi)
                if errors is not None:
                    errors.setdefault((p.config, k), []).append(p.ratio - true)
    return {k: v / ladders for k, v in hits.items()}


@pytest.mark.slow
def test_the_interval_covers_the_true_ratio_at_10x_and_30x_under_quartets_law():
    truth = quartet_truth(CHINCHILLA, {"wgrad": (1.0, 0.8), "fprop": (0.85, 1.0)})
    cov = _coverage(truth)
    assert len(cov) == 4
    assert min(cov.values()) >= 0.9, cov


@pytest.mark.slow
def test_the_interval_covers_the_true_ratio_under_a_law_of_another_form():
    # no model fitted here is the truth's form: at 10x the interval holds as under Quartet's law;
    # carried to 30x the approximation's error shows (21 of these 24 ladders; 0.95-1.00 over the
    # 40 of docs/ladders.md's table)
    cov = _coverage(additive_truth())
    assert len(cov) == 4
    assert min(v for (_, k), v in cov.items() if k == 10) >= 0.9, cov
    assert min(cov.values()) >= 0.85, cov


@pytest.mark.slow
def test_a_penalty_that_changes_with_size_is_covered_and_its_point_is_not_biased():
    # the token ratio 1.39 at 30M falling to 1.19 at 8B, and the same rising: Quartet's constant
    # penalty alone is biased here; the prediction (a penalty that may change with N) is not
    truth = sloped_truth(
        CHINCHILLA, {"shrinking": (1.39, 1.19), "growing": (1.19, 1.39)}, (3e7, 8e9)
    )
    errors: dict = {}
    cov = _coverage(truth, errors=errors)
    assert len(cov) == 4
    assert min(cov.values()) >= 0.9, cov
    bias = {k: float(np.mean(v)) for k, v in errors.items()}
    assert max(abs(b) for b in bias.values()) < 0.05, bias


@pytest.mark.slow
def test_the_backtest_covers_as_often_as_a_95_percent_interval_should():
    truth = quartet_truth(CHINCHILLA, {"wgrad": (1.0, 0.8), "fprop": (0.85, 1.0)})
    said = []
    for i in range(LADDERS):
        f = draw_ladder(truth, SIZES, TPP, 2, **NOISE, rng=np.random.default_rng(300 + i))
        said += [b.covered for b in backtest(f, "baseline", tokens_per_param=20, boot=BOOT, seed=i)]
    assert len(said) == 2 * LADDERS
    assert np.mean(said) >= 0.85


def test_censored_rungs_are_kept_and_the_interval_still_covers():
    # effD 0.35: 2.9x the tokens, beyond the largest budget (4x the reference's 10 tokens per
    # parameter is 40, the configuration needs 29 at the reference of 10... and 57 at 20)
    truth = quartet_truth(CHINCHILLA, {"costly": (1.0, 0.35)})
    f = draw_ladder(truth, SIZES, TPP, 2, **NOISE, rng=np.random.default_rng(7))
    pairs = pair_ratios(f, "baseline", tokens_per_param=20)
    assert (pairs["side"] == "at least").all() and len(pairs) == 2 * len(SIZES)
    assert fit_trend(pairs, "costly") is None  # nothing measured: no line, but nothing dropped
    (p,) = predict(f, "baseline", 10 * SIZES[-1], 200 * SIZES[-1], boot=BOOT)
    assert p.lo <= 1 / 0.35 <= p.hi
    # at a reference of 10 tokens per parameter the same runs are measured, not censored
    pairs = pair_ratios(f, "baseline", tokens_per_param=10)
    assert (pairs["side"] == "").all()


def test_a_configuration_that_cannot_reach_the_baselines_loss_is_never_given_a_finite_ratio():
    truth = quartet_truth(CHINCHILLA, {"floor": (0.3, 1.0)})
    f = draw_ladder(truth, SIZES, TPP, 2, **NOISE, rng=np.random.default_rng(8))
    n = 8e9
    assert true_ratio(truth, "floor", n, 1e14) == math.inf
    (p,) = predict(f, "baseline", n, 1e14, boot=BOOT)
    # the point fit cannot reach it, nor can most refits: the interval is open above, never finite
    assert p.ratio == math.inf and p.hi == math.inf and p.p_unreachable > 0.5
    assert p.reachable in ("no", "uncertain")
    assert p.eff_n[2] < 1  # the evidence: effN's interval lies below 1


def test_tokens_to_loss_interpolates_and_bounds():
    tokens, losses = np.array([1e6, 2e6, 4e6]), np.array([4.0, 3.5, 3.0])
    need, side = tokens_to_loss(tokens, losses, 3.25)
    assert side == "" and 2e6 < need < 4e6
    assert tokens_to_loss(tokens, losses, 2.0) == (4e6, "at least")
    assert tokens_to_loss(tokens, losses, 5.0) == (1e6, "at most")


def test_the_pure_prediction_runs_on_a_frame_built_by_hand():
    rows = []
    for n in (1e6, 3e6, 1e7):
        for d_per in (10, 20, 40):
            for seed in (0, 1):
                d = d_per * n
                shift = 1 + 0.004 * seed  # a seed's run, the same data order for both
                rows.append(("fp8", n, d, seed, float(CHINCHILLA.loss(n, d)) * shift))
                cost = float(CHINCHILLA.loss(n, d, 1, 0.8)) * shift
                rows.append(("mxfp4_wgrad", n, d, seed, cost))
    frame = pd.DataFrame(rows, columns=["config", "params", "tokens", "seed", "val_loss"])
    (p,) = predict(frame, "fp8", 8e9, 1e12, boot=BOOT)
    assert p.config == "mxfp4_wgrad" and p.lo <= 1.25 <= p.hi and p.reachable == "yes"
    (bt,) = backtest(frame, "fp8", tokens_per_param=20, boot=BOOT)
    assert bt.lo <= bt.predicted <= bt.hi and bt.covered


def test_the_docs_python_example_runs_and_says_what_it_claims(capsys):
    # docs/ladders.md "From Python": the fits called on a frame built by hand, as documented
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[4] / "docs" / "ladders.md"
    (block,) = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    exec(compile(block, str(page), "exec"), {"__name__": "ladders_example"})
    first, second, *_ = capsys.readouterr().out.splitlines()
    assert abs(float(first) - 1.25) < 0.01  # the token ratio of effD 0.8 is 1 / 0.8
    ratio, lo, hi, reachable = re.findall(r"[\d.]+|yes|no|uncertain", second)
    assert float(lo) <= 1.25 <= float(hi) and reachable == "yes"
