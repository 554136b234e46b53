"""The report's numbers as MLflow metrics: what ``ablate report`` writes back into each child run
(its own outcome) and into the study's parent run (each configuration's estimates), so that the
MLflow UI's runs table, charts and parallel coordinates show them. Pure functions over the report's
tables (pandas); ``ablate.report.study`` logs them through ``ablate.tracking``.

Per child run (``run_summaries``; a metric is left out where it does not apply):

    final_val_ppl, best_val_ppl   over the evaluations before any divergence
    reached                       1 if the run reached the target perplexity, else 0
    tokens_to_target              where it reached it
    target_ppl                    the target it was judged against
    equal_loss_token_ratio        its tokens at its last evaluation over the tokens the baseline's
                                  seeds needed for the same loss (geometric mean; not for a
                                  baseline run, nor a diverged or unfinished one, nor one that
                                  ended below every baseline seed's lowest loss)
    diverged_at                   the step, for a diverged run

Per configuration, in the parent run (``config_summaries``), as ``<metric>.<name>`` where name is
the configuration's short name (``metric_name``): seeds_reached, seeds_total, rel_token_cost,
equal_loss_token_ratio, projected_speedup, each estimate with ``_lo``/``_hi`` where it has them (an
equal-loss ratio that is only an upper bound: its ``_hi``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ablate.report.equal_loss import final_ratio
from ablate.report.inputs import curves
from ablate.targets import Curve

_CONFIG_METRICS = (
    "seeds_reached",
    "seeds_total",
    "rel_token_cost",
    "rel_token_cost_lo",
    "rel_token_cost_hi",
    "equal_loss_token_ratio",
    "equal_loss_token_ratio_lo",
    "equal_loss_token_ratio_hi",
    "projected_speedup",
    "projected_speedup_lo",
    "projected_speedup_hi",
)


def metric_name(text: str) -> str:
    """A configuration's name as MLflow accepts in a metric key (letters, digits, ``_ - . : /``
    and spaces): ``dht16·fdw/fp8`` -> ``dht16_fdw_fp8``."""
    return re.sub(r"_+", "_", re.sub(r"[^\w.\-:]", "_", text, flags=re.ASCII)).strip("_")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and math.isfinite(float(x))


def run_summaries(cell_table: Any, evals: Any, target_ppl: float) -> dict[str, dict[str, float]]:
    """key -> the summary metrics of that cell's run (module docstring); ``evals`` are the cleaned
    evaluations (``inputs.clean_evals``)."""
    ended = cell_table[(cell_table["status"] == "finished") & (cell_table["outcome"] != "diverged")]
    base_keys = set(ended[ended["baseline"].astype(bool)]["key"])
    base = [
        Curve.of(tok, ppl)
        for key, _, tok, ppl in curves(evals[evals["key"].isin(base_keys)])
        if np.isfinite(ppl).all()
    ]
    curve_of = {key: Curve.of(tok, ppl) for key, _, tok, ppl in curves(evals)}
    out: dict[str, dict[str, float]] = {}
    for r in cell_table.to_dict("records"):
        if r["outcome"] == "no evals":
            continue
        m: dict[str, float] = {"reached": float(r["outcome"] == "reached")}
        if _finite(target_ppl):
            m["target_ppl"] = float(target_ppl)
        for name, col in (("final_val_ppl", "final_ppl"), ("best_val_ppl", "best_ppl")):
            if _finite(r[col]):
                m[name] = float(r[col])
        if _finite(r["tokens_to_target"]):
            m["tokens_to_target"] = float(r["tokens_to_target"])
        if r["outcome"] == "diverged" and _finite(r["diverged_at"]):
            m["diverged_at"] = float(r["diverged_at"])
        done = r["status"] == "finished" and r["outcome"] != "diverged"
        if done and not r["baseline"] and r["key"] in curve_of:
            ratio = final_ratio([curve_of[r["key"]]], base)
            if _finite(ratio.value):
                m["equal_loss_token_ratio"] = ratio.value
        out[r["key"]] = {k: _rounded(k, v) for k, v in m.items()}
    return out


def _rounded(name: str, x: float) -> float:
    """What the UI's table shows: tokens whole, the rest to 4 decimals (summary.csv keeps all)."""
    return float(round(x)) if name in ("tokens_to_target", "diverged_at") else round(x, 4)


def config_summaries(config_table: Any, names: Mapping[str, str]) -> dict[str, float]:
    """The parent run's metrics: ``<metric>.<metric_name(names[config])>`` for each configuration
    and each finite estimate (module docstring); ``names`` maps a configuration to its short name."""
    out: dict[str, float] = {}
    for r in config_table.to_dict("records"):
        name = metric_name(names.get(r["config"], r["config"]))
        bound = r.get("equal_loss_token_ratio_kind") == "bound"
        for col in _CONFIG_METRICS:
            if bound and col == "equal_loss_token_ratio":
                continue  # only an upper bound (_hi): the point under it is not a result to chart
            if _finite(r[col]):
                out[f"{col}.{name}"] = float(r[col])
    return out
