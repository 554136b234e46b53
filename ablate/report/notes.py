"""The words beside the numbers: each configuration's notes (seeds that did not reach the target or
diverged, a cost that is only bounded and what was observed instead, losses off the baseline's
curves in the equal-loss ratio, a baseline trained past the budget) and the study-level notes at
the top of the report (pure functions over the tables of ``metrics``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ablate.report.censored import Estimate, Seeds
from ablate.report.equal_loss import Pairing


def _seeds(sub: Any, outcome: str) -> str:
    rows = sub[sub["outcome"] == outcome]
    if outcome == "diverged":
        return ", ".join(
            f"seed {s} at step {int(d)}" if pd.notna(d) else f"seed {s} (step unknown)"
            for s, d in zip(rows["seed"], rows["diverged_at"], strict=True)
        )
    return ", ".join(f"seed {s} ({st})" for s, st in zip(rows["seed"], rows["status"], strict=True))


def not_reached_after(seeds: Seeds, base_median: float) -> float:
    """How far every seed of a configuration that never reached the target trained, in multiples
    of the baseline's median tokens to target (NaN when unknown)."""
    if seeds.reached or not seeds.censored or not base_median > 0:
        return math.nan
    return min(seeds.censored) / base_median


def config_notes(
    sub: Any,
    counts: dict[str, int],
    is_base: bool,
    seeds: Seeds,
    cost: Estimate,
    base_seeds: Seeds,
    after: float,
) -> list[str]:
    """One configuration's notes (``after``: ``not_reached_after``)."""
    notes = []
    base_reached = bool(base_seeds.reached)
    if not seeds.reached:
        who = "the baseline" if is_base else "no seed"
        yet = counts["incomplete"] + counts["no evals"] > 0  # still running: "not yet", not "never"
        verb = "has not reached the target yet" if yet else "never reached the target"
        if not is_base:
            verb = "has reached the target yet" if yet else "reached the target"
        best = sub["best_ppl"].min()
        notes.append(f"{who} {verb}" + (f" (best ppl {best:.4g})" if pd.notna(best) else ""))
        if cost.kind == "bound":
            seen = (
                f"every seed was still above the target after {after:.2f}x the baseline's median "
                "tokens to it; "
                if math.isfinite(after)
                else ""
            )
            notes.append(
                f"cost only bounded: {seen}the 95% lower bound on the cost, from the seeds' "
                f"offsets on their own curves and the baseline's seeds, is {cost.lo:+.1%}"
                + (
                    " (below zero: with so few seeds, this scattered, less cannot be ruled out)"
                    if cost.lo < 0
                    else ""
                )
            )
    elif seeds.censored:
        live = "" if seeds.n == len(sub) else " of those that did not stall"
        notes.append(
            f"{len(seeds.reached)}/{seeds.n} seeds{live} reached; the others are censored at "
            "their last evaluation in the estimate"
        )
    if "stalled" in sub and sub["stalled"].astype(bool).any():
        stalled = ", ".join(str(x) for x in sub.loc[sub["stalled"].astype(bool), "seed"])
        notes.append(
            f"stalled (on a plateau at half its budget; its token cost and tokens to target are "
            f"of the other seeds): seed {stalled}"
        )
    if counts["diverged"]:
        notes.append("diverged: " + _seeds(sub, "diverged"))
    if counts["incomplete"] or counts["no evals"]:
        pending = ", ".join(s for s in (_seeds(sub, "incomplete"), _seeds(sub, "no evals")) if s)
        notes.append("not finished: " + pending)
    if seeds.reached and not base_reached and not is_base:
        notes.append("no relative cost: the baseline never reached the target")
    if cost.kind in ("observed", "censored") and math.isnan(cost.lo) and cost.sigma == 0:
        notes.append("seeds reached the target at identical tokens: no spread, no interval")
    return notes


def late_cost_note(cost: Estimate, ratio: Estimate) -> str | None:
    """The note when the paired equal-loss ratio at the end of training lies above the whole token
    cost interval at the target: the configuration's cost grows after the target, which a token
    cost read there cannot show (``ablate.bench.targets``)."""
    if ratio.method != "paired" or cost.kind not in ("observed", "censored"):
        return None
    if not (math.isfinite(ratio.lo) and math.isfinite(cost.hi)) or ratio.lo <= 1 + cost.hi:
        return None
    return (
        f"pays late: its equal-loss ratio at the end of training, {ratio.value:.3g} "
        f"[{ratio.lo:.3g}, {ratio.hi:.3g}] (paired), lies above the whole token-cost interval at "
        f"the target ({cost.lo:+.1%} to {cost.hi:+.1%}): its cost grows after the target, and the "
        "verdict, read at the target, does not show it"
    )


def off_curve_note(pairing: Pairing, seeds: Sequence[Any], extended: bool) -> str | None:
    """The note when some of a configuration's final losses lie below a baseline seed's lowest
    (``seeds``: the configuration's seed numbers in the pairing's order)."""
    if not pairing.censored:
        return None
    total = len(pairing.off_curve) * pairing.n_base
    off = ", ".join(str(s) for s, ks in zip(seeds, pairing.off_curve, strict=True) if ks)
    longer = ", even after its longer training" if extended else ""
    what = (
        "the ratio is only bounded above"
        if pairing.censored == total
        else "those pairs are censored, the ratio rests on the others and the seeds' offsets"
    )
    return (
        f"equal-loss ratio: {pairing.censored} of {total} (seed, baseline seed) pairs are off the "
        f"baseline's curve (seed {off} ended below a baseline seed's lowest loss{longer}): {what}"
    )


def baseline_notes(sub: Any) -> list[str]:
    """The baseline's notes when its cells trained past the budget (``baseline_extend``): how
    far, any seed that reached the target only after the budget, any that diverged there."""
    if "extended_tokens" not in sub or not sub["extended_tokens"].notna().any():
        return []
    ratio = float((sub["extended_tokens"] / sub["last_tokens"]).max())
    notes = [
        f"trained {ratio:.2f}x the budget (baseline_extend) for the equal-loss ratio; its tokens "
        "to target and the target are read up to the budget, as an ordinary cell's"
    ]
    late = sub[sub["extended_crossing"].notna()]
    for seed, t, b in zip(
        late["seed"], late["extended_crossing"], late["last_tokens"], strict=True
    ):
        notes.append(
            f"seed {seed} reached the target only after the budget (at {t / b:.2f}x it): "
            "censored at the budget in the estimates"
        )
    gone = sub[(sub["outcome"] != "diverged") & sub["diverged_at"].notna()]
    for seed, step in zip(gone["seed"], gone["diverged_at"], strict=True):
        notes.append(
            f"seed {seed} diverged at step {int(step)}, after the budget: up to the budget it is an "
            "ordinary finished run, and its curve up to the divergence serves the equal-loss ratio"
        )
    return notes


def report_notes(config_table: Any, target_ppl: float, *, sequential: bool = False) -> list[str]:
    """Study-level messages for the top of the report (an unreachable baseline, missing seeds;
    ``sequential``: a study of sequential seeds, whose configurations stop when decided)."""
    notes = []
    base = config_table[config_table["baseline"]].iloc[0]
    if base["seeds_reached"] == 0:
        best = f" (its best was {base['best_ppl']:.4g})" if pd.notna(base["best_ppl"]) else ""
        if base["n_incomplete"]:
            verb, advice = "has not reached", " until one of its runs does."
            best += f" and {base['n_incomplete']} of its runs have not finished"
        else:
            verb = "never reached"
            advice = (
                ". Choose a target the baseline reaches, for example the default "
                "`from_baseline: slowest` (every baseline seed reaches it by 75% of its budget)."
            )
        notes.append(
            f"The baseline `{base['config']}` {verb} the target perplexity {target_ppl:.4g}{best}, "
            f"so relative token costs and projected speedups are undefined (NaN){advice}"
        )
    elif base["seeds_reached"] < base["seeds_total"]:
        stalled = int(base.get("seeds_stalled", 0) or 0)
        others = (
            f"{stalled} stalled and {'is' if stalled == 1 else 'are'} left out of every estimate"
            if stalled >= base["seeds_total"] - base["seeds_reached"]
            else "the others are censored at their last evaluation in every comparison"
            + (f" ({stalled} stalled: left out)" if stalled else "")
        )
        notes.append(
            f"Only {base['seeds_reached']}/{base['seeds_total']} baseline seeds reached the target; "
            f"{others}."
        )
    most = int(config_table["seeds_total"].max())
    short = config_table[config_table["seeds_total"] < most]
    if len(short):
        listed = ", ".join(
            f"`{c}` ({n})" for c, n in zip(short["config"], short["seeds_total"], strict=True)
        )
        why = (
            " (sequential seeds: each stopped once its comparison was decided)"
            if sequential
            else ""
        )
        notes.append(f"Some configurations have fewer than {most} seeds: {listed}{why}.")
    return notes
