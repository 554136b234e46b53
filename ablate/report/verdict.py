"""The report's first section: which configurations beat the baseline, which cannot be told apart
from it, which are worse, and whether the study had enough seeds to tell (pure functions).

A configuration's verdict comes from its projected end-to-end speedup's 95% interval (the token
cost's interval carried through gain / (1 + cost)):

    better             the whole interval is above 1x
    worse              the whole interval is below 1x (for a cost that is only bounded below: the
                       largest speedup it allows is below 1x), or it stalls more often than the
                       baseline (``stalls``: Fisher's one-sided exact test, p < 0.05), whatever
                       its cost on the runs that did not stall
    indistinguishable  the interval contains 1x
    undetermined       no interval (too few seeds reached, no spread, no throughput model, the
                       baseline never reached the target), or some seed diverged: an unstable
                       recipe is never called better
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ablate.report import markup
from ablate.report.planner import default_margin, seeds_needed, study_noise
from ablate.report.stalls import STALL_P

VERDICTS = ("better", "indistinguishable", "worse", "undetermined")
HEADINGS = {
    "better": "Faster than the baseline",
    "indistinguishable": "Indistinguishable from the baseline",
    "worse": "Slower than the baseline",
    "undetermined": "Undetermined",
}


def verdict(r: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, why) of one configuration row of ``metrics.per_config``."""
    if r["baseline"]:
        return "baseline", ""
    p = r.get("stall_p", math.nan)
    if isinstance(p, float) and p < STALL_P:
        k, n = r["seeds_stalled"], r["seeds_judged"]
        return "worse", f"stalls more often than the baseline: {k}/{n} seeds, Fisher p = {p:.3f}"
    lo, hi = r["projected_speedup_lo"], r["projected_speedup_hi"]
    kind = r["rel_token_cost_kind"]
    if not math.isfinite(r["throughput_gain"]):
        return "undetermined", "no throughput model for its formats"
    if kind == "none":
        return "undetermined", "no token cost (the baseline or every seed lacks a crossing)"
    if kind == "bound":
        if math.isfinite(hi) and hi < 1:
            return "worse", f"cost at least {markup.pct(r['rel_token_cost_lo'])}"
        return "undetermined", "no seed reached the target: its cost is only bounded"
    if r["n_diverged"]:
        return "undetermined", f"{r['n_diverged']}/{r['seeds_total']} seeds diverged"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undetermined", "no interval (fewer than two reached seeds, or no spread)"
    if lo > 1:
        return "better", ""
    if hi < 1:
        return "worse", ""
    return "indistinguishable", ""


def cost_and_speedup(r: Mapping[str, Any]) -> tuple[str, str]:
    """(token cost, projected speedup) of a configuration row as text with their intervals; a cost
    that is only bounded reads ``at least +X%`` and its speedup ``at most Y×``, unless the bound
    is below zero although every seed trained past the baseline's median tokens to target: then
    what was observed, ``not reached after 1.36x the baseline's tokens``."""
    if r["rel_token_cost_kind"] == "bound":
        lo, after = r["rel_token_cost_lo"], r.get("not_reached_after", math.nan)
        if lo < 0 and math.isfinite(after) and after >= 1:
            cost = f"not reached after {after:.2f}x the baseline's tokens"
        else:
            cost = f"at least {markup.pct(lo)} (95% lower bound)"
        return cost, f"at most {markup.times(r['projected_speedup_hi'])}"
    cost = markup.interval(
        r["rel_token_cost"], r["rel_token_cost_lo"], r["rel_token_cost_hi"], markup.pct
    )
    speed = markup.interval(
        r["projected_speedup"], r["projected_speedup_lo"], r["projected_speedup_hi"], markup.times
    )
    return cost, speed


def ratio_text(r: Mapping[str, Any]) -> str:
    """The equal-loss ratio of a configuration row as text: ``1.07 [0.95, 1.21]`` (with
    ``(censored)`` when some pairs were), or ``≤ 1.15 (95% upper bound)`` when every pair was
    (``equal_loss``: a bound is the only kind printed as one)."""
    kind = r["equal_loss_token_ratio_kind"]
    if kind == "bound":
        hi = r["equal_loss_token_ratio_hi"]
        return f"≤ {markup.ratio(hi)} (95% upper bound)" if math.isfinite(hi) else "–"
    text = markup.interval(
        r["equal_loss_token_ratio"],
        r["equal_loss_token_ratio_lo"],
        r["equal_loss_token_ratio_hi"],
        markup.ratio,
    )
    text += " (censored)" if kind == "censored" else ""
    method = r.get("equal_loss_token_ratio_method")
    return text + (f" ({method})" if isinstance(method, str) and method else "")


def _item(r: Mapping[str, Any], why: str) -> str:
    cost, speed = cost_and_speedup(r)
    ratio = ratio_text(r)
    seeds = f"{r['seeds_reached']}/{r['seeds_total']} seeds reached"
    parts = [f"speedup {speed}", f"token cost {cost}", f"equal-loss ratio {ratio}", seeds]
    return f"`{r['config']}`: " + ", ".join(parts) + (f" ({why})" if why else "")


def power_note(config_table: Any) -> str | None:
    """How wide the study's intervals are, and how many seeds would decide its comparisons at
    80% power (``planner``), from the noise the study measured: the paired residual sd (median
    over its paired comparisons; else the unpaired seed noise) and its stall rate. The margin is
    the median break-even cost of the configurations' step-throughput gains."""
    rows = config_table[~config_table["baseline"].astype(bool)]
    if len(rows) == 0:
        return None
    widths = [
        (hi - lo) / 2
        for lo, hi in zip(rows["rel_token_cost_lo"], rows["rel_token_cost_hi"], strict=True)
        if math.isfinite(lo) and math.isfinite(hi)
    ]
    n = int(config_table["seeds_total"].min())
    noise = study_noise(config_table)
    if noise is None:
        return (
            f"With {n} seed{'s' if n != 1 else ''} per configuration no seed noise could be "
            "estimated, so no configuration has an interval: run 3 or more seeds."
        )
    now = (
        f"the relative-cost intervals span about ±{sorted(widths)[len(widths) // 2]:.0%}"
        if widths
        else "no relative cost has an interval"
    )
    margins = sorted(
        m for m in (default_margin(g) for g in rows["throughput_gain"]) if math.isfinite(m)
    )
    if not margins:
        plan = ""
    else:
        margin = margins[len(margins) // 2]
        need = seeds_needed(margin, noise, len(config_table))
        plan = (
            f"; deciding a break-even of {math.expm1(margin):+.0%} tokens at 80% power takes "
            + (f"{need} seeds per configuration" if need else "more than 10,000 seeds")
        )
    judged = int(config_table["seeds_judged"].sum())
    stalls = (
        f", {int(config_table['seeds_stalled'].sum())} of {judged} runs stalled" if judged else ""
    )
    return (
        f"With {n} seed{'s' if n != 1 else ''} per configuration {now}{plan} (from the seed "
        f"noise measured here, σ = {noise.sigma:.3f} in log tokens to target, the "
        f"{noise.source}{stalls}; `ablate plan --noise-from` plans each comparison)."
    )


def verdict_lines(config_table: Any) -> tuple[str, list[str]]:
    """(lead paragraph, bullet items) of the Verdict section."""
    groups: dict[str, list[str]] = {v: [] for v in VERDICTS}
    base = ""
    for r in config_table.to_dict("records"):
        v, why = verdict(r)
        if v == "baseline":
            base = r["config"]
            continue
        groups[v].append(_item(r, why))
    source = sorted(set(config_table["speedup_source"]))
    lead = (
        f"Against the baseline `{base}`: the projected end-to-end speedup is step-throughput gain / "
        f"(1 + relative token cost), with the 95% interval of the token cost (gain: "
        f"{', '.join(source)}). Token cost is the censored estimate of median tokens to target "
        "relative to the baseline's; the equal-loss ratio compares the losses at the end of "
        "training."
    )
    items = []
    for v in VERDICTS:
        if groups[v] or v != "undetermined":
            body = "; ".join(groups[v]) if groups[v] else "none"
            items.append(f"**{HEADINGS[v]}**: {body}")
    note = power_note(config_table)
    if note:
        items.append(f"**Seeds**: {note}")
    return lead, items
