"""Confidence interval of a relative token cost over seeds (standard library only).

The relative token cost of a configuration is ``R - 1`` with ``R = mean(t_cfg) / mean(t_base)``, the
ratio of the mean tokens to target over the seeds of each that reached it. Its 95% interval is a
Student-t interval on ``log R`` by the delta method, treating the two configurations' seeds as
independent samples (conservative when seeds share data order: pairing would narrow it):

    se(log R)^2 = s_c^2 / (n_c m_c^2) + s_b^2 / (n_b m_b^2)        s: sample std, m: mean, n: seeds
    df          = Welch-Satterthwaite on the two relative-variance terms
    interval    = exp(log R -/+ t_{0.975, df} se) - 1

Working on ``log R`` keeps the interval's ratio positive and asymmetric as a ratio's should be. With
fewer than two seeds on either side there is no spread to estimate and the interval is NaN. The t
quantile at fractional df is computed here (Newton on a Simpson-integrated CDF) so that the report
needs no SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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


def _mean_var(x: Sequence[float]) -> tuple[float, float]:
    m = sum(x) / len(x)
    return m, sum((v - m) ** 2 for v in x) / (len(x) - 1)


def ratio_interval(cfg: Sequence[float], base: Sequence[float]) -> tuple[float, float, float]:
    """``(R - 1, low, high)`` for ``R = mean(cfg) / mean(base)``: the relative cost and its 95% interval.

    The point estimate needs one value on each side; the interval needs two (else NaN). All values
    must be positive (tokens to target).
    """
    if not cfg or not base:
        return math.nan, math.nan, math.nan
    m_c, m_b = sum(cfg) / len(cfg), sum(base) / len(base)
    point = m_c / m_b - 1
    if len(cfg) < 2 or len(base) < 2:
        return point, math.nan, math.nan
    _, v_c = _mean_var(cfg)
    _, v_b = _mean_var(base)
    a = v_c / (len(cfg) * m_c**2)  # relative variance of mean(cfg)
    b = v_b / (len(base) * m_b**2)
    if a + b == 0:
        return point, point, point
    df = (a + b) ** 2 / (a**2 / (len(cfg) - 1) + b**2 / (len(base) - 1))
    half = t975(max(df, 1.0)) * math.sqrt(a + b)
    log_r = math.log(m_c / m_b)
    return point, math.exp(log_r - half) - 1, math.exp(log_r + half) - 1
