"""A ladder study's report: each rung's own report, then the ladder's prediction at the target
scale, its back-test, the trend and the figure of token ratio against N.

    report.md / .html     the prediction table (method, 95% interval, back-test, reachable), the
                          efficiencies and trends, every rung's verdicts, the figure, provenance
    ladder.csv            ``ablate.report.ladder.predict.LADDER_COLUMNS``
    ladder_points.csv     the tidy frame the fits read (config, params, tokens, seed, val_loss)
    token_ratio.png/.svg  each configuration's measured ratio per rung (95% interval over seed
                          pairs) and Quartet's fit with its band, carried to the target N
    rungs/<rung>/         each rung's report (``build_report``: its baseline, its target)

The cells frame carries, beyond the report's contract, ``rung``, ``ladder_config``, ``params``
(N, non-embedding) and ``budget_tokens`` (D); a cell's point is its validation loss at its last
evaluation (the end of its budget). Unfinished cells are left out of the fits and listed; a
diverged cell is a failure the report names, never a point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ablate.errors import ReportError
from ablate.report import markup, plots, provenance
from ablate.report.ladder.fit import MODELS
from ablate.report.ladder.predict import (
    LADDER_COLUMNS,
    Backtest,
    ConfigPrediction,
    LadderFit,
    backtest,
    fit_ladder,
    predictions,
    table_rows,
)
from ablate.report.ladder.trend import fit_trend, pair_ratios
from ablate.report.markup import Block
from ablate.report.render import ReportResult, build_report
from ablate.report.verdict import cost_and_speedup, verdict
from ablate.study.speedup import SpeedupSection

LADDER_CELL_COLUMNS = ("rung", "ladder_config", "params", "budget_tokens")
POINTS_CSV = "ladder_points.csv"
RUNG_FIGURES = ("convergence", "token_cost")
"""The figures of each rung's report (a ladder has many rungs; the rest are in the tables)."""


@dataclass
class LadderResult:
    """What ``build_ladder_report`` wrote."""

    out_dir: Path
    report_md: Path
    report_html: Path
    ladder_csv: Path
    rungs: dict[str, ReportResult]
    table: pd.DataFrame
    predictions: list[ConfigPrediction]
    backtests: list[Backtest]
    frame: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    """The prediction's figure: {"png": path, "svg": path}."""

    @property
    def files(self) -> list[Path]:
        """Every file this report wrote, its rungs' reports included."""
        own = [self.report_md, self.report_html, self.ladder_csv, self.out_dir / POINTS_CSV]
        return [*own, *self.figures.values(), *(f for r in self.rungs.values() for f in r.files)]


def slug(rung: str) -> str:
    """A rung's folder name: ``preset=tiny/steps=120`` -> ``preset-tiny_steps-120``."""
    return "".join(c if c.isalnum() or c in "._-" else "-" if c == "=" else "_" for c in rung)


def ladder_frame(cells: pd.DataFrame, evals: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The tidy frame of every finished cell's last validation loss, and a note per cell left
    out (unfinished, diverged, failed: named, never dropped silently)."""
    missing = [c for c in LADDER_CELL_COLUMNS if c not in cells.columns]
    if missing:
        raise ReportError(f"a ladder's cells need the columns {', '.join(missing)}")
    last = evals.sort_values("step").groupby("key").tail(1).set_index("key")["val_loss"]
    rows, notes = [], []
    for c in cells.to_dict("records"):
        loss = float(last.get(c["key"], math.nan))
        if c["status"] != "finished" or not math.isfinite(loss) or loss <= 0:
            notes.append(f"{c['label']}: {c['status']}, left out of the fits")
            continue
        rows.append(
            (c["ladder_config"], float(c["params"]), float(c["budget_tokens"]), c["seed"], loss)
        )
    frame = pd.DataFrame(rows, columns=["config", "params", "tokens", "seed", "val_loss"])
    return frame, notes


def build_ladder_report(
    cells: pd.DataFrame,
    evals: pd.DataFrame,
    target: Any,
    speedup: SpeedupSection | None,
    out_dir: str | Path,
    *,
    study: str,
    predict: tuple[float, float] | None,
    boot: int,
    seed: int = 0,
    notes: Sequence[str] = (),
    titles: bool = True,
    mix_numerics: bool = False,
    mix_data: bool = False,
) -> LadderResult:
    """Every rung's report under ``rungs/``, then the ladder's fits, prediction at ``predict``
    (N*, D*), back-test and figure (see the module docstring)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mixed = provenance.check_numerics(cells, mixed=mix_numerics)
    mixed_data = provenance.check_data(cells, mixed=mix_data)
    rung_results: dict[str, ReportResult] = {}
    rung_order = (
        cells.assign(_n=cells["params"], _d=cells["budget_tokens"])
        .sort_values(["_n", "_d"])["rung"]
        .drop_duplicates()
        .tolist()
    )
    for rung in rung_order:
        rc = cells[cells["rung"] == rung].assign(config=lambda f: f["ladder_config"])
        if not (rc["status"].isin(["finished", "diverged"])).any():
            continue
        rung_results[rung] = build_report(
            rc,
            evals[evals["key"].isin(rc["key"])],
            target,
            speedup,
            out / "rungs" / slug(rung),
            study=f"{study} {rung}",
            titles=titles,
            mix_numerics=mix_numerics,
            mix_data=mix_data,
            figures=RUNG_FIGURES,
        )
    frame, left_out = ladder_frame(cells, evals)
    baseline = str(cells.loc[cells["baseline"], "ladder_config"].iloc[0])
    all_notes = [*notes, *(n for n in (mixed, mixed_data) if n), *left_out]
    frame.to_csv(out / POINTS_CSV, index=False)
    fit: LadderFit | None = None
    preds: list[ConfigPrediction] = []
    try:
        fit = fit_ladder(frame, baseline, boot=boot, seed=seed)
    except ValueError as e:
        all_notes.append(f"No fit: {e}")
    tpp = predict[1] / predict[0] if predict else None
    if fit is not None and predict is not None:
        preds = predictions(fit, frame, [predict])[0]
    tests = backtest(frame, baseline, tokens_per_param=tpp, boot=boot, seed=seed) if fit else []
    table = (
        table_rows(preds, tests, *predict)
        if predict is not None
        else pd.DataFrame(columns=list(LADDER_COLUMNS))
    )
    ladder_csv = out / "ladder.csv"
    table.to_csv(ladder_csv, index=False)
    figure = _figure(fit, frame, baseline, predict, preds, study=study, titles=titles)
    paths = plots.save(figure, out, "token_ratio")
    blocks = _blocks(
        study,
        cells,
        frame,
        baseline,
        predict,
        boot,
        preds,
        tests,
        fit,
        rung_results,
        all_notes,
        paths,
    )
    report_md = out / "report.md"
    report_md.write_text(markup.to_markdown(blocks), encoding="utf-8")
    report_html = out / "report.html"
    report_html.write_text(markup.to_html(blocks, f"{study}: ladder"), encoding="utf-8")
    return LadderResult(
        out,
        report_md,
        report_html,
        ladder_csv,
        rung_results,
        table,
        preds,
        tests,
        frame,
        all_notes,
        figures=paths,
    )


def _rung_means(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and size: the geometric mean of the measured pair ratios, its 95%
    interval over pairs (t), and how many pairs were bounds."""
    from ablate.report.stats import t975

    rows = []
    for (cfg, n), g in pairs.groupby(["config", "params"]):
        logs = np.log(g["ratio"].to_numpy(float))
        m = float(logs.mean())
        h = (
            t975(len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
            if len(logs) > 1
            else math.inf
        )
        rows.append(
            (cfg, n, math.exp(m), math.exp(m - h), math.exp(m + h), int((g["side"] != "").sum()))
        )
    return pd.DataFrame(rows, columns=["config", "params", "ratio", "lo", "hi", "bounds"])


def _figure(
    fit: LadderFit | None,
    frame: pd.DataFrame,
    baseline: str,
    predict: tuple[float, float] | None,
    preds: Sequence[ConfigPrediction],
    *,
    study: str,
    titles: bool,
) -> Any:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    tpp = predict[1] / predict[0] if predict else None
    pairs = pair_ratios(frame, baseline, tokens_per_param=tpp) if len(frame) else frame
    means = _rung_means(pairs) if len(pairs) else pd.DataFrame()
    configs = sorted(set(frame["config"]) - {baseline})
    palette = [f"C{i % 10}" for i in range(len(configs))]
    n_max = float(frame["params"].max()) if len(frame) else 1.0
    n_to = max(predict[0], n_max) if predict else n_max * 10
    grid = np.geomspace(float(frame["params"].min()) if len(frame) else 1.0, n_to, 40)
    ref_tpp = tpp if tpp is not None else _top_tpp(frame, baseline)
    seen = [1.0]  # what the y-axis must show: the measured rungs and the predictions
    for cfg, colour in zip(configs, palette, strict=True):
        m = means[means["config"] == cfg] if len(means) else means
        if len(m):
            bottom = m["lo"].clip(lower=1e-3)  # the bar's end and the axis' reach alike
            yerr = [m["ratio"] - bottom, (m["hi"] - m["ratio"]).clip(upper=1e3)]
            ax.errorbar(m["params"], m["ratio"], yerr=yerr, fmt="o", color=colour, capsize=3,
                        label=f"{cfg} (measured)")  # fmt: skip
            seen += [*bottom, *m["hi"].clip(upper=1e3)]
        if fit is not None and cfg in fit.configs:
            pt, lo, hi = [], [], []
            for n in grid:
                r0, q_lo, q_hi = fit.interval(cfg, float(n), float(n) * ref_tpp)
                pt.append(r0 if math.isfinite(r0) else np.nan)
                lo.append(q_lo)
                hi.append(min(q_hi, 1e6))
            ax.plot(grid, pt, color=colour, lw=1.5)
            ax.fill_between(grid, lo, hi, color=colour, alpha=0.15, lw=0)
        trend = fit_trend(pairs, cfg) if len(pairs) else None
        if trend is not None:
            ax.plot(grid, [trend.predict(float(n))[0] for n in grid], color=colour, lw=1, ls="--")
        p = next((p for p in preds if p.config == cfg), None)
        if p is not None and predict is not None and math.isfinite(p.ratio):
            top = p.hi if math.isfinite(p.hi) else 10 * p.ratio
            ax.errorbar([predict[0]], [p.ratio], yerr=[[p.ratio - p.lo], [top - p.ratio]],
                        fmt="D", color=colour, capsize=4, ms=6)  # fmt: skip
            seen += [p.lo, top]
    ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
    if predict is not None:
        ax.axvline(predict[0], color="0.3", lw=0.8, ls="--")
        ax.annotate(
            f"target N* = {markup.tokens(predict[0])}", (predict[0], 0.98), rotation=90,
            xycoords=("data", "axes fraction"), va="top", ha="right", fontsize=8, color="0.3",
        )  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    # the axis spans what was measured and predicted; a band wider than that (an unbounded
    # interval) runs off the plot's edge rather than squashing the points into a sliver
    finite = [y for y in seen if math.isfinite(y) and y > 0]
    ax.set_ylim(min(finite) / 1.3, max(finite) * 1.3)
    plain = FuncFormatter(lambda y, _pos: f"{y:.3g}")
    ax.yaxis.set_major_formatter(plain)
    lo_y, hi_y = ax.get_ylim()
    # minor ticks labelled only within a decade or so: across several they collide
    ax.yaxis.set_minor_formatter(plain if hi_y / lo_y < 12 else NullFormatter())
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("token ratio to the baseline's loss")
    if titles:
        ax.set_title(f"{study}: token ratio against N")
    if configs:
        handles, _ = ax.get_legend_handles_labels()
        keys = [
            Line2D([], [], color="0.3", lw=1.5, label="the sloped fit (band: 95%)"),
            Line2D([], [], color="0.3", lw=1, ls="--", label="trend in log N"),
            Line2D([], [], color="0.3", marker="D", ls="", label="prediction (95%)"),
        ]
        ax.legend(handles=[*handles, *keys], fontsize=7, loc="upper left")
    return fig


def _top_tpp(frame: pd.DataFrame, baseline: str) -> float:
    b = frame[frame["config"] == baseline]
    if b.empty:
        return 20.0
    top = b[b["params"] == b["params"].max()]
    return float(top["tokens"].max() / top["params"].max())


def _ratio(x: float) -> str:
    return "∞" if x == math.inf else markup.ratio(x)


def _blocks(
    study: str,
    cells: pd.DataFrame,
    frame: pd.DataFrame,
    baseline: str,
    predict: tuple[float, float] | None,
    boot: int,
    preds: Sequence[ConfigPrediction],
    tests: Sequence[Backtest],
    fit: LadderFit | None,
    rungs: Mapping[str, ReportResult],
    notes: Sequence[str],
    paths: Mapping[str, Path],
) -> list[Block]:
    sizes = sorted(frame["params"].unique())
    blocks: list[Block] = [
        ("h1", f"{study}: scaling ladder"),
        (
            "p",
            f"Study `{study}`: {len(rungs)} rungs ({len(sizes)} sizes, N from "
            f"{markup.tokens(sizes[0]) if sizes else '–'} to "
            f"{markup.tokens(sizes[-1]) if sizes else '–'}), baseline `{baseline}`, "
            f"{len(cells)} runs ({len(frame)} finished points in the fits).",
        ),
    ]
    if predict is not None and preds:
        blocks += [
            (
                "h2",
                f"Prediction at N* = {markup.tokens(predict[0])}, D* = {markup.tokens(predict[1])}",
            ),
            (
                "p",
                "The tokens each configuration needs to reach the baseline's loss at the target, "
                "over the baseline's, from a penalty that may change with size (effD a power k of "
                "N; k = 0 is Quartet's constant penalty, given alone beside it, with the model "
                "whose refit without the largest size predicted it better, and the model-free "
                f"trend). 95% intervals from a bootstrap of {boot} refits over whole runs paired "
                "by seed (docs/ladders.md).",
            ),
            ("table", _prediction_rows(preds, {b.config: b for b in tests})),
        ]
    elif predict is None:
        blocks.append(
            ("p", "No `ladder.predict` target: the rungs, the trend and the back-test only.")
        )
    if fit is not None:
        blocks += [("h2", "Efficiencies (Quartet's law, the baseline's fit held fixed; constant "
                   "and sloped)"),
                   ("p", _law_text(fit)), ("table", _eff_rows(fit))]  # fmt: skip
    if tests:
        blocks += [
            ("h2", "Back-test"),
            (
                "p",
                "Refitted without the largest size, the ladder's 95% interval for the ratio that "
                "size would measure (the prediction's uncertainty and the measurement's seed "
                "noise), against what it measured.",
            ),
            ("table", _backtest_rows(tests)),
        ]
    if notes:
        blocks.append(("ul", [f"**Note:** {n}" for n in notes]))
    blocks += [
        ("h2", "Figure"),
        (
            "figure",
            (
                "Token ratio against N: measured per rung (95% over seed pairs), the sloped fit "
                "and its 95% band carried to the target",
                paths["png"],
                paths["png"].name,
            ),
        ),  # fmt: skip
        ("h2", "Rungs"),
        ("p", "Each rung against its own baseline at its own target; its full report is linked."),
        ("table", _rung_rows(rungs)),
        ("h2", "Provenance"),
        ("table", provenance.table(cells)),
    ]
    return blocks


def _prediction_rows(
    preds: Sequence[ConfigPrediction], tests: Mapping[str, Backtest]
) -> tuple[list[str], list[list[str]]]:
    headers = ["configuration", "token ratio [95%]", "k [95%]", "Quartet (constant) [95%]",
               "back-test prefers", "trend [95%]", "reachable", "back-test covered",
               "trend changes with N"]  # fmt: skip
    rows = []
    for p in preds:
        bt = tests.get(p.config)
        trend = "–" if p.trend is None else _with_interval(*p.trend)
        slope = (
            "–"
            if p.slope is None
            else (
                f"{'yes' if p.trend_changes else 'no'} (slope {p.slope[0]:+.3f} ± {p.slope[1]:.3f})"
            )
        )
        reach = p.reachable + (
            f" ({p.p_unreachable:.0%} of refits cannot)" if p.p_unreachable else ""
        )
        rows.append([p.config, _with_interval(p.ratio, p.lo, p.hi),
                     f"{p.k[0]:+.3f} [{p.k[1]:+.3f}, {p.k[2]:+.3f}]",
                     _with_interval(*p.quartet), p.prefers, trend,
                     reach, "–" if bt is None else ("yes" if bt.covered else "**no**"),
                     slope])  # fmt: skip
    return headers, rows


def _with_interval(ratio: float, lo: float, hi: float) -> str:
    return f"{_ratio(ratio)} [{_ratio(lo)}, {_ratio(hi)}]"


def _law_text(fit: LadderFit) -> str:
    law = fit.law()
    return (
        f"L(N, D) = ({law.a:.4g} / N^{law.alpha:.3f} + {law.b:.4g} / D^{law.beta:.3f})"
        f"^{law.gamma:.3f} + {law.e:.4g}, fitted on the baseline; each configuration's loss is "
        "the law at (N effN, D effD), and under the sloped model at (N effN, D effD (N / "
        f"{markup.tokens(fit.point.n0)})^k)."
    )


def _eff_rows(fit: LadderFit) -> tuple[list[str], list[list[str]]]:
    rows = []
    for cfg in fit.configs:
        row = [cfg]
        for model in MODELS:
            point, reps = fit.efficiency(cfg, model)
            q = np.quantile(reps, [0.025, 0.975], axis=0)
            row += [f"{point[i]:.3f} [{q[0, i]:.3f}, {q[1, i]:.3f}]" for i in range(len(point))]
        rows.append(row)
    return ["configuration", "effN [95%]", "effD [95%]", "sloped: effN", "effD", "k"], rows


def _backtest_rows(tests: Sequence[Backtest]) -> tuple[list[str], list[list[str]]]:
    rows = [
        [b.config, markup.tokens(b.params), _ratio(b.predicted), f"[{_ratio(b.lo)}, {_ratio(b.hi)}]",
         (f"{b.side} " if b.side else "") + _ratio(b.measured), "yes" if b.covered else "**no**"]
        for b in tests
    ]  # fmt: skip
    return ["configuration", "held-out N", "predicted", "95% for the measurement", "measured",
            "covered"], rows  # fmt: skip


def _rung_rows(rungs: Mapping[str, ReportResult]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for rung, res in rungs.items():
        link = f"[{rung}](rungs/{slug(rung)}/report.md)"
        for r in res.config_table.to_dict("records"):
            v, _ = verdict(r)
            cost, _ = cost_and_speedup(r)
            rows.append([link, r["config"], "baseline" if r["baseline"] else v,
                         f"{r['seeds_reached']}/{r['seeds_total']}",
                         "reference" if r["baseline"] else cost,
                         markup.plus_minus(r["final_ppl_mean"], r["final_ppl_std"])])  # fmt: skip
            link = ""
    return ["rung", "configuration", "verdict", "seeds reached", "relative token cost [95% CI]",
            "final ppl"], rows  # fmt: skip


def ladder_metrics(result: LadderResult) -> dict[str, float]:
    """The parent run's metrics of a ladder: per configuration and method, the predicted token
    ratio and its interval (``ladder.<config>.<method>.ratio|lo|hi``; inf as a large number,
    MLflow stores no infinity), and whether the back-test covered."""
    out: dict[str, float] = {}
    for r in result.table.to_dict("records"):
        name = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in r["config"])
        method = r["method"].replace("+", "_")
        for k, col in (("ratio", "token_ratio"), ("lo", "ratio_lo"), ("hi", "ratio_hi")):
            v = float(r[col])
            out[f"ladder.{name}.{method}.{k}"] = v if math.isfinite(v) else 1e30
    for b in result.backtests:
        name = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in b.config)
        out[f"ladder.{name}.backtest_covered"] = float(b.covered)
    return out
