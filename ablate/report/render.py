"""``build_report``: from a study's cells and evaluations to ``report.md``, ``report.html``,
``summary.csv`` and the figures (PNG and SVG) in one output folder.

    report.md            verdict, target, notes, summary table, figures linked, per-run table,
                         provenance (which code, commit, device, precision, torch), method
    report.html          the same, self-contained (inline CSS, figures as base64 PNG)
    summary.csv          one row per configuration (``metrics.per_config`` columns + target_ppl +
                         ``provenance.PER_CONFIG``)
    convergence.*        validation perplexity against tokens, every configuration
    convergence_late.*   the same from LATE_FRACTION of training on, linear axes, near the target
    token_cost.*         relative token cost with 95% intervals (hollow bars: censored seeds)
    speedup.*            projected end-to-end speedup with 95% intervals
    equal_loss.*         equal-loss token ratio over training
    probe_*.*            with probe metrics: the gradient-fidelity section (``report.probes``)

The inputs follow the contract in ``ablate.report.metrics``; the target is any object (or dict) with
``val_ppl``, ``val_loss``, ``from_baseline`` and ``tolerance``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.errors import ReportError
from ablate.report import bars, markup, plots, provenance
from ablate.report.markup import Block
from ablate.report.metrics import (
    check_inputs,
    clean_evals,
    describe_target,
    equal_loss_curves,
    per_cell,
    per_config,
    report_notes,
    resolve_target,
)
from ablate.report.probes import probe_blocks
from ablate.report.run_metrics import run_summaries
from ablate.report.verdict import cost_and_speedup, ratio_text, verdict, verdict_lines
from ablate.study.speedup import SpeedupSection

LATE_FRACTION = 0.5
FIGURES = {
    "convergence": "Validation perplexity against tokens (geometric mean over seeds; thin lines: "
    "each seed, or a min-max band beyond three seeds)",
    "convergence_late": f"Late stage: from {LATE_FRACTION:.0%} of training, near the target",
    "token_cost": "Tokens to target relative to the baseline, 95% interval over seeds (hollow: "
    "some seeds did not reach the target)",
    "speedup": "Projected end-to-end speedup vs the baseline, 95% interval from the token cost",
    "equal_loss": "Equal-loss token ratio over training (geometric mean over seed pairs: seed i "
    "against baseline seed i where two or more seeds are shared, else every pair)",
}


@dataclass
class ReportResult:
    """What ``build_report`` wrote, and the tables it computed."""

    out_dir: Path
    report_md: Path
    report_html: Path
    summary_csv: Path
    figures: dict[str, dict[str, Path]]  # name -> {"png": path, "svg": path}
    config_table: Any  # DataFrame, one row per configuration (metrics.per_config)
    cell_table: Any  # DataFrame, one row per cell (metrics.per_cell)
    run_summaries: dict[str, dict[str, float]]  # key -> its run's summary metrics (run_metrics)
    target_ppl: float
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        """Every file this report wrote (what is attached to the study's run: nothing else that
        lies in its folder)."""
        figures = [p for paths in self.figures.values() for p in paths.values()]
        return [self.report_md, self.report_html, self.summary_csv, *figures]


def build_report(
    cells: Any,
    evals: Any,
    target: Any,
    speedup: SpeedupSection | None,
    out_dir: str | Path,
    *,
    study: str,
    title: str | None = None,
    notes: Sequence[str] = (),
    tuning: Sequence[Mapping[str, Any]] = (),
    probes: Any = None,
    probe_settings: Mapping[str, Any] | None = None,
    titles: bool = True,
    mix_numerics: bool = False,
    mix_data: bool = False,
    figures: Sequence[str] | None = None,
    decisions: tuple[str, list[str]] | None = None,
) -> ReportResult:
    """Compute tokens to target per cell and configuration, draw the figures and write the report.

    ``notes`` are the caller's own lines (e.g. runs still in progress), shown under the target;
    ``titles`` False leaves the figures' titles out (a paper's captions carry them); ``figures``
    names the ones to draw (default: every one of ``FIGURES``). ``decisions`` (a lead and its
    lines: ``report.waves.sequential_lines``) opens the verdict with a sequential study's decision.
    ``probes`` (the contract of ``report.probes``), when it has rows, adds the probe section.
    Runs of two numerics versions are refused (``provenance.check_numerics``) unless
    ``mix_numerics``, and ended cells of one data configuration that trained on other tokens
    (``provenance.check_data``) unless ``mix_data``; either then notes them instead.
    Raises ``ReportError`` when the inputs break the contract or the target cannot be resolved; a
    baseline that never reaches the target is not an error (its costs are NaN and the report says so).
    """
    check_inputs(cells, evals)
    mixed = provenance.check_numerics(cells, mixed=mix_numerics)
    mixed_data = provenance.check_data(cells, mixed=mix_data)
    notes = [*notes, *(n for n in (mixed, mixed_data) if n)]
    spec = speedup if speedup is not None else SpeedupSection()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = title or f"{study}: tokens to target"

    ev = clean_evals(cells, evals)
    target_ppl = resolve_target(target, ev, cells)
    cell_table = per_cell(cells, ev, target_ppl)
    at_start = sorted(set(cell_table.loc[cell_table["tokens_to_target"] <= 0, "config"]))
    if at_start:  # tokens to a target met before training measure nothing (and log(0) is not)
        raise ReportError(
            f"target: val ppl {target_ppl:.4g} is reached before any training (at 0 tokens, the "
            f"first evaluation) by {', '.join(at_start[:5])}: tokens to it measure nothing; give "
            "a target that training has to reach (a lower target.val_ppl)"
        )
    config_table = per_config(cell_table, spec, ev)
    seq = decisions is not None
    all_notes = [
        *notes,
        *report_notes(config_table, target_ppl, sequential=seq),
        *provenance.notes(cells),
    ]

    data = plots.curves(cell_table, ev)
    t: dict[str, Any] = {"title": study, "titles": titles}
    draw = {
        "convergence": lambda: plots.plot_convergence(
            config_table, cell_table, data, target_ppl, **t
        ),
        "convergence_late": lambda: plots.plot_convergence(
            config_table, cell_table, data, target_ppl, late=LATE_FRACTION, **t
        ),
        "token_cost": lambda: bars.plot_token_cost(config_table, **t),
        "speedup": lambda: bars.plot_speedup(config_table, **t),
        "equal_loss": lambda: plots.plot_equal_loss(
            config_table, equal_loss_curves(cell_table, ev), **t
        ),
    }
    wanted = FIGURES if figures is None else figures
    paths = {name: plots.save(draw[name](), out, name) for name in FIGURES if name in wanted}

    summary_csv = out / "summary.csv"
    summary = config_table.assign(target_ppl=target_ppl)
    summary.merge(provenance.per_config(cells), on="config", how="left").to_csv(
        summary_csv, index=False
    )
    blocks = _blocks(
        title, study, target, target_ppl, all_notes, config_table, cell_table, spec, paths
    )
    if decisions is not None:
        at = blocks.index(("h2", "Verdict")) + 1
        blocks[at:at] = [("p", decisions[0]), ("ul", decisions[1])]
    at = next(i for i, b in enumerate(blocks) if b == ("h2", "Method"))
    blocks[at:at] = [
        ("h2", "Provenance"),
        ("p", "What produced the runs (their `env.*` tags in MLflow), one row per combination:"),
        ("table", provenance.table(cells)),
    ]
    if tuning:
        at = next(i for i, b in enumerate(blocks) if b == ("h2", "Runs"))
        blocks[at:at] = _tuning_blocks(tuning)
    probe_section, probe_paths, _ = probe_blocks(
        config_table,
        cell_table,
        probes,
        out,
        study=study,
        settings=dict(probe_settings or {}),
        titles=titles,
    )
    if probe_section:
        at = next(i for i, b in enumerate(blocks) if b == ("h2", "Runs"))
        blocks[at:at] = probe_section
        paths.update(probe_paths)
    report_md = out / "report.md"
    report_md.write_text(markup.to_markdown(blocks), encoding="utf-8")
    report_html = out / "report.html"
    report_html.write_text(markup.to_html(blocks, title), encoding="utf-8")
    return ReportResult(
        out_dir=out,
        report_md=report_md,
        report_html=report_html,
        summary_csv=summary_csv,
        figures=paths,
        config_table=config_table,
        cell_table=cell_table,
        run_summaries=run_summaries(cell_table, ev, target_ppl),
        target_ppl=target_ppl,
        notes=all_notes,
    )


def _summary_rows(config_table: Any) -> tuple[list[str], list[list[str]]]:
    headers = [
        "configuration",
        "verdict",
        "seeds reached",
        "tokens to target [95% CI]",
        "relative token cost [95% CI] (method)",
        "stalled seeds [95% CI]",
        "equal-loss token ratio [95% CI] (method)",
        "final ppl",
        "step throughput gain",
        "projected speedup [95% CI]",
        "notes",
    ]
    rows = []
    for r in sorted(config_table.to_dict("records"), key=_by_speedup):
        name = f"**{r['config']}** (baseline)" if r["baseline"] else r["config"]
        v, why = verdict(r)
        cost, speed = cost_and_speedup(r)
        if r["baseline"] and r["seeds_reached"]:
            cost, ratio = "reference", "reference"
        else:
            cost += _KIND_MARK.get(r["rel_token_cost_kind"], "")
            method = r.get("rel_token_cost_method") or ""
            cost += f" ({method})" if method else ""
            ratio = ratio_text(r)
        rows.append(
            [
                name,
                "–" if v == "baseline" else v,
                f"{r['seeds_reached']}/{r['seeds_total']}" + (" (partial)" if r["partial"] else ""),
                markup.interval(
                    r["tokens_to_target"],
                    r["tokens_to_target_lo"],
                    r["tokens_to_target_hi"],
                    markup.tokens,
                ),
                cost,
                _stall_text(r),
                ratio,
                markup.plus_minus(r["final_ppl_mean"], r["final_ppl_std"]),
                f"{markup.times(r['throughput_gain'])} ({r['speedup_source']})",
                speed,
                # a bounded cost's note already says why it is undetermined
                "; ".join(
                    x for x in (why if r["rel_token_cost_kind"] != "bound" else "", r["note"]) if x
                ),
            ]
        )
    return headers, rows


_KIND_MARK = {"censored": " (censored)", "bound": ""}


def _stall_text(r: Mapping[str, Any]) -> str:
    """``1/2 [1%, 99%]``: seeds stalled of those judged, with the exact interval of the rate
    (``stalls``); ``–`` where no seed could be judged."""
    n = int(r.get("seeds_judged", 0) or 0)
    if not n:
        return "–"
    k = int(r["seeds_stalled"])
    return f"{k}/{n} [{r['stall_rate_lo']:.0%}, {r['stall_rate_hi']:.0%}]"


def _by_speedup(r: Mapping[str, Any]) -> tuple[int, float]:
    """Summary order: the baseline, then configurations by projected speedup, fastest first;
    those without a point estimate (a bounded cost, no model) last, in the table's own order."""
    if r["baseline"]:
        return (0, 0.0)
    point = r["projected_speedup"]
    return (1, -point) if math.isfinite(point) else (2, 0.0)


def _cell_rows(cell_table: Any, config_table: Any) -> tuple[list[str], list[list[str]]]:
    headers = [
        "run",
        "status",
        "outcome",
        "tokens to target",
        "best ppl",
        "final ppl",
        "diverged at step",
    ]
    order = {c: i for i, c in enumerate(config_table["config"])}
    table = cell_table.assign(_o=cell_table["config"].map(order)).sort_values(
        ["_o", "seed"], kind="stable"
    )
    rows = [
        [
            r["label"],
            r["status"],
            r["outcome"],
            markup.tokens(r["tokens_to_target"]),
            markup.num(r["best_ppl"]),
            markup.num(r["final_ppl"]),
            f"{r['diverged_at']:.0f}" if r["diverged_at"] == r["diverged_at"] else "–",
        ]
        for r in table.to_dict("records")
    ]
    return headers, rows


def _method(spec: SpeedupSection, config_table: Any, cell_table: Any) -> list[str]:
    measured = int((config_table["speedup_source"] == "measured").sum())
    longer = cell_table[cell_table["extended_tokens"].notna()]
    extension = (
        [
            "**Baseline trained longer** (`baseline_extend`): the baseline's runs trained "
            f"{float((longer['extended_tokens'] / longer['last_tokens']).max()):.2f}x the budget, "
            "on the same learning-rate schedule up to it (their curves up to it are an ordinary "
            "run's, bit for bit), then at its final learning rate. Tokens to target, final and best "
            "perplexity, and a target derived from the baseline are read up to the budget, as for "
            "any run; the longer curves serve the equal-loss ratio, so that a configuration's "
            "final loss lies on them."
        ]
        if len(longer)
        else []
    )
    return [
        *extension,
        "**Tokens to target**: the first evaluation at or below the target perplexity; between it and "
        "the evaluation before, the crossing is interpolated linearly in log-perplexity (validation "
        "loss). Duplicate evaluations of a step keep the last one logged. Runs that never reach the "
        "target are *not reached* (their best perplexity is listed); runs with a NaN/inf loss or "
        "status diverged are *diverged* at that step and count as failures in *seeds reached*. Runs "
        "still running, interrupted or failed count once they have crossed; until then they are "
        "*incomplete*.",
        "**Per configuration** (cells that differ only by seed): a seed that has not reached the "
        "target is right-censored at its last evaluation (it needs more tokens than it trained), "
        "never dropped. Tokens to target are log-normal over seeds; the estimate is the maximum-"
        "likelihood median with censored seeds counted by their probability of lying beyond their "
        "last evaluation. Kinds: *observed* (every seed reached), *censored* (an estimate using "
        "censored seeds), a *lower bound* `≥` when no seed reached. Final perplexity is over "
        "finished, non-diverged seeds; curves are the geometric mean of perplexity over seeds.",
        "**Stalls**: at half its budget each finished run's perplexity is compared with what its "
        "configuration's other seeds predict for it (each moved by how the two seeds stand in the "
        "study's other configurations); a run more than 25% above is *stalled*: it sat on the "
        "early plateau. Stalls are an outcome of their own: each configuration's rate has its "
        "exact (Clopper-Pearson) 95% interval, Fisher's exact one-sided test asks whether it "
        "stalls more often than the baseline (p < 0.05: *worse*, whatever its token cost), and "
        "every other estimate (tokens to target, costs, ratios, a target derived from the "
        "baseline) is of the runs that did not stall.",
        "**Relative token cost** = exp(μ_config − μ_baseline) − 1, the ratio of median tokens to "
        "target, with the method behind each interval in the table. *paired*: a seed starts every "
        "configuration from the same weights, data order and random streams, so log tokens to "
        "target = configuration effect + seed effect + noise, with the noise pooled over every "
        "configuration of the study; the interval is the two-way least-squares t interval with "
        "(runs − configurations − seeds + 1) degrees of freedom, or with censored seeds its "
        "profile-likelihood generalisation (a censored-normal model). *paired-own*: the same "
        "with the comparison's two configurations only, used when Bartlett's test finds the "
        "configurations' noise unequal (p < 0.05). *unpaired*: the configuration and the "
        "baseline share fewer than two seeds: the profile-likelihood interval with σ from the "
        "two configurations' seeds, exactly the pooled two-sample t interval on log tokens when "
        "no seed is censored. The coverage of each (93–97% over 2,000 simulated studies with "
        "shared seed effects, censoring and stall-prone baselines) is measured by `python -m "
        "ablate.bench.seeds` and checked in the test suite. With fewer than two reached seeds, "
        "or none to spare for the noise, there is no interval; identical token counts give no "
        "interval rather than an exact one. When no seed reached the target the cost has a 95% "
        "lower bound only: the least the seeds' censored tokens allow (each seed placed by its "
        "offset from the others on their own curves), less the t quantile times the standard "
        "error with the seed noise of both sides; it exceeds the true cost in under 2.5% of "
        "simulated studies. Where that bound is below zero although every seed trained past the "
        "baseline's median tokens to target, the report says what was observed (*not reached "
        "after 1.36x the baseline's tokens*).",
        "**Equal-loss token ratio**: at the end of training, the configuration's tokens divided by "
        "the tokens the baseline needed to first reach the same validation loss (interpolated on "
        "its curve), with the method behind each interval in the table. Defined also where the "
        "target is never reached. *paired*: the configuration and the baseline share two or more "
        "seeds, and seed i of one is compared with seed i of the other (the same weights, data "
        "order and random streams: what the seed does to training cancels), each pair at the "
        "higher of its two final losses, which both reached; the geometric mean over the pairs "
        "and the one-sample t interval on their log ratios (pairs − 1 degrees of freedom), which "
        "covers 94–96% over 2,000 simulated studies a setting, with shared seed effects and "
        "either side noisier (checked in the test suite). "
        "*unpaired*: fewer than two shared seeds: the geometric mean over all (seed, baseline "
        "seed) pairs, 95% interval from the spread of both sides (Welch). In the unpaired "
        "estimate a pair whose configuration seed ended below the baseline seed's lowest loss is "
        "*censored*: the baseline would have needed more tokens than it trained, nothing more is "
        "known, and nothing is imputed; the seeds' offsets on their own curves place the other "
        "pairs, and the interval stays two-sided (*censored*). Only when every pair is censored "
        "is the ratio an upper bound (*≤*). Coverage (95–99%) and bias (under 0.3 points) are "
        "checked by simulation in the test suite, with equal budgets and with a baseline trained "
        "longer.",
        "**Projected speedup** = step-throughput gain / (1 + relative token cost), its interval from "
        "the cost's; a cost that is only bounded gives only an upper bound on the speedup. The gain "
        "is measured (ratio of mean tokens/s) when the configuration and the baseline both ran "
        f"native GEMMs with measured throughput ({measured} of {len(config_table)} configurations "
        "here), otherwise modelled (its uncertainty is not in the interval): step time = (1 − GEMM "
        "share) + Σ over fprop, dgrad, wgrad of share × (1 / throughput ratio of its format + "
        "quantization and intervention overhead).",
        "**Verdict**: *better* when the whole speedup interval is above 1×, *worse* when it is "
        "below, *indistinguishable* when it contains 1×, *undetermined* without an interval or "
        "when a seed diverged.",
        spec.describe(),
    ]


def _blocks(
    title: str,
    study: str,
    target: Any,
    target_ppl: float,
    notes: Sequence[str],
    config_table: Any,
    cell_table: Any,
    spec: SpeedupSection,
    paths: dict[str, dict[str, Path]],
) -> list[Block]:
    n_cells = len(cell_table)
    blocks: list[Block] = [
        ("h1", title),
        (
            "p",
            f"Study `{study}`: {len(config_table)} configurations, {n_cells} runs. Target: validation "
            f"perplexity **{target_ppl:.4g}** (`{describe_target(target)}`).",
        ),
    ]
    lead, verdict_items = verdict_lines(config_table)
    blocks += [("h2", "Verdict"), ("p", lead), ("ul", verdict_items)]
    if notes:
        blocks.append(("ul", [f"**Note:** {n}" for n in notes]))
    blocks += [
        ("h2", "Summary"),
        ("table", _summary_rows(config_table)),
        ("h2", "Figures"),
    ]
    for name, caption in FIGURES.items():
        if name in paths:
            blocks.append(("figure", (caption, paths[name]["png"], paths[name]["png"].name)))
    blocks += [
        ("h2", "Runs"),
        ("table", _cell_rows(cell_table, config_table)),
        ("h2", "Method"),
        ("ul", _method(spec, config_table, cell_table)),
    ]
    return blocks


def _tuning_blocks(tuning: Sequence[Mapping[str, Any]]) -> list[Block]:
    """The ``ablate tune`` outcome (``ablate.tune.storage.tune_summary``): best value and parameters
    per search, and parameter importance where there were enough trials."""
    rows = []
    for t in tuning:
        best = t.get("best_params") or {}
        imp = t.get("importance") or {}
        rows.append(
            [
                str(t.get("search", "")),
                f"{t.get('complete', 0)} / {t.get('pruned', 0)} / {t.get('failed', 0)}",
                markup.num(float(t["best_value"])) if t.get("best_value") is not None else "-",
                ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best.items()
                )
                or "-",
                ", ".join(f"{k} {v:.0%}" for k, v in imp.items()) or "-",
            ]
        )
    objective = next((str(t.get("objective")) for t in tuning if t.get("objective")), "objective")
    return [
        ("h2", "Tuning"),
        (
            "p",
            f"`ablate tune` searches, one per group of cells; best {objective} (lower is better). "
            "Trials: complete / pruned / failed.",
        ),
        (
            "table",
            (["search", "trials", "best value", "best parameters", "importance"], rows),
        ),
    ]
