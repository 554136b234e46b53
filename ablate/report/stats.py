"""Student's t and normal quantiles for the report's 95% intervals (standard library only).

The intervals themselves are in ``censored`` (tokens to target and the relative token cost, with
censored seeds) and ``equal_loss`` (the equal-loss token ratio, Welch degrees of freedom, which
may be fractional). The t distribution at fractional df is computed here so that the report needs
no SciPy: its CDF is a regularized incomplete beta function,

    P(|T| > x) = I_{df / (df + x^2)}(df / 2, 1 / 2),

evaluated by its continued fraction (modified Lentz), and the quantile by Newton's method on it.
Quantiles are cached: the simulation tests ask for the same few thousand times.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _t_density(x: float, df: float) -> float:
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b) (valid for x < (a + 1) / (a + b + 2)), by the
    modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 400):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            out *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return out


def _betainc(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for 0 <= x <= 1."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1 - math.exp(log_front) * _beta_fraction(1 - x, b, a) / b


def _t_cdf(x: float, df: float) -> float:
    """P(T <= x) for x >= 0."""
    return 1 - 0.5 * _betainc(df / (df + x * x), df / 2, 0.5)


@lru_cache(maxsize=65536)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 <= p < 1) of Student's t with ``df`` > 0 (possibly fractional) degrees of
    freedom, by Newton's method on the CDF (within 1e-9 of the exact value for the report's
    p = 0.975 and df >= 1). The CDF is concave above 0, so iterates from 0 rise monotonically to
    the root."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p must be in [0.5, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return normal_quantile(p)
    x = 0.0
    for _ in range(200):
        step = (p - _t_cdf(x, df)) / _t_density(x, df)
        x += step
        if abs(step) < 1e-12 * max(1.0, x):
            break
    return x


def normal_quantile(p: float) -> float:
    """The ``p`` quantile (0.5 <= p < 1) of the standard normal (bisection on its CDF)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):  # bisection on the standard normal CDF
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2)) < p else (lo, mid)
    return (lo + hi) / 2


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t: the half-width factor of a two-sided 95% interval."""
    return t_quantile(0.975, df)


def chi2_sf(x: float, df: float) -> float:
    """P(X > x) for X chi-squared with ``df`` degrees of freedom: the regularized upper incomplete
    gamma function Q(df / 2, x / 2), by its series below a + 1 and its continued fraction above."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if x <= 0:
        return 1.0
    a, z = df / 2, x / 2
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1 / a
        for n in range(1, 1000):
            term *= z / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1 - math.exp(log_front) * total)
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for n in range(1, 1000):
        an = -n * (n - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_front) * h
