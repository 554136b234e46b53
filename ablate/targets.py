"""Tokens to a target perplexity, and the target itself: the one definition that the report,
``ablate tune`` and the validate/plan headroom warning share.

Perplexity is exp(val_loss). A run reaches the target at its first evaluation at or below it; the
tokens at that point are interpolated between the two bracketing evaluations, linearly in
log-perplexity (= in loss). numpy only: tune's objective and the report's tables both import this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def tokens_to_target(
    tokens: Sequence[float] | np.ndarray, ppl: Sequence[float] | np.ndarray, target_ppl: float
) -> float | None:
    """Tokens at the first crossing of ``target_ppl``, or None if the curve never reaches it.

    ``tokens`` and ``ppl`` are one run's evaluations in order; non-finite perplexities are skipped,
    and so are those of 0 or less (no loss gives one; a damaged store can).
    An evaluation at or below the target is a crossing (an exact hit returns its tokens); if the first
    evaluation is already there its tokens are returned. Between the last evaluation above (t0, p0) and
    the first at or below (t1, p1), the crossing is linear in log-perplexity:

        t = t0 + (t1 - t0) * (log p0 - log target) / (log p0 - log p1)
    """
    t = np.asarray(tokens, dtype=float)
    p = np.asarray(ppl, dtype=float)
    ok = np.isfinite(p) & np.isfinite(t) & (p > 0)
    t, p = t[ok], p[ok]
    hits = np.flatnonzero(p <= target_ppl)
    if hits.size == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return float(t[0])
    log_p0, log_p1, log_target = math.log(p[i - 1]), math.log(p[i]), math.log(target_ppl)
    frac = (log_p0 - log_target) / (log_p0 - log_p1)  # p0 > target >= p1, so 0 < frac <= 1
    return float(t[i - 1] + frac * (t[i] - t[i - 1]))


# --- the target perplexity -------------------------------------------------------------------------

TARGET_MODES = ("final", "best", "slowest", "median")
"""How a target is derived from the baseline's finished seeds (``target.from_baseline``)."""
DEFAULT_AT = 0.75
"""``slowest`` and ``median``: the fraction of the baseline's budget by which every baseline seed
(``slowest``) or the median one (``median``) reaches it."""
AT_MODES = ("slowest", "median")
"""The rules that read the baseline's curves at ``at`` of the budget."""
HEADROOM_WARN_AT = 0.75
"""Warn when the baseline needs more than this fraction of its budget to reach the target."""


@dataclass(frozen=True)
class Curve:
    """One finished, non-diverged baseline seed's validation curve (evaluation order)."""

    tokens: np.ndarray
    ppl: np.ndarray

    @classmethod
    def of(cls, tokens: Sequence[float] | np.ndarray, ppl: Sequence[float] | np.ndarray) -> Curve:
        """The curve up to its first non-finite evaluation (a divergence ends it)."""
        t, p = np.asarray(tokens, dtype=float), np.asarray(ppl, dtype=float)
        bad = np.flatnonzero(~(np.isfinite(t) & np.isfinite(p)))
        end = int(bad[0]) if bad.size else len(t)
        return cls(t[:end], p[:end])

    @property
    def budget(self) -> float:
        """Tokens trained (a finished run evaluates at its last step)."""
        return float(self.tokens[-1]) if len(self.tokens) else math.nan


def ppl_at(curve: Curve, tokens: float) -> float:
    """The lowest perplexity the curve has reached by ``tokens``: the minimum over its evaluations
    up to there and its value at ``tokens`` itself (interpolated linearly in log-perplexity, as
    ``tokens_to_target`` interpolates), so that ``tokens_to_target(curve, ppl_at(curve, t)) <= t``."""
    t, p = curve.tokens, curve.ppl
    if len(t) == 0:
        return math.nan
    inside = p[t <= tokens]
    best = float(inside.min()) if inside.size else math.inf
    i = int(np.searchsorted(t, tokens))
    if 0 < i < len(t):
        frac = (tokens - t[i - 1]) / (t[i] - t[i - 1])
        best = min(best, math.exp((1 - frac) * math.log(p[i - 1]) + frac * math.log(p[i])))
    return best


def target_ppl(
    *,
    val_ppl: float | None = None,
    val_loss: float | None = None,
    from_baseline: str | None = None,
    tolerance: float = 0.0,
    at: float | None = None,
    baseline: Sequence[Curve] = (),
) -> float:
    """The target perplexity: the one rule that the report, ``ablate tune`` and the validate/plan
    warning share. Raises ValueError naming the field when it cannot be resolved.

    ``val_ppl``, or exp(``val_loss``): absolute. From the baseline's finished seeds (``baseline``),
    times (1 + ``tolerance``):

        final    the mean of their final perplexities (about half the seeds end above it)
        best     the mean of their best perplexities
        slowest  the highest perplexity that every seed has reached by ``at`` (default 0.75) of its
                 budget: each seed reaches the target by then, leaving 1/at - 1 (+33%) of the budget
                 for configurations that need more tokens
        median   the median over the seeds of the perplexity each has reached by ``at`` of its
                 budget: the median seed reaches it then (one slow seed does not move it earlier)
    """
    given = [
        n
        for n, v in (("val_ppl", val_ppl), ("val_loss", val_loss), ("from_baseline", from_baseline))
        if v is not None
    ]
    if len(given) != 1:
        raise ValueError(
            "target: needs exactly one of val_ppl, val_loss, from_baseline; got "
            + (", ".join(given) or "none")
        )
    if val_ppl is not None:
        if not (math.isfinite(val_ppl) and val_ppl > 0):
            raise ValueError(f"target.val_ppl: must be a positive number, got {val_ppl}")
        return float(val_ppl)
    if val_loss is not None:
        if not math.isfinite(val_loss):
            raise ValueError(f"target.val_loss: must be a finite number, got {val_loss}")
        return math.exp(val_loss)
    if from_baseline not in TARGET_MODES:
        raise ValueError(
            f"target.from_baseline: unknown {from_baseline!r}; allowed: {', '.join(TARGET_MODES)}"
        )
    if not tolerance > -1:
        raise ValueError(f"target.tolerance: relative, must be > -1, got {tolerance}")
    curves = [c for c in baseline if len(c.tokens)]
    if not curves:
        raise ValueError(
            f"target.from_baseline: {from_baseline} needs a finished baseline run with evaluations"
        )
    if from_baseline == "final":
        value = float(np.mean([c.ppl[-1] for c in curves]))
    elif from_baseline == "best":
        value = float(np.mean([c.ppl.min() for c in curves]))
    else:
        frac = DEFAULT_AT if at is None else at
        if not 0 < frac <= 1:
            raise ValueError(f"target.at: a fraction of the budget in (0, 1], got {frac}")
        reached = [ppl_at(c, frac * c.budget) for c in curves]
        value = max(reached) if from_baseline == "slowest" else float(np.median(reached))
    return value * (1.0 + tolerance)


TARGET_FIELDS = ("val_ppl", "val_loss", "from_baseline", "tolerance", "at")


def target_fields(target: Any) -> dict[str, Any]:
    """The target's fields as ``target_ppl`` takes them, from the study's ``Target`` or a mapping
    (missing ones None, the tolerance 0)."""

    def get(name: str) -> Any:
        return target.get(name) if isinstance(target, Mapping) else getattr(target, name, None)

    out = {name: get(name) for name in TARGET_FIELDS}
    out["tolerance"] = float(out["tolerance"] or 0.0)
    return out


def target_ppl_of(target: Any, baseline: Sequence[Curve] = ()) -> float:
    """``target_ppl`` of a study's ``Target`` (or a mapping with its fields)."""
    return target_ppl(**target_fields(target), baseline=baseline)


def schedule_fraction(from_baseline: str | None, at: float | None) -> float | None:
    """Before any result exists: the fraction of its budget at which the baseline reaches a target
    derived from it (1 for final and best, whose value it only reaches at the end, ignoring the
    tolerance), or None for an absolute target (unknown until the baseline has run)."""
    if from_baseline in ("final", "best"):
        return 1.0
    if from_baseline in AT_MODES:
        return DEFAULT_AT if at is None else at
    return None


def reached_fraction(baseline: Sequence[Curve], target: float) -> float | None:
    """From results: the fraction of its budget the median baseline seed needed to reach
    ``target`` (a seed that never did counts as needing all of it); None without curves."""
    fracs = []
    for c in baseline:
        if not len(c.tokens):
            continue
        t = tokens_to_target(c.tokens, c.ppl, target)
        fracs.append(1.0 if t is None else t / c.budget)
    return float(np.median(fracs)) if fracs else None


def headroom_warning(
    fraction: float | None, *, measured: bool, tolerance: float = 0.0
) -> str | None:
    """The warning ``validate``/``plan`` print when the baseline reaches the target late in its
    budget: configurations that cost more tokens than the remaining budget cannot show their cost.
    Before any result, a tolerance's headroom is unknown and is said to be."""
    if fraction is None or fraction <= HEADROOM_WARN_AT:
        return None
    n = max(0.0, 1 / fraction - 1)
    how = "its recorded curves" if measured else "the study's schedule, before any result"
    if not measured and tolerance:
        how += f"; the tolerance of {tolerance:.0%} adds headroom only its curves will tell"
    return (
        f"the baseline reaches the target only at ~{fraction:.0%} of its budget (from {how}): "
        f"configurations costing more than +{n:.0%} tokens will show as not reached; lengthen "
        "train.steps or loosen the target (e.g. target: {from_baseline: slowest, at: 0.75})"
    )
