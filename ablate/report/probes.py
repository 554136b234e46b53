"""The report's probe section: gradient-fidelity metrics (``ablate.train.probe``) per configuration,
when the study's runs logged any.

Input contract: ``probes``, one row per (cell, step, metric): key, step int, metric str (the MLflow
name, e.g. ``probe.wgrad.rel_err`` or ``probe.wgrad.rel_err.L3``), value float. Per configuration a
metric is the mean over its seeds at each probe step.

    probe_metrics.*    per GEMM (columns), relative error and alignment over training (rows)
    probe_layers.*     layer x GEMM heatmap of the relative error at the last probe step
    probe_structure.*  the error-structure measures of the wgrad error per configuration, late in
                       training: step_cos, step_cos_perp and sum_ratio, against their values for
                       independent errors (0, 0 and 1/sqrt(K))

The section's table lists, per configuration and GEMM, the final relative error, cosine and
alignment and the late means of step_cos, step_cos_perp, sum_ratio and bias_ratio.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ablate.report import markup, plots
from ablate.report.markup import Block
from backends.recipes import GEMMS

PROBE_COLUMNS = ("key", "step", "metric", "value")
LATE = 0.5
"""The structure measures are averaged over the probes from this fraction of training on."""
FIGURES = {
    "probe_metrics": "Probes: relative error |g_q - g|/|g| and alignment <g_q, g>/<g, g> of each "
    "quantized GEMM on the fixed probe batch over training (mean over layers and seeds)",
    "probe_layers": "Probes: relative error per transformer block and GEMM at the last probe step "
    "(mean over the block's linears and the seeds)",
    "probe_structure": "Probes: structure of the wgrad error over training steps, late in training: "
    "cosine between consecutive probes' errors (0: independent, 1: the same pattern), the same for "
    "their parts orthogonal to the exact output, and |sum of K errors| / (K x mean error) "
    "(1/sqrt(K): independent, 1: structured)",
}
_LAYER = re.compile(r"^probe\.(\w+)\.(\w+)\.L(\d+)$")


def probe_keys(metrics: Sequence[str]) -> list[str]:
    """The probe metrics the report reads, of those a run has: per-GEMM means of the metrics it
    shows, the structure measures and the per-block relative error."""
    wanted = {"rel_err", "cos", "align", "step_cos", "step_cos_perp", "sum_ratio", "bias_ratio"}

    def shown(m: str) -> bool:
        parts = m.split(".")
        if len(parts) == 3 and parts[0] == "probe" and parts[1] in GEMMS:
            return parts[2] in wanted
        layer = _LAYER.match(m)
        return (layer is not None and layer.group(2) == "rel_err") or m == "probe.cost"

    return sorted(m for m in metrics if shown(m))


def by_config(cell_table: Any, probes: Any) -> Any:
    """Mean over seeds per (config, step, metric): columns config, step, metric, value, n."""
    p = probes.reindex(columns=list(PROBE_COLUMNS))
    p = p.assign(config=p["key"].map(cell_table.set_index("key")["config"]))
    p = p[p["config"].notna() & np.isfinite(p["value"].astype(float))]
    g = p.groupby(["config", "step", "metric"], sort=True)["value"]
    return g.agg(value="mean", lo="min", hi="max", n="count").reset_index()


def _series(agg: Any, config: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    s = agg[(agg["config"] == config) & (agg["metric"] == metric)]
    return s["step"].to_numpy(dtype=float), s["value"].to_numpy(dtype=float)


def _late_mean(agg: Any, config: str, metric: str) -> tuple[float, float, float]:
    """(mean, min over seeds, max over seeds) of a metric over the late probes."""
    s = agg[(agg["config"] == config) & (agg["metric"] == metric)]
    if not len(s):
        return math.nan, math.nan, math.nan
    cut = LATE * float(agg["step"].max())
    late = s[s["step"] >= cut]
    late = late if len(late) else s
    return float(late["value"].mean()), float(late["lo"].mean()), float(late["hi"].mean())


def _final(agg: Any, config: str, metric: str) -> float:
    s = agg[(agg["config"] == config) & (agg["metric"] == metric)]
    return float(s.sort_values("step")["value"].iloc[-1]) if len(s) else math.nan


def gemms_of(agg: Any) -> list[str]:
    have = {m.split(".")[1] for m in agg["metric"] if m.count(".") == 2}
    return [g for g in GEMMS if g in have]


def probe_table(config_table: Any, agg: Any) -> pd.DataFrame:
    """One row per (configuration, probed GEMM): final rel_err, cos, align; late step_cos,
    sum_ratio, bias_ratio."""
    rows = []
    configs = set(agg["config"])
    for r in config_table.to_dict("records"):
        c = r["config"]
        if c not in configs:
            continue
        for g in gemms_of(agg):
            if not (agg["metric"] == f"probe.{g}.rel_err").any() or math.isnan(
                _final(agg, c, f"probe.{g}.rel_err")
            ):
                continue
            rows.append(
                {
                    "config": c,
                    "gemm": g,
                    "rel_err": _final(agg, c, f"probe.{g}.rel_err"),
                    "cos": _final(agg, c, f"probe.{g}.cos"),
                    "align": _final(agg, c, f"probe.{g}.align"),
                    "step_cos": _late_mean(agg, c, f"probe.{g}.step_cos")[0],
                    "step_cos_perp": _late_mean(agg, c, f"probe.{g}.step_cos_perp")[0],
                    "sum_ratio": _late_mean(agg, c, f"probe.{g}.sum_ratio")[0],
                    "bias_ratio": _late_mean(agg, c, f"probe.{g}.bias_ratio")[0],
                }
            )
    return pd.DataFrame(rows)


def plot_metrics(config_table: Any, agg: Any, title: str = "", *, titles: bool = True) -> Figure:
    gemms = gemms_of(agg)
    rows = (("rel_err", "relative error"), ("align", "alignment"))
    fig = Figure(figsize=(3.6 * max(len(gemms), 1) + 1, 6.5), layout="constrained")
    axes = fig.subplots(len(rows), max(len(gemms), 1), squeeze=False, sharex=True)
    st = plots.styles(config_table)
    handles: dict[str, Any] = {}
    for j, g in enumerate(gemms):
        for i, (m, label) in enumerate(rows):
            ax = axes[i][j]
            for r in config_table.to_dict("records"):
                x, y = _series(agg, r["config"], f"probe.{g}.{m}")
                if not len(x):
                    continue
                s = st[r["config"]]
                (h,) = ax.plot(
                    x, y, color=s["color"], linestyle=s["linestyle"], marker=s["marker"] or "o",
                    markersize=3, linewidth=1.4,
                )  # fmt: skip
                handles.setdefault(r["config"], h)
            if m == "align":
                ax.axhline(1.0, color="#000000", linewidth=0.6, alpha=0.5)
            ax.set_title(f"{g}: {label}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if i == len(rows) - 1:
                ax.set_xlabel("step")
    if handles:
        plots.legend(fig, list(handles.values()), list(handles))
    if titles:
        fig.suptitle((title + ": " if title else "") + "gradient fidelity over training")
    return fig


def layer_matrix(agg: Any, config: str, metric: str = "rel_err") -> tuple[np.ndarray, list[int]]:
    """(blocks x GEMMs matrix of ``metric`` at the config's last probe step, block indices)."""
    s = agg[agg["config"] == config]
    found: dict[tuple[int, str], float] = {}
    for m, sub in s.groupby("metric"):
        hit = _LAYER.match(str(m))
        if hit and hit.group(2) == metric:
            last = sub.sort_values("step").iloc[-1]
            found[(int(hit.group(3)), hit.group(1))] = float(last["value"])
    blocks = sorted({b for b, _ in found})
    mat = np.full((len(blocks), len(GEMMS)), np.nan)
    for (b, g), v in found.items():
        mat[blocks.index(b), GEMMS.index(g)] = v
    return mat, blocks


def plot_layers(config_table: Any, agg: Any, title: str = "", *, titles: bool = True) -> Figure:
    configs = [c for c in config_table["config"] if (agg["config"] == c).any()]
    mats = {c: layer_matrix(agg, c) for c in configs}
    configs = [c for c in configs if mats[c][1]]
    n = max(len(configs), 1)
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    fig = Figure(figsize=(3.4 * ncol + 1, 2.9 * nrow + 0.8), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False)
    values = np.concatenate([m.ravel() for m, _ in mats.values()]) if mats else np.array([])
    values = values[np.isfinite(values)]
    vmin, vmax = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    im = None
    for k, c in enumerate(configs):
        ax = axes[k // ncol][k % ncol]
        mat, blocks = mats[c]
        im = ax.imshow(mat, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
        ax.set_xticks(range(len(GEMMS)), GEMMS, fontsize=8)
        ax.set_yticks(range(len(blocks)), [f"L{b}" for b in blocks], fontsize=8)
        for (i, j), v in np.ndenumerate(mat):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=6, color="white")
        ax.set_title(c, fontsize=8)
    for k in range(len(configs), nrow * ncol):
        axes[k // ncol][k % ncol].set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label="relative error at the last probe")
    if titles:
        fig.suptitle((title + ": " if title else "") + "relative error per block and GEMM")
    return fig


def plot_structure(
    config_table: Any, agg: Any, window: int | None, title: str = "", *, titles: bool = True
) -> Figure:
    configs = [c for c in config_table["config"] if (agg["config"] == c).any()]
    st = plots.styles(config_table)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (m, label, ref, ref_label) in zip(
        axes,
        (
            ("step_cos", "cosine of consecutive wgrad errors", 0.0, "independent"),
            ("step_cos_perp", "the same, parts orthogonal to g", 0.0, "independent"),
            (
                "sum_ratio",
                f"|sum of {window or 'K'} wgrad errors| / ({window or 'K'} x mean)",
                1 / math.sqrt(window) if window else None,
                f"independent: 1/sqrt({window})",
            ),
        ),
        strict=True,
    ):
        means, los, his = (
            zip(*(_late_mean(agg, c, f"probe.wgrad.{m}") for c in configs), strict=True)
            if configs
            else ((), (), ())
        )
        y = np.arange(len(configs))
        for i, c in enumerate(configs):
            s = st[c]
            ax.barh(
                i, means[i], color=s["color"], hatch=s["hatch"], edgecolor="#333333", height=0.7,
                xerr=[[max(means[i] - los[i], 0)], [max(his[i] - means[i], 0)]]
                if np.isfinite(means[i]) else None,
                error_kw={"elinewidth": 0.8, "capsize": 2},
            )  # fmt: skip
            if np.isfinite(means[i]):
                ax.text(means[i], i, f" {means[i]:.3f}", va="center", fontsize=7)
        if ref is not None:
            ax.axvline(ref, color="#000000", linestyle="--", linewidth=0.8, label=ref_label)
        ax.axvline(1.0, color="#000000", linewidth=0.6, alpha=0.4)
        ax.set_yticks(y, configs, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(label, fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[1].set_yticklabels([])
    axes[2].set_yticklabels([])
    if titles:
        fig.suptitle(
            (title + ": " if title else "")
            + f"wgrad error structure (mean over probes from {LATE:.0%} of training; bars: seeds)",
            fontsize=10,
        )
    return fig


def probe_blocks(
    config_table: Any,
    cell_table: Any,
    probes: Any,
    out_dir: Any,
    *,
    study: str,
    settings: dict[str, Any] | None = None,
    titles: bool = True,
) -> tuple[list[Block], dict[str, dict[str, Any]], pd.DataFrame]:
    """The section's blocks, its figure paths and its table (empty when there are no probes)."""
    if probes is None or not len(probes):
        return [], {}, pd.DataFrame()
    agg = by_config(cell_table, probes)
    if not len(agg):
        return [], {}, pd.DataFrame()
    window = (settings or {}).get("window")
    figs = {
        "probe_metrics": plot_metrics(config_table, agg, title=study, titles=titles),
        "probe_layers": plot_layers(config_table, agg, title=study, titles=titles),
        "probe_structure": plot_structure(config_table, agg, window, title=study, titles=titles),
    }
    paths = {name: plots.save(fig, out_dir, name) for name, fig in figs.items()}
    table = probe_table(config_table, agg)
    cost = probes.loc[probes["metric"] == "probe.cost", "value"].astype(float)  # every cell's
    steps = sorted(set(agg["step"]))
    what = (
        f"At {len(steps)} probe steps ({', '.join(map(str, steps[:12]))}"
        + (" ..." if len(steps) > 12 else "")
        + "), on a fixed probe batch, each quantized GEMM of each probed layer is compared with "
        "the exact GEMM on the same operands (`ablate.train.probe`, numerics in `backends.layer.probe`)."
    )
    if settings:
        what += " Settings: " + ", ".join(f"{k} {v}" for k, v in settings.items()) + "."
    if len(cost):
        what += (
            f" A probe step cost {cost.median():.2f}x a training step (median; "
            f"{cost.min():.2f}-{cost.max():.2f}x)."
        )
    headers = [
        "configuration", "GEMM", "rel. error (final)", "cosine (final)", "alignment (final)",
        "step cos (late)", "step cos ⊥ g (late)", "sum ratio (late)", "bias ratio (late)",
    ]  # fmt: skip
    rows = [
        [
            r["config"], r["gemm"], markup.num(r["rel_err"]), markup.num(r["cos"], 5),
            markup.num(r["align"], 5), markup.num(r["step_cos"], 3),
            markup.num(r["step_cos_perp"], 3), markup.num(r["sum_ratio"], 3),
            markup.num(r["bias_ratio"], 3),
        ]
        for r in table.to_dict("records")
    ]  # fmt: skip
    blocks: list[Block] = [
        ("h2", "Gradient fidelity (probes)"),
        ("p", what),
        ("table", (headers, rows)),
    ]
    for name, caption in FIGURES.items():
        blocks.append(("figure", (caption, paths[name]["png"], paths[name]["png"].name)))
    blocks.append(
        (
            "ul",
            [
                "**rel. error** |g_q − g|/|g| and **cosine** of the quantized GEMM output g_q "
                "against the exact g on the same operands, **alignment** ⟨g_q, g⟩/⟨g, g⟩ (1: "
                "unbiased in the direction of g); mean over the probed layers, at the last probe.",
                "**step cos**: cosine between the error of one probe and the previous one's on the "
                "same batch; **step cos ⊥ g**: the same for the errors' parts orthogonal to the "
                "exact output (a shrinkage of the output, alignment < 1, is common to consecutive "
                "errors whatever the rest does); **sum ratio**: |sum of the last K errors| / (K × "
                "their mean norm), "
                "1/√K for independent errors and 1 for a fixed pattern; all three averaged over the "
                f"probes from {LATE:.0%} of training on. **bias ratio**: |mean error over redraws| "
                "/ mean |error| (1 for a deterministic recipe, 1/√repeats for unbiased noise).",
                "A recipe keeps its pattern when the step cos is high and the sum ratio near 1: "
                "its error accumulates over steps instead of averaging out.",
            ],
        )
    )
    return blocks, paths, table
