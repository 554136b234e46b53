"""Tokens to a target perplexity: the one definition that the report and ``ablate tune`` share.

Perplexity is exp(val_loss). A run reaches the target at its first evaluation at or below it; the
tokens at that point are interpolated between the two bracketing evaluations, linearly in
log-perplexity (= in loss). numpy only: tune's objective and the report's tables both import this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def tokens_to_target(
    tokens: Sequence[float] | np.ndarray, ppl: Sequence[float] | np.ndarray, target_ppl: float
) -> float | None:
    """Tokens at the first crossing of ``target_ppl``, or None if the curve never reaches it.

    ``tokens`` and ``ppl`` are one run's evaluations in order; non-finite perplexities are skipped.
    An evaluation at or below the target is a crossing (an exact hit returns its tokens); if the first
    evaluation is already there its tokens are returned. Between the last evaluation above (t0, p0) and
    the first at or below (t1, p1), the crossing is linear in log-perplexity:

        t = t0 + (t1 - t0) * (log p0 - log target) / (log p0 - log p1)
    """
    t = np.asarray(tokens, dtype=float)
    p = np.asarray(ppl, dtype=float)
    ok = np.isfinite(p) & np.isfinite(t)
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
