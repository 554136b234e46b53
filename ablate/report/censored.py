"""Tokens to target when some seeds never get there: a censored log-normal model (standard library
only, like ``stats``).

A seed that has not reached the target by its last evaluation is *right-censored* there: all we know
is that its tokens to target exceed the tokens it trained. Dropping such seeds (a mean over the
survivors) biases every estimate towards the lucky seeds; this module keeps them.

Model. For the seeds i of one configuration j, log T_ij ~ Normal(mu_j, sigma^2): multiplicative seed
noise on the tokens to target, the usual shape of run-to-run variation in training speed. A reached
seed contributes the density at log T; a censored one the probability log T > log c (its last
evaluation's tokens c). Comparisons are pairwise: configuration j and the baseline b share one
sigma, estimated from their own seeds only (a configuration whose seeds scatter more does not widen
the others' intervals).

    relative token cost  = exp(mu_j - mu_b) - 1          (ratio of median tokens to target)
    delta = mu_j - mu_b, its 95% interval = {delta : D(delta) <= t_{0.975, df}^2}

D is the profile deviance of delta with sigma fixed at its small-sample estimate
sigma_hat^2 * n / df (n seeds of the two configurations, df = n - 2, the residual degrees of
freedom). With no censored seed this is exactly the pooled two-sample Student-t interval on the log
tokens; with censoring it is its likelihood generalisation, whose coverage the test suite checks by
simulation (93-97% at 3 seeds, with up to ~40% of seeds censored).

Kinds of estimate (``Estimate.kind``):
    observed   every seed on both sides reached the target: the t interval above
    censored   some seed did not, the maximum-likelihood estimate is finite: the profile interval
    bound      no seed of the configuration reached it: the cost has no point estimate, only a lower
               bound (``lo``; ``hi`` is +inf): the least the seeds' censored tokens allow, each
               seed placed by its offset on its own curve, less t times the standard error
               (``_cost_bound``; it exceeds the true cost in under 2.5% of simulated studies)
    none       nothing to estimate (the baseline never reached the target, or no seeds)

A zero spread (every reached seed at exactly the same tokens) leaves the interval undefined (NaN),
never a zero-width "exact" interval: two identical measurements say nothing about the noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ablate.report.stats import t975

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class Seeds:
    """One configuration's seeds: tokens to target of those that reached it (``reached``) and the
    last evaluated tokens of those that did not (``censored``); ``ids``, where known, the seeds'
    numbers in that order (reached, then censored): what pairs them with the baseline's seeds
    (``paired``)."""

    reached: tuple[float, ...] = ()
    censored: tuple[float, ...] = ()
    ids: tuple[int, ...] = ()

    @classmethod
    def of(
        cls,
        reached: Sequence[float],
        censored: Sequence[float] = (),
        ids: Sequence[int] | None = None,
    ) -> Seeds:
        for t in (*reached, *censored):
            if not (t > 0 and math.isfinite(t)):
                raise ValueError(f"tokens must be positive and finite, got {t}")
        numbers = tuple(int(i) for i in ids) if ids is not None else ()
        if ids is not None and (
            len(numbers) != len(reached) + len(censored) or len(set(numbers)) != len(numbers)
        ):
            raise ValueError(f"ids: one distinct seed per run, got {numbers}")
        return cls(tuple(float(t) for t in reached), tuple(float(t) for t in censored), numbers)

    def runs(self) -> list[tuple[int, float, bool]]:
        """(seed, tokens, reached) of each seed with an id (none without ids)."""
        flags = [True] * len(self.reached) + [False] * len(self.censored)
        return list(zip(self.ids, (*self.reached, *self.censored), flags, strict=False))

    @property
    def n(self) -> int:
        return len(self.reached) + len(self.censored)


@dataclass(frozen=True)
class Estimate:
    """A log-scale quantity's estimate on the natural scale: ``value`` (exp of the log estimate,
    NaN for a bound), its 95% interval ``lo``/``hi`` (``hi`` is inf for a lower bound), the
    ``kind`` (module docstring), and ``sigma`` (the log-scale seed noise used; NaN if unknown)."""

    value: float
    lo: float
    hi: float
    kind: str
    sigma: float = math.nan
    df: float = math.nan
    method: str = ""


NONE = Estimate(math.nan, math.nan, math.nan, "none")


# --- the censored normal log-likelihood ------------------------------------------------------------


def log_ndtr(z: float) -> float:
    """log Phi(z), accurate in the far left tail (asymptotic series below -20)."""
    if z > -20.0:
        return math.log(0.5 * math.erfc(-z / _SQRT2))
    z2 = z * z
    return -0.5 * z2 - math.log(-z) - _LOG_SQRT_2PI + math.log1p(-1 / z2 + 3 / (z2 * z2))


def mills(z: float, log_cdf: float | None = None) -> float:
    """phi(z) / Phi(z) (the hazard of a censored point), stable for very negative z; ``log_cdf``
    is ``log_ndtr(z)`` where the caller has it."""
    if z > -20.0:
        lc = log_ndtr(z) if log_cdf is None else log_cdf
        return math.exp(-0.5 * z * z - _LOG_SQRT_2PI - lc)
    return -z / (1 - 1 / (z * z) + 3 / (z**4))  # asymptotic: ~ -z


class _Group:
    """Log-likelihood of one configuration's seeds as a function of mu, for a fixed sigma."""

    def __init__(self, seeds: Seeds, sigma: float) -> None:
        self.y = [math.log(t) for t in seeds.reached]
        self.c = [math.log(t) for t in seeds.censored]
        self.s = sigma
        self._log_s = math.log(sigma) if sigma > 0 else math.nan  # s = 0: ll divides by it first
        self._s2 = sigma**2

    def ll(self, mu: float) -> float:
        s, log_s = self.s, self._log_s
        out = sum([-0.5 * ((y - mu) / s) ** 2 - log_s - _LOG_SQRT_2PI for y in self.y])
        return out + sum([log_ndtr((mu - c) / s) for c in self.c])

    def d1(self, mu: float) -> float:
        s, s2 = self.s, self._s2
        return sum([(y - mu) / s2 for y in self.y]) + sum([mills((mu - c) / s) / s for c in self.c])

    def d2(self, mu: float) -> float:
        s, s2 = self.s, self._s2
        out = -len(self.y) / s2
        for c in self.c:
            z = (mu - c) / s
            m = mills(z)
            out -= m * (z + m) / s2
        return out

    def start(self) -> float:
        return sum(self.y) / len(self.y) if self.y else max(self.c) + self.s


def _maximize(
    f: Callable[[float], float],
    d1: Callable[[float], float],
    d2: Callable[[float], float],
    x: float,
) -> float:
    """Argmax of a concave function by damped Newton steps (halved until f does not decrease)."""
    fx = f(x)
    for _ in range(100):
        g, h = d1(x), d2(x)
        step = g if h >= 0 else -g / h  # h >= 0: numerically flat, a small gradient step
        while True:
            nx = x + step
            fn = f(nx)
            if fn >= fx - 1e-12 or abs(step) < 1e-12:
                break
            step /= 2
        done = abs(nx - x) < 1e-10 * max(1.0, abs(x))
        x, fx = nx, fn
        if done:
            break
    return x


def golden_max(f: Callable[[float], float], a: float, b: float, tol: float = 1e-7) -> float:
    """Argmax of a unimodal ``f`` on [a, b] by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc > fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


LOG_SIGMA_RANGE = (math.log(1e-6), math.log(20.0))


def _fit_sigma(groups: Sequence[Seeds]) -> tuple[float, int, int]:
    """(sigma_mle, seeds, df) of the groups' shared sigma; sigma is NaN when there is no residual
    degree of freedom, 0 when the seeds leave no spread at all. Censored seeds count as seeds: they
    carry information about the noise too (with them counted, the simulated coverage stays at 95%
    as censoring grows; counting only reached seeds over-covers, 97% at 20% censored)."""
    n_obs = sum(g.n for g in groups)
    df = n_obs - len(groups)
    if df < 1 or any(not g.reached for g in groups):
        return math.nan, n_obs, df

    def profile(log_s: float) -> float:
        total = 0.0
        for seeds in groups:
            grp = _Group(seeds, math.exp(log_s))
            total += grp.ll(_maximize(grp.ll, grp.d1, grp.d2, grp.start()))
        return total

    log_s = golden_max(profile, *LOG_SIGMA_RANGE)
    if log_s <= LOG_SIGMA_RANGE[0] + 1e-3:
        return 0.0, n_obs, df
    return math.exp(log_s), n_obs, df


def profile_interval(
    dev: Callable[[float], float], x_hat: float, q: float, scale: float, tol: float = 1e-9
) -> tuple[float, float]:
    """{x : dev(x) <= q} around the minimum x_hat of a deviance that rises on both sides (an end
    is +/-inf where it never rises above q within 60 scales), each end to ``tol`` (relative)."""

    def end(direction: float) -> float:
        inside, step = x_hat, scale
        for _ in range(60):
            out = inside + direction * step
            if dev(out) > q:
                break
            inside, step = out, step * 2
        else:
            return direction * math.inf
        for _ in range(80):  # bisection between a point inside and one outside
            mid = (inside + out) / 2
            if dev(mid) > q:
                out = mid
            else:
                inside = mid
            if abs(out - inside) < tol * max(1.0, abs(mid)):
                break
        return (inside + out) / 2

    return end(-1.0), end(1.0)


# --- estimates -------------------------------------------------------------------------------------


def tokens_estimate(seeds: Seeds) -> Estimate:
    """Median tokens to target of one configuration, exp(mu_hat), with its 95% profile interval
    (sigma from this configuration's seeds alone)."""
    if seeds.n == 0:
        return NONE
    if not seeds.reached:
        return Estimate(math.nan, max(seeds.censored), math.inf, "bound")
    kind = "censored" if seeds.censored else "observed"
    sigma, n_obs, df = _fit_sigma([seeds])
    if not sigma > 0:  # one reached seed, or no spread: the point only
        return Estimate(_point_no_sigma(seeds), math.nan, math.nan, kind, sigma, df)
    s = sigma * math.sqrt(n_obs / df)
    grp = _Group(seeds, s)
    mu = _maximize(grp.ll, grp.d1, grp.d2, grp.start())
    top = grp.ll(mu)
    lo, hi = profile_interval(lambda m: 2 * (top - grp.ll(m)), mu, t975(df) ** 2, s)
    return Estimate(math.exp(mu), math.exp(lo), math.exp(hi), kind, s, df)


def _point_no_sigma(seeds: Seeds) -> float:
    """Without a noise estimate: the geometric mean of the reached seeds (exact when none is
    censored, and then the maximum-likelihood estimate for any sigma)."""
    return math.exp(sum(math.log(t) for t in seeds.reached) / len(seeds.reached))


def relative_cost(cfg: Seeds, base: Seeds, offsets: Sequence[float] | None = None) -> Estimate:
    """The configuration's tokens to target relative to the baseline's, as ``R - 1`` with
    R = exp(mu_cfg - mu_base), and its 95% interval (module docstring). ``offsets``: when no seed
    of the configuration reached the target, each censored seed's log-token offset from its
    configuration's mean, in the order of ``cfg.censored`` (read from the seeds' curves:
    ``equal_loss.seed_offsets``): what the lower bound rests on besides the baseline."""
    if not base.reached or cfg.n == 0:
        return NONE
    if not cfg.reached:
        return _cost_bound(cfg, base, offsets)
    kind = "censored" if (cfg.censored or base.censored) else "observed"
    if kind == "observed" and cfg.n + base.n > 2:
        return _pooled_t(cfg.reached, base.reached)
    sigma, n_obs, df = _fit_sigma([cfg, base])
    if not sigma > 0:
        point = _point_no_sigma(cfg) / _point_no_sigma(base) - 1
        if cfg.censored or base.censored:
            kind = "censored"
        return Estimate(point, math.nan, math.nan, kind, sigma, df)
    s = sigma * math.sqrt(n_obs / df)
    return _profile_delta(_Group(cfg, s), _Group(base, s), s, df, kind)


def _pooled_t(cfg: Sequence[float], base: Sequence[float]) -> Estimate:
    """Without censoring the profile interval is the pooled two-sample t interval on log tokens:
    in closed form (what the likelihood gives, to its 1e-7 tolerance, and faster)."""
    lc, lb = [math.log(t) for t in cfg], [math.log(t) for t in base]
    mc, mb = sum(lc) / len(lc), sum(lb) / len(lb)
    ss = sum((x - mc) ** 2 for x in lc) + sum((x - mb) ** 2 for x in lb)
    n_obs = len(lc) + len(lb)
    df = n_obs - 2
    if math.sqrt(ss / n_obs) <= math.exp(LOG_SIGMA_RANGE[0] + 1e-3):  # no spread: no interval
        return Estimate(math.expm1(mc - mb), math.nan, math.nan, "observed", 0.0, df)
    s = math.sqrt(ss / df)
    half = t975(df) * s * math.sqrt(1 / len(lc) + 1 / len(lb))
    d = mc - mb
    return Estimate(math.expm1(d), math.expm1(d - half), math.expm1(d + half), "observed", s, df)


def _profile_delta(gc: _Group, gb: _Group, s: float, df: int, kind: str) -> Estimate:
    mu_c = _maximize(gc.ll, gc.d1, gc.d2, gc.start())
    mu_b = _maximize(gb.ll, gb.d1, gb.d2, gb.start())
    top = gc.ll(mu_c) + gb.ll(mu_b)
    start = [mu_b]

    def dev(delta: float) -> float:
        m = _maximize(
            lambda u: gc.ll(u + delta) + gb.ll(u),
            lambda u: gc.d1(u + delta) + gb.d1(u),
            lambda u: gc.d2(u + delta) + gb.d2(u),
            start[0],
        )
        start[0] = m
        return 2 * (top - gc.ll(m + delta) - gb.ll(m))

    d_hat = mu_c - mu_b
    lo, hi = profile_interval(dev, d_hat, t975(df) ** 2, s)
    return Estimate(math.exp(d_hat) - 1, math.expm1(lo), math.expm1(hi), kind, s, df)


def _cost_bound(cfg: Seeds, base: Seeds, offsets: Sequence[float] | None) -> Estimate:
    """The lower bound when no seed of the configuration reached the target (module docstring:
    kind ``bound``). With the seeds' offsets a_i (they sum to zero), the configuration's mean
    log tokens to target m = log T_i - a_i is at least m_min = max_i (log c_i - a_i), c_i the
    tokens seed i trained without reaching it. D = m - mu_b_hat is normal around the true
    delta with se^2 = s^2 / n + se_b^2 (the baseline's censored estimate and its standard error
    from the observed information), and s, pooled from the offsets (n - 1 degrees of freedom)
    and the baseline's seeds, is independent of D: so m_min - mu_b_hat - t se, which is below
    D - t se, exceeds delta in at most 2.5% of studies. Without offsets the configuration adds
    no degree of freedom (its seeds are taken as alike)."""
    n = len(cfg.censored)
    given = offsets is not None and len(offsets) == n and all(map(math.isfinite, offsets))
    a = [float(x) for x in offsets] if given and offsets is not None else [0.0] * n
    m_min = max(math.log(c) - ai for c, ai in zip(cfg.censored, a, strict=True))
    ss_c, df_c = (sum(x * x for x in a), n - 1) if given else (0.0, 0)
    sigma_b, n_b, df_b = _fit_sigma([base])
    ss_b, df_b = (sigma_b**2 * n_b, df_b) if df_b >= 1 and math.isfinite(sigma_b) else (0.0, 0)
    df = df_c + df_b
    if df < 1 or not ss_c + ss_b > 0:
        # no noise estimate: the least the configuration needs over the baseline's geometric mean
        return Estimate(math.nan, math.exp(m_min) / _point_no_sigma(base) - 1, math.inf, "bound")
    s = math.sqrt((ss_c + ss_b) / df)
    gb = _Group(base, s)
    mu_b = _maximize(gb.ll, gb.d1, gb.d2, gb.start())
    se = math.sqrt(s * s / n - 1 / gb.d2(mu_b))
    return Estimate(math.nan, math.expm1(m_min - mu_b - t975(df) * se), math.inf, "bound", s, df)


def half_width(sigma: float, seeds: int) -> float:
    """The expected half-width, in relative-cost terms (e.g. 0.12 for +/-12%), of the 95% interval
    of a comparison with ``seeds`` reached seeds on each side and log-scale noise ``sigma``: what a
    study would resolve with that many seeds."""
    if seeds < 2 or not sigma > 0:
        return math.nan
    return math.expm1(t975(2 * seeds - 2) * sigma * math.sqrt(2 / seeds))
