"""Figures: convergence curves, a late-stage zoom, relative token cost per configuration, and the
equal-loss token ratio over training.

Figures are ``matplotlib.figure.Figure`` objects built without pyplot (so the caller's backend and
figure registry are untouched; saving uses Agg for PNG and the SVG backend for SVG).

Encoding, the same in every figure:
    colour     which GEMMs are FP4 (fprop: blue, fprop+dgrad: green, fprop+dgrad+wgrad: red, other
               subsets their own hue, no FP4 GEMM: grey, the baseline: black)
    line style the intervention (none solid, sr dotted, rht dashed, dht dash-dot, fht dash-dot-dot,
               combinations their own dash pattern); bars use a hatch per intervention instead
    shade and marker  tell apart configurations that share both (e.g. dht16 and dht64)

A configuration's curve is the geometric mean of perplexity over its seeds at each evaluation (the
mean of the loss), with a min-max band over seeds; a diverged seed's curve ends at its last finite
evaluation, marked with an x.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

GEMM_COLOURS = {
    "": "#7f7f7f",
    "fprop": "#1f77b4",
    "fprop+dgrad": "#2ca02c",
    "fprop+dgrad+wgrad": "#d62728",
    "dgrad": "#9467bd",
    "wgrad": "#8c564b",
    "fprop+wgrad": "#e377c2",
    "dgrad+wgrad": "#bcbd22",
}
BASELINE_COLOUR = "#000000"
LINE_STYLES: dict[str, Any] = {  # dash patterns in units of the line width
    "none": "-",
    "sr": (0, (1, 1.5)),
    "rht": (0, (4, 2)),
    "dht": (0, (6, 2, 1, 2)),
    "fht": (0, (6, 2, 1, 2, 1, 2)),
    "sr+rht": (0, (2, 1)),
    "sr+dht": (0, (10, 2)),
    "sr+fht": (0, (10, 2, 1, 2, 1, 2, 1, 2)),
}
HATCHES = {
    "none": "",
    "sr": "..",
    "rht": "//",
    "dht": "\\\\",
    "fht": "xx",
    "sr+rht": "++",
    "sr+dht": "oo",
}
MARKERS = [None, "o", "s", "^", "D", "v", "P"]
SHADES = [0.0, 0.45, -0.4, 0.25, -0.2, 0.6, -0.55]  # toward white (+) or black (-)
MAX_POINTS = 400  # per plotted curve; more adds file size, not information


def _kind(intervention: str) -> str:
    """``sr+rht64`` -> ``sr+rht``: the style ignores the Hadamard size."""
    return "+".join(p.rstrip("0123456789") for p in intervention.split("+"))


def _shade(colour: str, amount: float) -> tuple[float, float, float]:
    """Lighten (amount > 0, toward white) or darken (amount < 0, toward black)."""
    rgb = np.array(mcolors.to_rgb(colour))
    out = rgb + (1 - rgb) * amount if amount >= 0 else rgb * (1 + amount)
    return (float(out[0]), float(out[1]), float(out[2]))


def styles(config_table: Any) -> dict[str, dict[str, Any]]:
    """Per config: colour, linestyle, hatch, marker (in the config table's order)."""
    out: dict[str, dict[str, Any]] = {}
    seen: dict[Any, int] = {}
    for r in config_table.to_dict("records"):
        gemms = "+".join(g for g in r["fp4_gemms"].replace(",", "+").split("+") if g)
        colour = BASELINE_COLOUR if r["baseline"] else GEMM_COLOURS.get(gemms, "#17becf")
        kind = _kind(r["intervention"])
        n_colour = seen.get(colour, 0)  # k-th config of this colour: its shade
        n_style = seen.get((colour, kind), 0)  # k-th of this colour and style: its marker
        seen[colour], seen[(colour, kind)] = n_colour + 1, n_style + 1
        shade = (
            SHADES[n_colour % len(SHADES)] if colour != BASELINE_COLOUR else 0.55 * min(n_colour, 1)
        )
        out[r["config"]] = {
            "color": _shade(colour, shade),
            "linestyle": LINE_STYLES.get(kind, (0, (2, 2))),
            "hatch": HATCHES.get(kind, "--"),
            "marker": MARKERS[n_style % len(MARKERS)],
        }
    return out


def curves(cell_table: Any, evals: Any) -> dict[str, Any]:
    """Per config, a DataFrame (tokens, ppl, lo, hi, n): geometric-mean perplexity over seeds at each
    evaluation with the min-max band, from cleaned evaluations (``metrics.clean_evals``); each cell's
    curve stops at its first non-finite loss."""
    ev = evals.loc[:, ["key", "tokens", "ppl"]]
    bad = (~np.isfinite(ev["ppl"].to_numpy())).astype(int)
    after_bad = ev.assign(bad=bad).groupby("key", sort=False)["bad"].cumsum().to_numpy() > 0
    ev = ev[~after_bad]
    ev = ev.assign(
        config=ev["key"].map(cell_table.set_index("key")["config"]),
        logp=np.log(ev["ppl"].to_numpy()),
    )
    agg = ev.groupby(["config", "tokens"], sort=True)["logp"].agg(["mean", "min", "max", "count"])
    out = {}
    for cfg, sub in agg.groupby(level="config", sort=False):
        tokens = sub.index.get_level_values("tokens").to_numpy(dtype=float)
        out[str(cfg)] = {
            "tokens": tokens,
            "ppl": np.exp(sub["mean"].to_numpy()),
            "lo": np.exp(sub["min"].to_numpy()),
            "hi": np.exp(sub["max"].to_numpy()),
            "n": sub["count"].to_numpy(),
        }
    return out


def _thin(n: int, limit: int = MAX_POINTS) -> np.ndarray:
    return (
        np.unique(np.linspace(0, n - 1, min(n, limit)).round().astype(int)) if n else np.arange(0)
    )


def _legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str]) -> None:
    longest = max((len(s) for s in labels), default=0)
    ncol = 1 if longest > 60 else 2 if longest > 28 else 3
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=ncol,
        frameon=False,
        fontsize=8,
        handlelength=5,
    )


def _figure(n_entries: int, ncol_guess: int = 2) -> Figure:
    rows = math.ceil((n_entries + 1) / ncol_guess)
    return Figure(figsize=(9, 5.0 + 0.22 * rows), layout="constrained")


def plot_convergence(
    config_table: Any,
    cell_table: Any,
    data: dict[str, Any],
    target_ppl: float,
    *,
    late: float | None = None,
    title: str = "",
) -> Figure:
    """Validation perplexity against tokens, one line per config (``data`` from ``curves``).

    ``late``: show only the last part of training from this fraction of the longest run's tokens
    (e.g. 0.5), with linear axes and a y-range fitted to the curves near the target. Otherwise log-y
    when perplexity spans more than a decade, log-x when tokens span more than two.
    """
    st = styles(config_table)
    baseline = config_table.loc[config_table["baseline"], "config"].iloc[0]
    fig = _figure(len(config_table))
    ax = fig.add_subplot()
    t_max = max((float(d["tokens"].max()) for d in data.values() if len(d["tokens"])), default=1.0)
    t_min = late * t_max if late is not None else -math.inf
    handles, labels, in_view = [], [], []
    # overlapping bands add up: fainter when there are many configurations
    band_alpha = 0.15 if len(config_table) <= 5 else max(0.06, 0.75 / len(config_table))
    for cfg in config_table["config"]:
        s = st[cfg]
        d = data.get(cfg)
        if d is None or not len(d["tokens"]):
            handles.append(
                Line2D([], [], color=s["color"], linestyle=s["linestyle"], marker=s["marker"])
            )
            labels.append(f"{cfg} (no evaluations)")
            continue
        keep = (
            np.flatnonzero(d["tokens"] >= t_min)
            if late is not None
            else np.arange(len(d["tokens"]))
        )
        if late is None:
            keep = keep[d["tokens"][keep] > 0]  # a step-0 evaluation has no place on a log axis
        idx = keep[_thin(len(keep))]
        t, p = d["tokens"][idx], d["ppl"][idx]
        if len(idx) and d["n"].max() > 1:
            ax.fill_between(
                t, d["lo"][idx], d["hi"][idx], color=s["color"], alpha=band_alpha, linewidth=0
            )
        (line,) = ax.plot(
            t, p, color=s["color"], linestyle=s["linestyle"], linewidth=1.6, marker=s["marker"],
            markevery=0.1, markersize=4,
        )  # fmt: skip
        handles.append(line)
        labels.append(cfg + (" (baseline)" if cfg == baseline else ""))
        in_view.append((p, d["lo"][idx]))
    for r in cell_table[cell_table["outcome"] == "diverged"].to_dict("records"):
        d = data.get(r["config"])
        if r["n_evals"] and d is not None and r["last_tokens"] >= t_min:
            ppl = r["final_ppl"]
            ax.plot(
                [r["last_tokens"]], [ppl], marker="x", color=st[r["config"]]["color"], markersize=8
            )
    ax.axhline(target_ppl, color="#555555", linestyle=(0, (4, 3)), linewidth=1)
    handles.append(Line2D([], [], color="#555555", linestyle=(0, (4, 3)), linewidth=1))
    labels.append(f"target ppl {target_ppl:.4g}")
    if any(r["outcome"] == "diverged" for r in cell_table.to_dict("records")):
        handles.append(Line2D([], [], color="#555555", marker="x", linestyle="none"))
        labels.append("diverged seed (last finite evaluation)")

    all_p = np.concatenate([p for p, _ in in_view]) if in_view else np.array([target_ppl])
    all_lo = np.concatenate([lo for _, lo in in_view]) if in_view else np.array([target_ppl])
    if late is None:
        if all_p.max() / max(all_p.min(), 1e-12) > 10:
            ax.set_yscale("log")
        positive = [d["tokens"][d["tokens"] > 0] for d in data.values()]
        firsts = [float(x.min()) for x in positive if len(x)]
        if firsts and t_max / min(firsts) > 100:
            ax.set_xscale("log")
    else:
        lo = min(float(np.nanmin(all_lo)), target_ppl)
        hi = max(float(np.nanquantile(all_p, 0.9)), target_ppl)
        pad = 0.06 * (hi - lo) if hi > lo else 0.05 * target_ppl
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlim(t_min, t_max * 1.01)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation perplexity")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    zoom = f" (from {late:.0%} of training)" if late is not None else ""
    ax.set_title((title + ": " if title else "") + f"validation perplexity{zoom}", fontsize=11)
    _legend(fig, handles, labels)
    return fig


def plot_token_cost(config_table: Any, title: str = "") -> Figure:
    """Horizontal bars of relative token cost (%) with 95% intervals; configs that never reached the
    target, or whose baseline never did, are marked in words instead of a bar. An interval far wider
    than the spread of the costs themselves is cut at the axis and ends in an arrowhead."""
    st = styles(config_table)
    rows = config_table.to_dict("records")
    fig = Figure(figsize=(9, 1.3 + 0.42 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    finite = [r for r in rows if math.isfinite(r["rel_token_cost"])]
    points = [0.0] + [100 * r["rel_token_cost"] for r in finite]
    lows = [100 * r["rel_token_cost_lo"] for r in finite if math.isfinite(r["rel_token_cost_lo"])]
    highs = [100 * r["rel_token_cost_hi"] for r in finite if math.isfinite(r["rel_token_cost_hi"])]
    reach = 0.6 * max(max(points) - min(points), 5.0)  # how far an interval may stick out
    x_lo = max(min(points + lows), min(points) - reach)
    x_hi = min(max(points + highs), max(points) + reach)
    width = max(x_hi - x_lo, 5.0)  # at least 5 percentage points, also when nothing reached
    labels = []
    for yi, r in zip(y, rows, strict=True):
        s = st[r["config"]]
        name = r["config"] + (" (baseline)" if r["baseline"] else "")
        if r["partial"]:
            name += f"  [{r['seeds_reached']}/{r['seeds_total']} seeds]"
        labels.append(name)
        cost = r["rel_token_cost"]
        if r["rel_token_cost_kind"] == "bound" and math.isfinite(r["rel_token_cost_lo"]):
            lo = max(100 * r["rel_token_cost_lo"], x_lo)
            ax.annotate(
                "",
                xy=(x_hi + 0.1 * width, yi),
                xytext=(lo, yi),
                arrowprops={"arrowstyle": "->", "color": s["color"], "linewidth": 2},
            )
            ax.plot([lo], [yi], marker="|", color=s["color"], markersize=10)
            ax.text(lo, yi + 0.25, f"≥ {100 * r['rel_token_cost_lo']:+.1f}%", fontsize=8)
            continue
        if not math.isfinite(cost):
            if r["seeds_reached"] == 0:
                why = "diverged" if r["n_diverged"] == r["seeds_total"] else "not reached"
                if math.isfinite(r["best_ppl"]):
                    why += f" (best ppl {r['best_ppl']:.4g})"
            else:
                why = "no cost: the baseline never reached the target"
            ax.text(
                x_lo,
                yi,
                "  " + why,
                va="center",
                ha="left",
                fontsize=8,
                color="#555555",
                style="italic",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},  # over the zero line
            )
            continue
        c = 100 * cost
        ax.barh(
            yi, c, color=s["color"], alpha=0.85, hatch=s["hatch"], edgecolor="white", height=0.7
        )
        lo, hi = 100 * r["rel_token_cost_lo"], 100 * r["rel_token_cost_hi"]
        right = c
        if math.isfinite(lo) and math.isfinite(hi):
            lo_c, hi_c = max(lo, x_lo), min(hi, x_hi)
            ax.errorbar(
                c, yi, xerr=[[c - lo_c], [hi_c - c]], color="#222222", capsize=3, linewidth=1
            )
            for end, cut, marker in ((lo_c, lo < x_lo, "<"), (hi_c, hi > x_hi, ">")):
                if cut:
                    ax.plot([end], [yi], marker=marker, color="#222222", markersize=5)
            right = hi_c
        text = "reference" if r["baseline"] else f"{c:+.1f}%"
        ax.text(max(right, c, 0) + 0.015 * width, yi, text, va="center", fontsize=8)
    ax.axvline(0, color="#000000", linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)  # rows without a bar (text only) do not autoscale
    ax.set_xlim(x_lo - 0.05 * width, x_hi + 0.15 * width)
    ax.set_xlabel(
        "relative token cost to target vs baseline (%), 95% interval over seeds\n"
        "(censored estimate; a lone arrow: a lower bound only)"
    )
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(
        (title + ": " if title else "") + "tokens to target relative to the baseline", fontsize=11
    )
    return fig


def plot_equal_loss(
    config_table: Any, ratio_curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str = ""
) -> Figure:
    """The equal-loss token ratio over training per configuration (``equal_loss.ratio_curve``):
    tokens the configuration used / tokens the baseline needed for the same validation loss."""
    st = styles(config_table)
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    for r in config_table.to_dict("records"):
        if r["baseline"] or r["config"] not in ratio_curves:
            continue
        tok, ratio = ratio_curves[r["config"]]
        if not len(tok):
            continue
        s = st[r["config"]]
        ax.plot(
            tok, ratio, color=s["color"], linestyle=s["linestyle"], marker=s["marker"],
            markersize=3, label=r["config"],
        )  # fmt: skip
    ax.axhline(1.0, color=BASELINE_COLOUR, linewidth=0.8, label="baseline")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("equal-loss token ratio (> 1: needs more tokens than the baseline)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(
        (title + ": " if title else "") + "tokens for the same loss vs baseline", fontsize=11
    )
    return fig


def save(fig: Figure, out_dir: Path, name: str, dpi: int = 150) -> dict[str, Path]:
    """Write ``name.png`` (``dpi``) and ``name.svg`` (text kept as text) into ``out_dir``."""
    paths = {"png": out_dir / f"{name}.png", "svg": out_dir / f"{name}.svg"}
    fig.savefig(paths["png"], dpi=dpi)
    with _svg_text():
        fig.savefig(paths["svg"])
    return paths


def _svg_text() -> Any:
    import matplotlib

    return matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "ablate"})
