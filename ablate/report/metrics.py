"""Tokens to target, per cell and per configuration (pure functions over tidy DataFrames).

The input contract (``cells`` and ``evals``) is documented and checked in ``ablate.report.inputs``.

Perplexity is exp(val_loss). Tokens to target is the first crossing of the target perplexity,
interpolated linearly in log-perplexity (= in loss) between the two bracketing evaluations. Per
configuration, seeds that did not reach the target are right-censored at their last evaluation,
never dropped (``censored``: the estimates, their intervals and kinds); diverged seeds are failures
in the success rate. The equal-loss token ratio is in ``equal_loss``, the speedup model in
``speedup``, the notes in ``notes``.

A baseline trained past the study's budget (``baseline_extend``; the cells' ``schedule_steps``)
counts as an ordinary cell up to the end of its schedule: tokens to target, its last tokens, best
and final perplexity, and a target derived from it come from that part of its curve, which is an
ordinary cell's bit for bit. The rest of its curve serves the equal-loss ratio.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import pandas as pd

from ablate.errors import ReportError
from ablate.report.censored import NONE, Estimate, Seeds, tokens_estimate
from ablate.report.equal_loss import (
    paired_ratio,
    paired_ratio_curve,
    ratio_at,
    ratio_curve,
    seed_offsets,
)
from ablate.report.inputs import CLEAN, budget_steps, check_inputs, clean_evals, curves
from ablate.report.notes import (
    baseline_notes,
    config_notes,
    late_cost_note,
    not_reached_after,
    off_curve_note,
    report_notes,
)
from ablate.report.paired import paired_costs
from ablate.report.speedup import (
    projected_speedup,
    read_label,
    recipe_gain,
)
from ablate.report.stalls import stall_flags, stall_rate
from ablate.study.speedup import ROLES, SpeedupSection
from ablate.targets import (
    DEFAULT_AT,
    TARGET_FIELDS,
    Curve,
    target_fields,
    target_ppl_of,
    tokens_to_target,
)
from backends.recipes.intervention import label

OUTCOMES = ("reached", "not reached", "diverged", "incomplete", "no evals")

__all__ = [
    "resolve_target", "clean_evals", "per_cell", "per_config", "report_notes", "config_sort_key",
    "check_inputs", "equal_loss_curves", "baseline_curves",
]  # fmt: skip


class TargetLike(Protocol):
    """The study's target: exactly one of val_ppl, val_loss, from_baseline is set."""

    val_ppl: float | None
    val_loss: float | None
    from_baseline: str | None
    tolerance: float
    at: float | None


def per_cell(cells: Any, evals: Any, target_ppl: float) -> Any:
    """One row per cell: the ``cells`` columns plus n_evals, last_step, last_tokens, tokens_to_target
    (NaN unless reached), crossed_tokens (the crossing before any divergence, also for a diverged
    run: what the censored estimate uses), reached, outcome (reached | not reached | diverged | incomplete | no evals),
    stalled and stall_judged (``stalls``: a finished run judged stalled, and whether it could be
    judged), best_ppl and final_ppl (over finite evaluations before any divergence), and diverged_at filled
    from the first non-finite evaluation when the status did not give it. For a cell trained past
    its budget all of these are of the part up to it (module docstring); extended_tokens is where
    it ended and extended_crossing where it reached the target if only after the budget (NaN
    otherwise)."""
    check_inputs(cells, evals)
    ev = evals if evals.attrs.get(CLEAN) else clean_evals(cells, evals)
    budget = budget_steps(cells)
    stalls = stall_flags(cells, ev)
    found: dict[str, dict[str, Any]] = {}
    for key, step, tok, ppl in curves(ev):
        bad = np.flatnonzero(~np.isfinite(ppl))
        end = int(bad[0]) if bad.size else len(ppl)  # the curve stops at the first non-finite loss
        nonfinite_at = float(step[end]) if bad.size else math.nan
        step, tok, ppl = step[:end], tok[:end], ppl[:end]
        extension: dict[str, Any] = {}
        if key in budget:  # trained past its budget: the part up to it is an ordinary cell's
            ordinary = int(np.searchsorted(step, budget[key], side="right"))
            if ordinary < end:
                later = tokens_to_target(tok, ppl, target_ppl)
                extension = {"extended_tokens": tok[-1], "extended_crossing": later}
            step, tok, ppl = step[:ordinary], tok[:ordinary], ppl[:ordinary]
            end = ordinary
        found[key] = {
            **extension,
            "n_evals": end,
            "last_step": step[-1] if end else math.nan,
            "last_tokens": tok[-1] if end else math.nan,
            "best_ppl": float(ppl.min()) if end else math.nan,
            "final_ppl": float(ppl[-1]) if end else math.nan,
            "nonfinite_at": nonfinite_at,
            "crossing": tokens_to_target(tok, ppl, target_ppl) if end else None,
        }
    rows = []
    for cell in cells.to_dict("records"):
        f = found.get(cell["key"], {})
        if not isinstance(cell["fp4_gemms"], str):  # an empty string read back from a file is NaN
            cell["fp4_gemms"] = ""
        diverged_at = (
            float(cell["diverged_at"])
            if pd.notna(cell["diverged_at"])
            else f.get("nonfinite_at", math.nan)
        )
        diverged = cell["status"] == "diverged" or not math.isnan(f.get("nonfinite_at", math.nan))
        if diverged and diverged_at > budget.get(cell["key"], math.inf):
            diverged = False  # in the extension past the budget: up to it, a run that finished
            cell = {**cell, "status": "finished"}
        crossing = f.get("crossing")
        if diverged:
            outcome = "diverged"
        elif crossing is not None:
            outcome = "reached"
        elif not f.get("n_evals"):
            outcome = "no evals"
        elif cell["status"] == "finished":
            outcome = "not reached"
        else:
            outcome = "incomplete"
        rows.append(
            {
                **cell,
                "diverged_at": diverged_at,
                "n_evals": int(f.get("n_evals", 0)),
                "last_step": f.get("last_step", math.nan),
                "last_tokens": f.get("last_tokens", math.nan),
                "tokens_to_target": crossing if outcome == "reached" else math.nan,
                "crossed_tokens": crossing if crossing is not None else math.nan,
                "reached": outcome == "reached",
                "outcome": outcome,
                "best_ppl": f.get("best_ppl", math.nan),
                "final_ppl": f.get("final_ppl", math.nan),
                "stalled": stalls.get(cell["key"], False),
                "stall_judged": cell["key"] in stalls,
                "extended_tokens": f.get("extended_tokens", math.nan),
                "extended_crossing": (
                    f["extended_crossing"]
                    if crossing is None and f.get("extended_crossing") is not None
                    else math.nan
                ),
            }
        )
    return pd.DataFrame(rows)


def describe_target(target: TargetLike | Mapping[str, Any]) -> str:
    """The target as the study wrote it, e.g. ``val_ppl: 3.3`` or ``from_baseline: final (+1%)``."""
    f = target_fields(target)
    val_ppl, val_loss, from_baseline, tolerance, at = (f[n] for n in TARGET_FIELDS)
    if val_ppl is not None:
        return f"val_ppl: {val_ppl:g}"
    if val_loss is not None:
        return f"val_loss: {val_loss:g}"
    tol = f" x (1 + {tolerance:g})" if tolerance else ""
    if from_baseline == "slowest":
        frac = DEFAULT_AT if at is None else at
        return (
            f"from_baseline: slowest, at: {frac:g} (the lowest perplexity that every baseline "
            f"seed reaches within {frac:.0%} of its budget{tol})"
        )
    if from_baseline == "median":
        frac = DEFAULT_AT if at is None else at
        return (
            f"from_baseline: median, at: {frac:g} (the perplexity the median baseline seed "
            f"reaches within {frac:.0%} of its budget{tol})"
        )
    return f"from_baseline: {from_baseline} (baseline mean {from_baseline} perplexity{tol})"


def baseline_curves(cells: Any, evals: Any) -> list[Curve]:
    """The baseline's finished, non-diverged seeds' validation curves (tokens, perplexity) up to the
    budget (a baseline trained past it: the end of its schedule), cut at the first non-finite
    evaluation, less the seeds that stalled (``stalls``) unless every one of them did: what a
    target derived from the baseline is computed from."""
    ev = evals if evals.attrs.get(CLEAN) else clean_evals(cells, evals)
    flags = stall_flags(cells, ev)
    kept = cells[~cells["key"].map(lambda k: flags.get(k, False))]
    if (kept["baseline"].astype(bool) & (kept["status"] == "finished")).any():
        cells = kept
    budget = budget_steps(cells)
    late = cells["key"].map(budget).astype(float) < cells["diverged_at"].astype(float)
    done = (cells["status"] == "finished") | ((cells["status"] == "diverged") & late)
    keep = set(cells[cells["baseline"].astype(bool) & done]["key"])
    out = []
    for key, step, tok, ppl in curves(ev[ev["key"].isin(keep)]):
        ordinary = step <= budget.get(key, np.inf)
        if np.isfinite(ppl[ordinary]).all():  # a NaN loss: diverged, whatever its status says
            out.append(Curve.of(tok[ordinary], ppl[ordinary]))
    return out


def resolve_target(target: TargetLike | Mapping[str, Any], evals: Any, cells: Any) -> float:
    """The target perplexity by ``ablate.targets.target_ppl`` (the rule tune shares): absolute, or
    from the baseline's finished, non-diverged seeds that did not stall (``stalls``: a seed on a
    plateau would set a target that measures when it left the plateau); ReportError when it cannot
    be resolved."""
    from_baseline = target_fields(target)["from_baseline"]
    base = baseline_curves(cells, evals) if from_baseline is not None else []
    try:
        return target_ppl_of(target, base)
    except ValueError as e:
        if from_baseline is None or base:
            raise ReportError(str(e)) from None
        b = cells[cells["baseline"].astype(bool)]
        counts = ", ".join(f"{n} {s}" for s, n in b["status"].value_counts().items())
        raise ReportError(
            f"the target is derived from the baseline ({from_baseline}), but the baseline config "
            f"{b['config'].iloc[0]!r} has no finished run with evaluations ({counts}); wait for it "
            "to finish or give an absolute target such as val_ppl: 3.3"
        ) from None


def config_sort_key(
    fp4_gemms: str, intervention: str, baseline: bool, config: str
) -> tuple[Any, ...]:
    """Baseline first, then by how many GEMMs are FP4 (fprop, dgrad, wgrad order), then
    intervention: by its label's parts without Hadamard sizes (``sr+rht64``: sr, rht; read by
    ``backends.recipes.intervention``), how many, then which (none, sr, rht, dht, fht; any other
    part, 4over6, eden or a piece of a per-GEMM label split at its '+', after them)."""
    gemms = [g for g in fp4_gemms.replace(",", "+").split("+") if g]
    kinds = ["none", "sr", "rht", "dht", "fht"]
    parts = label(read_label(intervention), sizes=False).split("+")
    rank = tuple(kinds.index(p) if p in kinds else len(kinds) for p in parts)
    roles = tuple(ROLES.index(g) if g in ROLES else 3 for g in gemms)
    return (not baseline, len(gemms), roles, len(parts), rank, intervention, config)


def _mean_tps(sub: Any) -> float:
    tps = sub["tokens_per_s"].astype(float)
    tps = tps[np.isfinite(tps)]
    return float(tps.mean()) if len(tps) else math.nan


def seeds_of(sub: Any) -> Seeds:
    """A configuration's seeds for the censored estimate: the tokens where each crossed the target
    (also a seed that diverged after crossing: it did get there), the others censored at their last
    finite evaluation (a diverged one at its last finite evaluation before the divergence; a seed
    without evaluations says nothing and is left out)."""
    crossed = sub["crossed_tokens"].astype(float)
    last = sub["last_tokens"].astype(float)
    seed = sub["seed"].astype(int)
    hit = np.isfinite(crossed)
    cut = ~hit & np.isfinite(last) & (last > 0)
    ids = [*seed[hit].tolist(), *seed[cut].tolist()]
    return Seeds.of(
        crossed[hit].tolist(), last[cut].tolist(), ids if len(set(ids)) == len(ids) else None
    )


def _gain(sub: Any, base: Any, spec: SpeedupSection) -> tuple[float, str, str]:
    """(step-throughput gain over the baseline, source, note): measured when both ran native GEMMs
    with measured tokens/s, else the model with each side's interventions."""
    base_native = (base["backend"] == "native").all() and math.isfinite(_mean_tps(base))
    if base_native and (sub["backend"] == "native").all() and math.isfinite(_mean_tps(sub)):
        return _mean_tps(sub) / _mean_tps(base), "measured", ""
    try:
        gain = recipe_gain(sub.iloc[0], base.iloc[0], spec)
    except ReportError as e:
        return math.nan, spec.source(), f"no throughput model: {e}"
    return gain, spec.source(), ""


def per_config(
    cell_table: Any, speedup: SpeedupSection | None = None, evals: Any | None = None
) -> Any:
    """One row per configuration (cells differing only by seed), baseline first. Every estimate is
    of the runs that did not stall (``stalls``); the costs are paired by seed (``paired``).

    Columns: config, baseline, fp4_gemms, intervention, fp4_format, base_format, backend,
    seeds_total, seeds_reached (diverged seeds count as failures), n_not_reached, n_diverged,
    n_incomplete, partial (some seeds did not reach); tokens_to_target with _lo/_hi/_kind (the
    censored log-normal estimate of the median, ``censored``); final_ppl_mean/std (finished,
    non-diverged seeds), best_ppl; rel_token_cost with _lo/_hi/_kind (observed, censored, bound,
    none; the baseline's is ``reference``), _method (``paired``: paired, paired-own, unpaired) and
    _df; seeds_stalled of seeds_judged with the exact interval stall_rate_lo/_hi and stall_p
    (``stalls``: Fisher's one-sided test against the baseline's rate); equal_loss_token_ratio with
    _lo/_hi/_kind (``equal_loss``: observed, censored, bound; needs ``evals``, the cleaned
    evaluations) and _method (paired when two or more seeds are shared with the baseline,
    ``equal_loss.paired_ratio``; else unpaired); not_reached_after (no seed reached: the tokens
    every seed trained, in multiples of the baseline's median tokens to target); throughput_gain,
    speedup_source ("measured" or "model:<device>"), projected_speedup with _lo/_hi (gain / (1 +
    cost) over the cost's interval; no point for a bounded cost, only the upper end); note.
    """
    spec = speedup if speedup is not None else SpeedupSection()
    groups = {cfg: sub for cfg, sub in cell_table.groupby("config", sort=False)}
    (base_cfg,) = cell_table.loc[cell_table["baseline"].astype(bool), "config"].unique()
    base = groups[base_cfg]
    # the runs that stalled are an outcome of their own (``stalls``): every estimate below is of
    # the others
    stall = (
        cell_table["stalled"].astype(bool)
        if "stalled" in cell_table
        else pd.Series(False, index=cell_table.index)
    )
    judged = (
        cell_table["stall_judged"].astype(bool)
        if "stall_judged" in cell_table
        else pd.Series(False, index=cell_table.index)
    )
    live = {cfg: sub[~stall[sub.index]] for cfg, sub in groups.items()}
    live_seeds = {cfg: seeds_of(sub) for cfg, sub in live.items()}
    offsets = {
        cfg: _censored_offsets(evals, live[cfg]) if not live_seeds[cfg].reached else None
        for cfg in groups
    }
    costs = paired_costs(live_seeds, base_cfg, offsets)
    stalls_of = {
        cfg: (int(stall[sub.index].sum()), int(judged[sub.index].sum()))
        for cfg, sub in groups.items()
    }
    base_seeds = live_seeds[base_cfg]
    base_median = tokens_estimate(base_seeds).value
    base_by_key = _curves_by_key(evals, live[base_cfg])
    base_curves = list(base_by_key.values())
    base_by_seed = _by_seed(base_by_key, live[base_cfg])
    extended = bool(base["extended_tokens"].notna().any()) if "extended_tokens" in base else False

    def order(cfg: str) -> tuple[Any, ...]:
        r = groups[cfg].iloc[0]
        return config_sort_key(r["fp4_gemms"], r["intervention"], bool(r["baseline"]), cfg)

    rows = []
    for cfg in sorted(groups, key=order):
        sub = groups[cfg]
        r0 = sub.iloc[0]
        is_base = cfg == base_cfg
        counts = {o: int((sub["outcome"] == o).sum()) for o in OUTCOMES}
        seeds = live_seeds[cfg]
        tokens = tokens_estimate(seeds)
        after = not_reached_after(seeds, base_median)
        if is_base:
            cost = Estimate(0.0, math.nan, math.nan, "reference") if seeds.reached else NONE
        else:
            cost = costs[cfg]
        stalls = stall_rate(*stalls_of[cfg], base=None if is_base else stalls_of[base_cfg])
        off_curve = None
        if is_base:
            ratio = Estimate(1.0, math.nan, math.nan, "reference")
        elif evals is not None:
            mine = _curves_by_key(evals, live[cfg])
            seed_of = dict(zip(sub["key"], sub["seed"], strict=True))
            paired = paired_ratio(_by_seed(mine, live[cfg]), base_by_seed)
            if paired is not None:
                ratio = paired
            else:
                ratio, pairing = ratio_at(list(mine.values()), base_curves)
                ratio = dataclasses.replace(ratio, method="unpaired")
                off_curve = off_curve_note(pairing, [seed_of[k] for k in mine], extended)
        else:
            ratio = NONE
        gain, source, gain_note = _gain(sub, base, spec)
        finished = sub[(sub["status"] == "finished") & (sub["outcome"] != "diverged")]
        notes = config_notes(sub, counts, is_base, seeds, cost, base_seeds, after)
        if is_base:
            notes.extend(baseline_notes(sub))
        if off_curve:
            notes.append(off_curve)
        late = None if is_base else late_cost_note(cost, ratio)
        if late:
            notes.append(late)
        if gain_note:
            notes.append(gain_note)
        backends = sorted(set(sub["backend"]))
        rows.append(
            {
                "config": cfg,
                "baseline": is_base,
                "fp4_gemms": r0["fp4_gemms"],
                "intervention": r0["intervention"],
                "fp4_format": r0["fp4_format"],
                "base_format": r0["base_format"],
                "backend": backends[0] if len(backends) == 1 else "mixed",
                "seeds_total": len(sub),
                "seeds_reached": counts["reached"],
                "n_not_reached": counts["not reached"],
                "n_diverged": counts["diverged"],
                "n_incomplete": counts["incomplete"] + counts["no evals"],
                "partial": 0 < counts["reached"] < len(sub),
                "tokens_to_target": tokens.value,
                "tokens_to_target_lo": tokens.lo,
                "tokens_to_target_hi": tokens.hi,
                "tokens_to_target_kind": tokens.kind,
                "final_ppl_mean": float(finished["final_ppl"].mean())
                if len(finished)
                else math.nan,
                "final_ppl_std": float(finished["final_ppl"].std())
                if len(finished) > 1
                else math.nan,
                "best_ppl": float(sub["best_ppl"].min()),
                "rel_token_cost": cost.value,
                "rel_token_cost_lo": cost.lo,
                "rel_token_cost_hi": cost.hi,
                "rel_token_cost_kind": cost.kind,
                "rel_token_cost_method": cost.method,
                "rel_token_cost_df": cost.df,
                "seeds_stalled": stalls.k,
                "seeds_judged": stalls.n,
                "stall_rate_lo": stalls.lo,
                "stall_rate_hi": stalls.hi,
                "stall_p": stalls.p,
                "log_sigma": cost.sigma,
                "equal_loss_token_ratio": ratio.value,
                "equal_loss_token_ratio_lo": ratio.lo,
                "equal_loss_token_ratio_hi": ratio.hi,
                "equal_loss_token_ratio_kind": ratio.kind,
                "equal_loss_token_ratio_method": ratio.method,
                "not_reached_after": after,
                "throughput_gain": gain,
                "speedup_source": source,
                "projected_speedup": projected_speedup(gain, cost.value),
                "projected_speedup_lo": projected_speedup(gain, cost.hi),
                "projected_speedup_hi": projected_speedup(gain, cost.lo),
                "note": "; ".join(notes),
            }
        )
    return pd.DataFrame(rows)


def equal_loss_curves(cell_table: Any, evals: Any) -> dict[str, tuple[Any, Any, Any]]:
    """Per non-baseline configuration, (tokens, equal-loss ratio, bounded) over training from its
    seeds' curves (diverged ones cut before the divergence) against the baseline's finished
    seeds: seed i against baseline seed i where two or more seeds are shared
    (``equal_loss.paired_ratio_curve``, as the table's paired ratio), else every pair
    (``equal_loss.ratio_curve``). Stalled runs are left out, as from the table's ratio."""
    if "stalled" in cell_table:
        cell_table = cell_table[~cell_table["stalled"].astype(bool)]
    base = cell_table[cell_table["baseline"].astype(bool)]
    base_by_key = _curves_by_key(evals, base)
    base_by_seed = _by_seed(base_by_key, base)
    out = {}
    for cfg, sub in cell_table[~cell_table["baseline"].astype(bool)].groupby("config"):
        mine = {
            key: Curve.of(tok, ppl)
            for key, _, tok, ppl in curves(evals[evals["key"].isin(set(sub["key"]))])
        }
        paired = paired_ratio_curve(_by_seed(mine, sub), base_by_seed)
        out[str(cfg)] = (
            paired
            if paired is not None
            else ratio_curve(list(mine.values()), list(base_by_key.values()))
        )
    return out


def _censored_offsets(evals: Any | None, sub: Any) -> list[float] | None:
    """The offsets (``equal_loss.seed_offsets``) of the seeds ``seeds_of`` censors, in its
    order, from their curves up to their last finite evaluation; None without evaluations."""
    if evals is None:
        return None
    crossed, last = sub["crossed_tokens"].astype(float), sub["last_tokens"].astype(float)
    keys = sub["key"][~np.isfinite(crossed) & np.isfinite(last) & (last > 0)].tolist()
    found = {key: Curve.of(tok, ppl) for key, _, tok, ppl in curves(evals[evals["key"].isin(keys)])}
    if len(found) != len(keys):
        return None
    return [float(x) for x in seed_offsets([found[k] for k in keys])]


def _by_seed(by_key: dict[str, Curve], sub: Any) -> dict[int, Curve]:
    """The curves of ``by_key`` by seed number (``sub``'s rows name each key's seed); empty when a
    seed number repeats, which leaves nothing to pair by."""
    seed_of = dict(zip(sub["key"], sub["seed"].astype(int), strict=True))
    out = {int(seed_of[k]): c for k, c in by_key.items()}
    return out if len(out) == len(by_key) else {}


def _curves_by_key(evals: Any | None, sub: Any) -> dict[str, Curve]:
    """The finished, non-diverged seeds' curves of ``sub`` (per-cell rows), by key."""
    if evals is None:
        return {}
    keep = set(sub[(sub["status"] == "finished") & (sub["outcome"] != "diverged")]["key"])
    # (a baseline seed that diverged only past the budget counts as finished: its curve up to the
    # divergence, which Curve.of cuts at)
    return {key: Curve.of(tok, ppl) for key, _, tok, ppl in curves(evals[evals["key"].isin(keep)])}
