"""Tokens to target, per cell and per configuration (pure functions over tidy DataFrames).

The input contract (``cells`` and ``evals``) is documented and checked in ``ablate.report.inputs``.

Perplexity is exp(val_loss). Tokens to target is the first crossing of the target perplexity,
interpolated linearly in log-perplexity (= in loss) between the two bracketing evaluations. Per
configuration, means are over the seeds that reached the target; diverged seeds never count, even if
they crossed before diverging. The relative token cost's interval is documented in ``stats``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import pandas as pd

from ..errors import ReportError
from ..spec.speedup import ROLES, SpeedupSpec
from ..targets import tokens_to_target
from .inputs import _CLEAN, check_inputs, clean_evals, curves
from .speedup import projected_speedup, role_formats, throughput_gain
from .stats import ratio_interval

OUTCOMES = ("reached", "not reached", "diverged", "incomplete", "no evals")

__all__ = [
    "resolve_target", "clean_evals", "per_cell", "per_config", "report_notes", "config_sort_key",
    "check_inputs",
]  # fmt: skip


class TargetLike(Protocol):
    """The study's target: exactly one of val_ppl, val_loss, from_baseline is set."""

    val_ppl: float | None
    val_loss: float | None
    from_baseline: str | None
    tolerance: float


def per_cell(cells: Any, evals: Any, target_ppl: float) -> Any:
    """One row per cell: the ``cells`` columns plus n_evals, last_step, last_tokens, tokens_to_target
    (NaN unless reached), reached, outcome (reached | not reached | diverged | incomplete | no evals),
    best_ppl and final_ppl (over finite evaluations before any divergence), and diverged_at filled
    from the first non-finite evaluation when the status did not give it."""
    check_inputs(cells, evals)
    ev = evals if evals.attrs.get(_CLEAN) else clean_evals(cells, evals)
    found: dict[str, dict[str, Any]] = {}
    for key, step, tok, ppl in curves(ev):
        bad = np.flatnonzero(~np.isfinite(ppl))
        end = int(bad[0]) if bad.size else len(ppl)  # the curve stops at the first non-finite loss
        nonfinite_at = float(step[end]) if bad.size else math.nan
        step, tok, ppl = step[:end], tok[:end], ppl[:end]
        found[key] = {
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
                "reached": outcome == "reached",
                "outcome": outcome,
                "best_ppl": f.get("best_ppl", math.nan),
                "final_ppl": f.get("final_ppl", math.nan),
            }
        )
    return pd.DataFrame(rows)


def _target_fields(target: TargetLike | Mapping[str, Any]) -> tuple[Any, Any, Any, float]:
    def get(name: str) -> Any:
        return target.get(name) if isinstance(target, Mapping) else getattr(target, name, None)

    tolerance = get("tolerance")
    return get("val_ppl"), get("val_loss"), get("from_baseline"), float(tolerance or 0.0)


def describe_target(target: TargetLike | Mapping[str, Any]) -> str:
    """The target as the study wrote it, e.g. ``val_ppl: 3.3`` or ``from_baseline: final (+1%)``."""
    val_ppl, val_loss, from_baseline, tolerance = _target_fields(target)
    if val_ppl is not None:
        return f"val_ppl: {val_ppl:g}"
    if val_loss is not None:
        return f"val_loss: {val_loss:g}"
    tol = f" x (1 + {tolerance:g})" if tolerance else ""
    return f"from_baseline: {from_baseline} (baseline mean {from_baseline} perplexity{tol})"


def resolve_target(target: TargetLike | Mapping[str, Any], evals: Any, cells: Any) -> float:
    """The target perplexity: absolute (``val_ppl``, or exp(``val_loss``)) or the baseline's mean final
    (or best) perplexity over its finished, non-diverged runs, times (1 + ``tolerance``)."""
    val_ppl, val_loss, from_baseline, tolerance = _target_fields(target)
    given = [
        n
        for n, v in (("val_ppl", val_ppl), ("val_loss", val_loss), ("from_baseline", from_baseline))
        if v is not None
    ]
    if len(given) != 1:
        raise ReportError(
            f"the target needs exactly one of val_ppl, val_loss, from_baseline; got {', '.join(given) or 'none'}"
        )
    if val_ppl is not None:
        if not (math.isfinite(val_ppl) and val_ppl > 0):
            raise ReportError(f"target val_ppl must be a positive number, got {val_ppl}")
        return float(val_ppl)
    if val_loss is not None:
        if not math.isfinite(val_loss):
            raise ReportError(f"target val_loss must be a finite number, got {val_loss}")
        return math.exp(val_loss)
    if from_baseline not in ("final", "best"):
        raise ReportError(f"target from_baseline must be 'final' or 'best', got {from_baseline!r}")
    if not tolerance > -1:
        raise ReportError(f"target tolerance is relative and must be > -1, got {tolerance}")
    table = per_cell(
        cells, evals, target_ppl=0.0
    )  # a perplexity is never <= 0: no crossings needed
    base = table[table["baseline"].astype(bool)]
    usable = base[
        (base["status"] == "finished") & (base["outcome"] != "diverged") & (base["n_evals"] > 0)
    ]
    if len(usable) == 0:
        counts = ", ".join(f"{n} {s}" for s, n in base["status"].value_counts().items())
        raise ReportError(
            f"the target is the baseline's {from_baseline} perplexity, but the baseline config "
            f"{base['config'].iloc[0]!r} has no finished run with evaluations ({counts}); wait for it "
            "to finish or give an absolute target such as val_ppl: 3.3"
        )
    column = "final_ppl" if from_baseline == "final" else "best_ppl"
    return float(usable[column].mean()) * (1.0 + tolerance)


def config_sort_key(
    fp4_gemms: str, intervention: str, baseline: bool, config: str
) -> tuple[Any, ...]:
    """Baseline first, then by how many GEMMs are FP4 (fprop, dgrad, wgrad order), then intervention."""
    gemms = [g for g in fp4_gemms.replace(",", "+").split("+") if g]
    kinds = ["none", "sr", "rht", "dht", "fht"]
    parts = [p.rstrip("0123456789") for p in intervention.split("+")]
    rank = tuple(kinds.index(p) if p in kinds else len(kinds) for p in parts)
    roles = tuple(ROLES.index(g) if g in ROLES else 3 for g in gemms)
    return (not baseline, len(gemms), roles, len(parts), rank, intervention, config)


def _seeds(sub: Any, outcome: str) -> str:
    rows = sub[sub["outcome"] == outcome]
    if outcome == "diverged":
        return ", ".join(
            f"seed {s} at step {int(d)}" if pd.notna(d) else f"seed {s} (step unknown)"
            for s, d in zip(rows["seed"], rows["diverged_at"], strict=True)
        )
    return ", ".join(f"seed {s} ({st})" for s, st in zip(rows["seed"], rows["status"], strict=True))


def _mean_tps(sub: Any) -> float:
    tps = sub["tokens_per_s"].astype(float)
    tps = tps[np.isfinite(tps)]
    return float(tps.mean()) if len(tps) else math.nan


def per_config(cell_table: Any, speedup: SpeedupSpec | None = None) -> Any:
    """One row per configuration (cells differing only by seed), baseline first.

    Columns: config, baseline, fp4_gemms, intervention, fp4_format, base_format, backend, n_seeds,
    n_reached, n_not_reached, n_diverged, n_incomplete, partial (some seeds did not reach),
    tokens_to_target_mean/std/min/max (over seeds that reached), final_ppl_mean/std (finished,
    non-diverged seeds), best_ppl, rel_token_cost (mean tokens / baseline mean tokens - 1) with its 95%
    interval rel_token_cost_lo/hi (see ``stats``), throughput_gain, speedup_source ("measured" when the
    config and the baseline ran native GEMMs with measured tokens/s, else "model:<device>"),
    projected_speedup (gain / (1 + rel_token_cost)) and note (plain-language flags).
    """
    spec = speedup if speedup is not None else SpeedupSpec()
    groups = {cfg: sub for cfg, sub in cell_table.groupby("config", sort=False)}
    (base_cfg,) = cell_table.loc[cell_table["baseline"].astype(bool), "config"].unique()
    base = groups[base_cfg]
    t_base = base.loc[base["reached"], "tokens_to_target"].astype(float).tolist()
    b0 = base.iloc[0]
    base_native = (base["backend"] == "native").all() and math.isfinite(_mean_tps(base))

    def order(cfg: str) -> tuple[Any, ...]:
        r = groups[cfg].iloc[0]
        return config_sort_key(r["fp4_gemms"], r["intervention"], bool(r["baseline"]), cfg)

    rows = []
    for cfg in sorted(groups, key=order):
        sub = groups[cfg]
        r0 = sub.iloc[0]
        is_base = cfg == base_cfg
        t = sub.loc[sub["reached"], "tokens_to_target"].astype(float).tolist()
        counts = {o: int((sub["outcome"] == o).sum()) for o in OUTCOMES}
        finished = sub[(sub["status"] == "finished") & (sub["outcome"] != "diverged")]
        notes = []
        if not t:
            who = "the baseline" if is_base else "no seed"
            yet = (
                counts["incomplete"] + counts["no evals"] > 0
            )  # still running: "not yet", not "never"
            verb = "has not reached the target yet" if yet else "never reached the target"
            if not is_base:
                verb = "has reached the target yet" if yet else "reached the target"
            best = sub["best_ppl"].min()
            notes.append(f"{who} {verb}" + (f" (best ppl {best:.4g})" if pd.notna(best) else ""))
        elif len(t) < len(sub):
            notes.append(f"{len(t)}/{len(sub)} seeds reached; mean and cost over those")
        if counts["diverged"]:
            notes.append("diverged: " + _seeds(sub, "diverged"))
        if counts["incomplete"] or counts["no evals"]:
            pending = ", ".join(
                s for s in (_seeds(sub, "incomplete"), _seeds(sub, "no evals")) if s
            )
            notes.append("not finished: " + pending)
        if t and not t_base and not is_base:
            notes.append("no relative cost: the baseline never reached the target")

        if is_base:
            cost, lo, hi = (0.0, math.nan, math.nan) if t else (math.nan,) * 3
        else:
            cost, lo, hi = ratio_interval(t, t_base)
        if base_native and (sub["backend"] == "native").all() and math.isfinite(_mean_tps(sub)):
            gain, source = _mean_tps(sub) / _mean_tps(base), "measured"
        else:
            source = spec.source()
            try:
                gain = throughput_gain(
                    role_formats(r0["fp4_gemms"], r0["fp4_format"], r0["base_format"]),
                    role_formats(b0["fp4_gemms"], b0["fp4_format"], b0["base_format"]),
                    spec,
                )
            except ReportError as e:
                gain = math.nan
                notes.append(f"no throughput model: {e}")
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
                "n_seeds": len(sub),
                "n_reached": len(t),
                "n_not_reached": counts["not reached"],
                "n_diverged": counts["diverged"],
                "n_incomplete": counts["incomplete"] + counts["no evals"],
                "partial": 0 < len(t) < len(sub),
                "tokens_to_target_mean": float(np.mean(t)) if t else math.nan,
                "tokens_to_target_std": float(np.std(t, ddof=1)) if len(t) > 1 else math.nan,
                "tokens_to_target_min": min(t) if t else math.nan,
                "tokens_to_target_max": max(t) if t else math.nan,
                "final_ppl_mean": float(finished["final_ppl"].mean())
                if len(finished)
                else math.nan,
                "final_ppl_std": float(finished["final_ppl"].std())
                if len(finished) > 1
                else math.nan,
                "best_ppl": float(sub["best_ppl"].min()),
                "rel_token_cost": cost,
                "rel_token_cost_lo": lo,
                "rel_token_cost_hi": hi,
                "throughput_gain": gain,
                "speedup_source": source,
                "projected_speedup": projected_speedup(gain, cost),
                "note": "; ".join(notes),
            }
        )
    return pd.DataFrame(rows)


def report_notes(config_table: Any, target_ppl: float) -> list[str]:
    """Study-level messages for the top of the report (an unreachable baseline, missing seeds)."""
    notes = []
    base = config_table[config_table["baseline"]].iloc[0]
    if base["n_reached"] == 0:
        best = f" (its best was {base['best_ppl']:.4g})" if pd.notna(base["best_ppl"]) else ""
        if base["n_incomplete"]:
            verb, advice = "has not reached", " until one of its runs does."
            best += f" and {base['n_incomplete']} of its runs have not finished"
        else:
            verb = "never reached"
            advice = (
                ". Choose a target the baseline reaches, for example `from_baseline: final` with a "
                "tolerance."
            )
        notes.append(
            f"The baseline `{base['config']}` {verb} the target perplexity {target_ppl:.4g}{best}, "
            f"so relative token costs and projected speedups are undefined (NaN){advice}"
        )
    elif base["n_reached"] < base["n_seeds"]:
        notes.append(
            f"Only {base['n_reached']}/{base['n_seeds']} baseline seeds reached the target; relative "
            "costs compare with the mean over those."
        )
    most = int(config_table["n_seeds"].max())
    short = config_table[config_table["n_seeds"] < most]
    if len(short):
        listed = ", ".join(
            f"`{c}` ({n})" for c, n in zip(short["config"], short["n_seeds"], strict=True)
        )
        notes.append(f"Some configurations have fewer than {most} seeds: {listed}.")
    return notes
