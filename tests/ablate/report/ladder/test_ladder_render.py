"""A ladder study's report from hand-built runs: every rung gets its own report against its own
baseline and target; the ladder's prediction, back-test and figure are written, ``ladder.csv`` has
its columns; an unfinished or diverged run is named and left out of the fits, never dropped
silently; the MLflow metrics of the prediction are finite numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.report.ladder.predict import LADDER_COLUMNS
from ablate.report.ladder.render import build_ladder_report, ladder_frame, ladder_metrics, slug
from ablate.report.ladder.simulate import CHINCHILLA

SIZES = (2e6, 6e6, 2e7)
BUDGETS = (10.0, 40.0)
EFFS = {"fp8": (1.0, 1.0), "mxfp4[wgrad]/fp8": (1.0, 0.8)}
TARGET = {"from_baseline": "slowest", "at": 0.75, "val_ppl": None, "val_loss": None, "tolerance": 0}


def ladder_study(noise: float = 0.01, drop: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, evals): every (config, size, budget, seed) run, its curve the law's loss over its
    tokens, shifted per (size, seed) run."""
    g = np.random.default_rng(0)
    cells, evals = [], []
    for n in SIZES:
        shift = {s: g.normal(0, noise) for s in (0, 1)}
        for m in BUDGETS:
            d = m * n
            rung = f"n={n:g}/budget={m:g}"
            for cfg, (en, ed) in EFFS.items():
                for s in (0, 1):
                    key = f"{cfg}|{rung}|{s}"
                    status = "running" if key == drop else "finished"
                    cells.append({
                        "key": key, "label": f"{cfg}/{rung}/seed{s}", "config": f"{cfg}/{rung}",
                        "seed": s, "status": status, "diverged_at": math.nan,
                        "baseline": cfg == "fp8", "fp4_gemms": "" if cfg == "fp8" else "wgrad",
                        "intervention": "none", "fp4_format": "mxfp4", "base_format": "fp8",
                        "backend": "emulated", "tokens_per_step": d / 100, "tokens_per_s": math.nan,
                        "schedule_steps": math.nan, "rung": rung, "ladder_config": cfg,
                        "params": n, "budget_tokens": d, "numerics": "2",
                    })  # fmt: skip
                    for step in range(10, 101, 10):
                        t = d * step / 100
                        loss = float(CHINCHILLA.loss(n, t, en, ed)) * math.exp(shift[s])
                        evals.append((key, step, t, loss))
    return pd.DataFrame(cells), pd.DataFrame(evals, columns=["key", "step", "tokens", "val_loss"])


def test_the_frame_holds_each_finished_runs_last_loss_and_names_the_rest():
    cells, evals = ladder_study(drop="fp8|n=2e+06/budget=10|0")
    frame, notes = ladder_frame(cells, evals)
    assert len(frame) == len(cells) - 1
    assert notes == ["fp8/n=2e+06/budget=10/seed0: running, left out of the fits"]
    row = frame[(frame["config"] == "fp8") & (frame["params"] == 2e7) & (frame["tokens"] == 8e8)]
    assert len(row) == 2 and set(row["seed"]) == {0, 1}


def test_a_ladder_report_has_rungs_a_prediction_a_backtest_and_a_figure(tmp_path):
    cells, evals = ladder_study()
    res = build_ladder_report(
        cells, evals, TARGET, None, tmp_path, study="ladder", predict=(8e9, 1.6e11), boot=200
    )
    assert len(res.rungs) == len(SIZES) * len(BUDGETS)
    for rung in res.rungs:
        assert (tmp_path / "rungs" / slug(rung) / "report.md").is_file()
    table = pd.read_csv(res.ladder_csv)
    assert list(table.columns) == list(LADDER_COLUMNS)
    pred = table[table["method"] == "sloped"].iloc[0]
    assert pred["config"] == "mxfp4[wgrad]/fp8" and pred["reachable"] == "yes"
    assert pred["ratio_lo"] <= 1.25 <= pred["ratio_hi"]
    assert len(res.backtests) == 1 and res.backtests[0].covered
    md = res.report_md.read_text()
    for heading in ("## Prediction at N* = 8.00B", "## Back-test", "## Rungs", "## Figure"):
        assert heading in md
    assert (tmp_path / "token_ratio.png").is_file() and (tmp_path / "token_ratio.svg").is_file()
    metrics = ladder_metrics(res)
    assert metrics and all(math.isfinite(v) for v in metrics.values())
    assert metrics["ladder.mxfp4_wgrad__fp8.backtest_covered"] == 1.0


def test_an_unbounded_prediction_leaves_the_figures_axis_at_what_was_measured():
    # the kept CPU ladder, whose DHT16 interval has no upper end: its band runs off the top of the
    # plot instead of stretching the axis to 1e6 and squashing the measured rungs into a sliver
    from pathlib import Path

    from ablate.report.ladder.predict import fit_ladder, predictions
    from ablate.report.ladder.render import _figure

    kept = Path(__file__).resolve().parents[4] / "reports" / "ladder" / "ladder_points.csv"
    frame = pd.read_csv(kept)
    at = (7.9e6, 7.9e6)
    fit = fit_ladder(frame, "fp8", boot=200, seed=0, scored=False)
    preds = predictions(fit, frame, [at])[0]
    fig = _figure(fit, frame, "fp8", at, preds, study="ladder", titles=False)
    lo, hi = fig.axes[0].get_ylim()
    assert 1e-3 <= lo < 1 and 2 < hi < 1e3, (lo, hi)
    assert any(not math.isfinite(fit.interval(c, *at)[2]) for c in fit.configs)  # one unbounded
