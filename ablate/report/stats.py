"""Student's t quantiles for the report's 95% intervals (standard library only).

The intervals themselves are in ``censored`` (tokens to target and the relative token cost, with
censored seeds) and ``equal_loss`` (the equal-loss token ratio, Welch degrees of freedom, which
may be fractional). The t quantile at fractional df is computed here (Newton on a
Simpson-integrated CDF) so that the report needs no SciPy.
"""

from __future__ import annotations

import math


def _t_density(x: float, df: float) -> float:
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))


def _t_cdf(x: float, df: float, n: int = 400) -> float:
    """P(T <= x) for x >= 0: 1/2 plus the density integrated over [0, x] by Simpson's rule."""
    h = x / n
    total = _t_density(0.0, df) + _t_density(x, df)
    total += sum((4 if i % 2 else 2) * _t_density(i * h, df) for i in range(1, n))
    return 0.5 + total * h / 3


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 <= p < 1) of Student's t with ``df`` > 0 (possibly fractional) degrees of
    freedom, by Newton's method on the numerically integrated CDF (within 1e-6 of the exact value for
    the report's p = 0.975 and df >= 1). The CDF is concave above 0, so iterates from 0 rise
    monotonically to the root."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p must be in [0.5, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return _normal_quantile(p)
    x = 0.0
    for _ in range(200):
        step = (p - _t_cdf(x, df)) / _t_density(x, df)
        x += step
        if abs(step) < 1e-10 * max(1.0, x):
            break
    return x


def _normal_quantile(p: float) -> float:
    lo, hi = 0.0, 40.0
    for _ in range(200):  # bisection on the standard normal CDF
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2)) < p else (lo, mid)
    return (lo + hi) / 2


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t: the half-width factor of a two-sided 95% interval."""
    return t_quantile(0.975, df)
