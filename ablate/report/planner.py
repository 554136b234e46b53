"""How many seeds a decision needs, before a GPU-hour is spent: the seed planner behind ``ablate
plan`` and the report's seed note (standard library only).

The decision is the paired comparison of ``paired``: log tokens to target = configuration + seed +
noise, the noise's sd ``sigma`` pooled over the study's J configurations. With n seeds per
configuration the estimate of a configuration's cost against its baseline has standard error
sigma * sqrt(2 / n) on the log scale and df = (J - 1)(n - 1). A configuration whose true log cost
lies ``margin`` from the boundary of the decision (the break-even cost log(gain) of its step
throughput gain, by default) is decided, its 95% interval on the right side of the boundary, with
probability ``power`` when

    margin >= (t_{0.975, df} + t_{power, df}) * sigma * sqrt(2 / n)

(the usual t approximation of the power of a two-sided t test; ``tests/ablate/report/
test_planner.py`` simulates the planned designs through the report's own estimator and finds the
power within 3 points of the nominal one). Runs that stall do not count (``stalls``): the
seeds planned are n / (1 - stall rate), rounded up.

The noise model comes from a finished study (``noise_of``: the paired residual sd of its
comparisons and its stall rate) or is declared; ``DEFAULT_NOISE`` says what is assumed without
either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ablate.report.stats import t_quantile

MAX_SEEDS = 10_000
"""Beyond this many seeds a design is reported as out of reach."""


@dataclass(frozen=True)
class Noise:
    """A noise model: ``sigma``, the paired residual sd of log tokens to target; ``stall_rate``,
    the share of runs that stall; ``source``, where the two come from (said beside every plan)."""

    sigma: float
    stall_rate: float = 0.0
    source: str = "declared"

    def __post_init__(self) -> None:
        if not (self.sigma > 0 and math.isfinite(self.sigma)):
            raise ValueError(f"noise: sigma must be a positive number, got {self.sigma}")
        if not 0 <= self.stall_rate < 1:
            raise ValueError(f"noise: the stall rate must be in [0, 1), got {self.stall_rate}")


DEFAULT_NOISE = Noise(
    0.10,
    0.10,
    "assumed (sigma 0.10, 10% of runs stall): give --noise-from a finished study of the same "
    "model and budget, or --noise",
)
"""Without a study to measure: a residual sd of 0.10 in log tokens (above the stall-free paired
residuals of the simulations, 0.06) and one run in ten stalling."""


def seeds_needed(margin: float, noise: Noise, configs: int = 2, power: float = 0.8) -> int | None:
    """Seeds per configuration (baseline included) that decide ``margin`` (log scale, > 0) at
    ``power`` in a study of ``configs`` configurations (module docstring); None beyond
    ``MAX_SEEDS``."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0 on the log scale, got {margin}")
    if not 0.5 <= power < 1:
        raise ValueError(f"power must be in [0.5, 1), got {power}")
    j = max(2, configs)

    def decides(n: int) -> bool:
        df = (j - 1) * (n - 1)
        need = (t_quantile(0.975, df) + t_quantile(power, df)) * noise.sigma * math.sqrt(2 / n)
        return need <= margin

    lo, hi = 2, 2
    while not decides(hi):
        if hi >= MAX_SEEDS:
            return None
        lo, hi = hi, min(hi * 2, MAX_SEEDS)
    while lo < hi:  # the least n that decides (decides is monotone in n)
        mid = (lo + hi) // 2
        if decides(mid):
            hi = mid
        else:
            lo = mid + 1
    return math.ceil(hi / (1 - noise.stall_rate))


def default_margin(gain: float) -> float:
    """The margin a configuration is planned for by default: its break-even cost, log(gain): a
    configuration that costs no tokens is told apart from one that loses all its step gain."""
    if not (gain > 0 and math.isfinite(gain)) or gain == 1:
        return math.nan
    return abs(math.log(gain))


PAIRED_METHODS = ("paired", "paired-own")
"""The relative-cost methods of ``paired`` whose sigma is the paired residual."""
PAIRED_SOURCE = "paired residual"
UNPAIRED_SOURCE = "unpaired seed noise"


def study_noise(config_table: Any) -> Noise | None:
    """The noise model a finished study measured, from its ``metrics.per_config`` table: the
    paired residual sd of its paired comparisons (source ``PAIRED_SOURCE``), or where none has
    one the unpaired seed noise of its comparisons (``UNPAIRED_SOURCE``: it holds the seed effect
    too, so a plan from it asks for more seeds than needed), and the stall rate of its runs; None
    where no comparison has a noise estimate."""
    rows = config_table[~config_table["baseline"].astype(bool)]
    stalled, judged = (
        int(config_table["seeds_stalled"].sum()),
        int(config_table["seeds_judged"].sum()),
    )
    paired = rows[rows["rel_token_cost_method"].isin(PAIRED_METHODS)]
    noise = noise_of(paired["log_sigma"].astype(float), stalled, judged, PAIRED_SOURCE)
    if noise is None:
        noise = noise_of(rows["log_sigma"].astype(float), stalled, judged, UNPAIRED_SOURCE)
    return noise


def noise_of(sigmas: Iterable[float], stalled: int, judged: int, source: str) -> Noise | None:
    """The noise model of a finished study: the median of its paired comparisons' residual sd
    (``rel_token_cost_sigma`` of the paired methods) and its stall rate (stalled of judged runs);
    None without a paired comparison."""
    found = sorted(s for s in sigmas if s > 0 and math.isfinite(s))
    if not found:
        return None
    rate = stalled / judged if judged else 0.0
    return Noise(found[len(found) // 2], min(rate, 0.9), source)
