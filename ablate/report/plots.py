"""Figures: convergence curves, a late-stage zoom, and the equal-loss token ratio over training
(the bars of relative token cost and projected speedup per configuration are in ``bars``).

Figures are ``matplotlib.figure.Figure`` objects built without pyplot (so the caller's backend and
figure registry are untouched; saving uses Agg for PNG and the SVG backend for SVG).

Encoding, the same in every figure (Paul Tol's colour-blind-safe palettes):
    colour     a family per set of FP4 GEMMs (fprop: blues, fprop+dgrad: greens, fprop+dgrad+wgrad:
               reds to purples, other subsets their own, no FP4 GEMM: greys, the baseline: black),
               and inside a family one distinct colour per intervention
    line style the intervention (none solid, sr dotted, rht dashed, dht dash-dot, fht dash-dot-dot,
               combinations their own dash pattern); bars use a hatch per intervention instead
    marker     tells apart configurations that still look alike (e.g. dht16 and dht64)

A configuration's curve is the geometric mean of perplexity over its seeds at each evaluation (the
mean of the loss), a marker at each evaluation, with each seed as a thin line (up to three seeds) or
a min-max band over seeds (more); a diverged seed's curve ends at its last finite evaluation, marked
with an x. Token axes read 20k, 1.2M. Every figure takes ``titles=False`` for a paper's caption.
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

from ablate.report.speedup import read_label
from backends.recipes.intervention import label

# Paul Tol's colour-blind-safe palettes: one family per set of FP4 GEMMs, one distinct colour per
# intervention inside it (none first, then in the order the study lists them)
GEMM_FAMILIES = {
    "": ["#888888", "#BBBBBB", "#555555"],
    "fprop": ["#0077BB", "#33BBEE", "#004488", "#77AADD"],
    "fprop+dgrad": ["#009988", "#117733", "#44AA99", "#999933"],
    "fprop+dgrad+wgrad": ["#CC3311", "#EE7733", "#EE3377", "#882255", "#AA4499", "#994455"],
    "dgrad": ["#AA3377", "#CC6677"],
    "wgrad": ["#997700", "#DDAA33"],
    "fprop+wgrad": ["#6699CC", "#004488"],
    "dgrad+wgrad": ["#EECC66", "#997700", "#DDCC77", "#BB5566"],
}
OTHER_FAMILY = ["#17BECF", "#4477AA", "#228833"]
GEMM_COLOURS = {g: family[0] for g, family in GEMM_FAMILIES.items()}
"""The first colour of each family: a set of FP4 GEMMs without an intervention."""
BASELINE_COLOUR = "#000000"
# keyed by the intervention's label without Hadamard sizes (``_kind``): the grammar's words
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
MAX_MARKERS = 40  # a marker at every evaluation up to this many, else at every tenth
SEED_LINES = 3  # up to this many seeds: a thin line per seed; more: a min-max band


def _kind(intervention: str) -> str:
    """``sr+rht64`` -> ``sr+rht``, ``dht`` -> ``dht``: the style ignores the Hadamard size (the
    label read and written again by ``backends.recipes.intervention``, ``sizes=False``)."""
    return label(read_label(intervention), sizes=False)


def _shade(colour: str, amount: float) -> tuple[float, float, float]:
    """Lighten (amount > 0, toward white) or darken (amount < 0, toward black)."""
    rgb = np.array(mcolors.to_rgb(colour))
    out = rgb + (1 - rgb) * amount if amount >= 0 else rgb * (1 + amount)
    return (float(out[0]), float(out[1]), float(out[2]))


def styles(config_table: Any) -> dict[str, dict[str, Any]]:
    """Per config: colour, linestyle, hatch, marker (in the config table's order). The colour is
    the k-th of its GEMM set's family for the k-th intervention seen with that set (the baseline is
    black); the line style and hatch say the intervention again (redundant on purpose: print and
    colour-blind readers); a marker tells apart configurations that still look alike."""
    out: dict[str, dict[str, Any]] = {}
    seen: dict[Any, int] = {}
    for r in config_table.to_dict("records"):
        gemms = "+".join(g for g in r["fp4_gemms"].replace(",", "+").split("+") if g)
        kind = _kind(r["intervention"])
        rgb = mcolors.to_rgb(BASELINE_COLOUR)
        if not r["baseline"]:
            family = GEMM_FAMILIES.get(gemms, OTHER_FAMILY)
            k = seen.get(gemms, 0)
            seen[gemms] = k + 1
            rgb = mcolors.to_rgb(family[k % len(family)])
            if k >= len(family):  # more configurations than colours: darker, then lighter
                rgb = _shade(family[k % len(family)], SHADES[(k // len(family)) % len(SHADES)])
        n_look = seen.get((rgb, kind), 0)
        seen[(rgb, kind)] = n_look + 1
        out[r["config"]] = {
            "color": rgb,
            "linestyle": LINE_STYLES.get(kind, (0, (2, 2))),
            "hatch": HATCHES.get(kind, "--"),
            "marker": MARKERS[n_look % len(MARKERS)],
        }
    return out


def token_formatter() -> Any:
    """Tick labels for a tokens axis: 20k, 1.2M, 3B (``markup.tokens`` without trailing zeros)."""
    from matplotlib.ticker import FuncFormatter

    def fmt(x: float, _pos: Any) -> str:
        if x == 0:
            return "0"
        for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
            if abs(x) >= div:
                return f"{x / div:.3g}{unit}"
        return f"{x:.3g}"

    return FuncFormatter(fmt)


def _tokens_axis(ax: Any) -> None:
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_major_formatter(token_formatter())
    if ax.get_xscale() == "log":
        ax.xaxis.set_minor_formatter(NullFormatter())


def curves(cell_table: Any, evals: Any) -> dict[str, Any]:
    """Per config, arrays (tokens, ppl, lo, hi, n): geometric-mean perplexity over seeds at each
    evaluation with the min-max band, and ``seeds``: each seed's own (tokens, ppl), from cleaned
    evaluations (``metrics.clean_evals``); each cell's curve stops at its first non-finite loss."""
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
            "seeds": [],
        }
    for _key, sub in ev.groupby("key", sort=False):
        cfg = str(sub["config"].iloc[0])
        if cfg in out:
            out[cfg]["seeds"].append(
                (sub["tokens"].to_numpy(dtype=float), sub["ppl"].to_numpy(dtype=float))
            )
    return out


def _thin(n: int, limit: int = MAX_POINTS) -> np.ndarray:
    return (
        np.unique(np.linspace(0, n - 1, min(n, limit)).round().astype(int)) if n else np.arange(0)
    )


TITLE_CHARS = 72
"""A figure's title longer than this breaks after the study's (or rung's) name: a ladder rung's
name alone can be as wide as the figure, and a title wider than it collapses the layout."""


def heading(title: str, what: str) -> str:
    """A figure's title: ``title: what`` on one line, or ``what`` on a line of its own when that
    would be too wide (a name too wide alone breaks after a ``/``)."""
    if not title:
        return what
    if len(title) + len(what) + 2 <= TITLE_CHARS:
        return f"{title}: {what}"
    lines = [""]
    for part in title.split("/"):
        piece = part if not lines[-1] else "/" + part
        if lines[-1] and len(lines[-1]) + len(piece) > TITLE_CHARS:
            lines.append(piece)
        else:
            lines[-1] += piece
    return "\n".join(lines) + ":\n" + what


def legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str]) -> None:
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
    titles: bool = True,
) -> Figure:
    """Validation perplexity against tokens, one line per config (``data`` from ``curves``), a
    marker at each evaluation (every tenth when there are more than ``MAX_MARKERS``). With at most
    ``SEED_LINES`` seeds each seed is a thin line of its own (a min-max band of two or three seeds
    says less than the seeds do); with more, a band.

    ``late``: show only the last part of training from this fraction of the longest run's tokens
    (e.g. 0.5), with linear axes and a y-range fitted to the curves near the target; a curve that
    ends above the frame is labelled at its top edge with its final perplexity. Otherwise log-y
    when perplexity spans more than a decade, log-x when tokens span more than two.
    ``titles``: False leaves the title out (for a paper's own caption).
    """
    st = styles(config_table)
    baseline = config_table.loc[config_table["baseline"], "config"].iloc[0]
    fig = _figure(len(config_table))
    ax = fig.add_subplot()
    t_max = max((float(d["tokens"].max()) for d in data.values() if len(d["tokens"])), default=1.0)
    # a baseline trained past the budget (baseline_extend): the zoom starts from the budget's
    # fraction, and a line marks where every other run ended
    longer = (
        cell_table[cell_table["extended_tokens"].notna()]
        if "extended_tokens" in cell_table
        else cell_table.iloc[:0]
    )
    budget = float(longer["last_tokens"].max()) if len(longer) else t_max
    t_min = late * budget if late is not None else -math.inf
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
        n_seeds = len(d["seeds"])
        if len(idx) and 1 < n_seeds <= SEED_LINES:
            for st_tok, st_ppl in d["seeds"]:
                m = st_tok >= t_min if late is not None else st_tok > 0
                ax.plot(
                    st_tok[m], st_ppl[m], color=s["color"], linestyle=s["linestyle"],
                    linewidth=0.6, alpha=0.55,
                )  # fmt: skip
        elif len(idx) and d["n"].max() > 1:
            ax.fill_between(
                t, d["lo"][idx], d["hi"][idx], color=s["color"], alpha=band_alpha, linewidth=0
            )
        (line,) = ax.plot(
            t, p, color=s["color"], linestyle=s["linestyle"], linewidth=1.6,
            marker=s["marker"] or "o", markevery=1 if len(idx) <= MAX_MARKERS else 0.1,
            markersize=3.5,
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
    if len(longer):
        ax.axvline(budget, color="#555555", linestyle=":", linewidth=1)
        handles.append(Line2D([], [], color="#555555", linestyle=":", linewidth=1))
        labels.append("budget (the baseline trains on past it at its final learning rate)")
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
        top = hi + pad
        ax.set_ylim(lo - pad, top)
        ax.set_xlim(t_min, t_max * 1.01)
        for cfg, line in zip(labels, handles, strict=False):
            t_line = np.asarray(line.get_xdata(), dtype=float)
            p_line = np.asarray(line.get_ydata(), dtype=float)
            if len(p_line) and p_line[-1] > top:  # left the frame: say where it went
                inside = np.flatnonzero(p_line <= top)
                x = float(t_line[inside[-1]] if len(inside) else t_line[0])
                right = x > t_min + 0.6 * (t_max - t_min)
                ax.annotate(
                    f"↑ {cfg.removesuffix(' (baseline)')}: {p_line[-1]:.4g}",
                    xy=(x, top), xytext=(0, -10), textcoords="offset points", fontsize=7,
                    color=line.get_color(), ha="right" if right else "left",
                )  # fmt: skip
    _tokens_axis(ax)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation perplexity")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    zoom = f" (from {late:.0%} of training)" if late is not None else ""
    if titles:
        ax.set_title(heading(title, f"validation perplexity{zoom}"), fontsize=11)
    legend(fig, handles, labels)
    return fig


def plot_equal_loss(
    config_table: Any,
    ratio_curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    title: str = "",
    *,
    titles: bool = True,
) -> Figure:
    """The equal-loss token ratio over training per configuration (``equal_loss.ratio_curve``):
    tokens the configuration used / tokens the baseline needed for the same validation loss. An
    evaluation where every seed was below every baseline seed's lowest loss has only an upper
    bound: its point (the bias-reduced estimate under it) is drawn hollow."""
    st = styles(config_table)
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    any_bounded = False
    for r in config_table.to_dict("records"):
        if r["baseline"] or r["config"] not in ratio_curves:
            continue
        tok, ratio, bounded = ratio_curves[r["config"]]
        if not len(tok):
            continue
        s = st[r["config"]]
        ax.plot(
            tok, ratio, color=s["color"], linestyle=s["linestyle"], marker=s["marker"] or "o",
            markersize=3, label=r["config"],
        )  # fmt: skip
        if bounded.any():
            any_bounded = True
            ax.plot(
                tok[bounded], ratio[bounded], linestyle="none", marker="o", markersize=7,
                markerfacecolor="white", markeredgecolor=s["color"],
            )  # fmt: skip
    if any_bounded:
        ax.plot([], [], linestyle="none", marker="o", markerfacecolor="white",
                markeredgecolor="#555555", label="below every baseline seed's lowest loss "
                "(upper bound only)")  # fmt: skip
    ax.axhline(1.0, color=BASELINE_COLOUR, linewidth=0.8, label="baseline")
    ax.set_xscale("log")
    _tokens_axis(ax)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("equal-loss token ratio (> 1: needs more tokens than the baseline)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if titles:
        ax.set_title(heading(title, "tokens for the same loss vs baseline"), fontsize=11)
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
