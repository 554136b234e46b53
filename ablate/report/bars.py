"""Bar figures per configuration: the relative token cost to target and the projected end-to-end
speedup, each with its 95% interval (the encoding of ``plots``: a colour family per set of FP4
GEMMs, a hatch per intervention)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ablate.report.plots import BASELINE_COLOUR, heading, styles


def plot_token_cost(config_table: Any, title: str = "", *, titles: bool = True) -> Figure:
    """Horizontal bars of relative token cost (%) with 95% intervals; configs that never reached the
    target, or whose baseline never did, are marked in words instead of a bar; a bar is hollow when
    some seeds did not reach the target (a censored estimate). An interval far wider than the
    spread of the costs themselves is cut at the axis and ends in an arrowhead."""
    st = styles(config_table)
    rows = config_table.to_dict("records")
    fig = Figure(figsize=(9, 1.3 + 0.42 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    hollow = False
    finite = [r for r in rows if math.isfinite(r["rel_token_cost"])]
    points = [0.0] + [100 * r["rel_token_cost"] for r in finite]
    lows = [100 * r["rel_token_cost_lo"] for r in finite if math.isfinite(r["rel_token_cost_lo"])]
    highs = [100 * r["rel_token_cost_hi"] for r in finite if math.isfinite(r["rel_token_cost_hi"])]
    reach = 0.6 * max(max(points) - min(points), 5.0)  # how far an interval may stick out
    x_lo = max(min(points + lows), min(points) - reach)
    x_hi = min(max(points + highs), max(points) + reach)
    bounds = [  # a lower bound's arrow starts where it was seen and points right: the axis reaches it
        100 * r["rel_token_cost_lo"]
        for r in rows
        if r["rel_token_cost_kind"] == "bound" and math.isfinite(r["rel_token_cost_lo"])
    ]
    x_hi = max([x_hi, *bounds])
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
            after = r.get("not_reached_after", math.nan)
            said = (  # a negative bound, every seed past the baseline's tokens: what was seen
                f"not reached after {after:.2f}x the baseline's tokens"
                if r["rel_token_cost_lo"] < 0 and math.isfinite(after) and after >= 1
                else f"≥ {100 * r['rel_token_cost_lo']:+.1f}%"
            )
            ax.text(lo, yi + 0.25, said, fontsize=8)
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
        if r["partial"]:  # hollow: censored seeds in the estimate
            ax.barh(
                yi, c, facecolor="none", hatch=s["hatch"], edgecolor=s["color"], linewidth=1.5,
                height=0.7,
            )  # fmt: skip
            hollow = True
        else:
            ax.barh(
                yi, c, color=s["color"], alpha=0.85, hatch=s["hatch"], edgecolor="white",
                height=0.7,
            )  # fmt: skip
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
    if hollow:
        from matplotlib.patches import Patch

        fig.legend(
            [Patch(facecolor="#777777", alpha=0.85), Patch(facecolor="none", edgecolor="#777777")],
            ["every seed reached the target", "some seeds did not (censored estimate)"],
            fontsize=8, loc="outside lower center", ncol=2, frameon=False,
        )  # fmt: skip
    if titles:
        ax.set_title(heading(title, "tokens to target relative to the baseline"), fontsize=11)
    return fig


def plot_speedup(config_table: Any, title: str = "", *, titles: bool = True) -> Figure:
    """The projected end-to-end speedup per configuration with its 95% interval, against 1x (the
    baseline); a cost that is only bounded gives an upper bound (a left arrow from it), a
    configuration without a projection is named in words."""
    st = styles(config_table)
    rows = [r for r in config_table.to_dict("records") if not r["baseline"]]
    fig = Figure(figsize=(9, 1.3 + 0.42 * max(len(rows), 1)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    xs = [1.0] + [
        v
        for r in rows
        for v in (r["projected_speedup"], r["projected_speedup_lo"], r["projected_speedup_hi"])
        if math.isfinite(v)
    ]
    x_lo, x_hi = min(min(xs), 0.9), max(max(xs), 1.1)
    pad = 0.08 * (x_hi - x_lo)
    left = max(0.0, x_lo - pad)  # a speedup is positive
    for yi, r in zip(y, rows, strict=True):
        s = st[r["config"]]
        point, lo, hi = r["projected_speedup"], r["projected_speedup_lo"], r["projected_speedup_hi"]
        if math.isfinite(point):
            err = [[point - lo], [hi - point]] if math.isfinite(lo) and math.isfinite(hi) else None
            ax.errorbar(
                point, yi, xerr=err, color=s["color"], marker=s["marker"] or "o", markersize=6,
                capsize=3, linewidth=1.5,
            )  # fmt: skip
            ax.text(point, yi + 0.22, f"{point:.2f}×", fontsize=8, ha="center")
        elif math.isfinite(hi):  # only bounded: at most hi
            ax.annotate(
                "", xy=(left, yi), xytext=(hi, yi),
                arrowprops={"arrowstyle": "->", "color": s["color"], "linewidth": 2},
            )  # fmt: skip
            ax.text(hi, yi + 0.22, f"≤ {hi:.2f}×", fontsize=8, ha="center")
        else:
            ax.text(
                1.0, yi, "  no projection", va="center", fontsize=8, color="#555555",
                style="italic",
            )  # fmt: skip
    ax.axvline(1.0, color=BASELINE_COLOUR, linewidth=0.8)
    ax.set_yticks(y, [r["config"] for r in rows], fontsize=8)
    ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)
    ax.set_xlim(left, x_hi + pad)
    ax.set_xlabel(
        "projected end-to-end speedup vs the baseline (×), 95% interval from the token cost\n"
        "(> 1: faster to the target; a lone arrow: an upper bound only)"
    )
    ax.grid(True, axis="x", alpha=0.3)
    if titles:
        ax.set_title(heading(title, "projected speedup"), fontsize=11)
    return fig
