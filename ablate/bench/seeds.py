"""How often the report's token-cost intervals hold, and how wide they are, on simulated studies with
a shared seed effect, censoring and stalls: ``python -m ablate.bench.seeds [--studies 2000]``.

Each simulated study has a baseline and three configurations of true relative token cost 0, +5%,
+15% and +30% (``COSTS``), ``seeds`` seeds each, trained as ``ablate.report.synthetic`` draws them:
seed i of configuration j stretched along the token axis by

    k_ji = (1 + cost_j) * exp(a_i + e_ji),    a_i ~ N(0, sigma_seed),  e_ji ~ N(0, sigma_res)

(a_i the seed's effect, shared by every configuration: the common random numbers of a study whose
seed fixes weights, data order and random streams), and a run stalls with its configuration's
probability, sitting on the early plateau for Uniform(0.25, 0.75) of the budget
(``synthetic.stall_curves``). The target is the baseline's noiseless loss at ``target_at`` of
the budget; a run that has not reached it by its budget is censored there.

Methods, each given the same studies:
    unpaired   the report before paired seeds: ``censored.relative_cost`` on every run
    pooled     ``paired.paired_costs`` on every run, stalls left in the seed noise
    paired     the report: runs that stalled (``stalls.stalled_runs``) set apart, then
               ``paired.paired_costs`` on the others

Coverage is the share of comparisons whose 95% interval holds the true cost (a lower bound holds
when it is below it); width is the median of hi / lo of the token ratio 1 + cost over the
comparisons with a two-sided interval. The table in docs/report.md is this module's output.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ablate.report.censored import Estimate, Seeds, relative_cost
from ablate.report.paired import paired_costs
from ablate.report.stalls import STALL_AT, stalled_runs
from ablate.report.synthetic import T_SCALE, base_loss, crossings, stall_curves

COSTS = (0.0, 0.05, 0.15, 0.30)
"""The true relative token costs: the baseline, then three configurations."""
METHODS = ("unpaired", "pooled", "paired")


@dataclass(frozen=True)
class Setting:
    """One simulated design: seeds per configuration, the seed effect's and the residual's sd in
    log tokens, each configuration's stall probability (baseline first), the target's share of
    the budget."""

    seeds: int = 3
    sigma_seed: float = 0.2
    sigma_res: float = 0.06
    stall: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    target_at: float = 0.6
    costs: tuple[float, ...] = field(default=COSTS)


SETTINGS = {
    "shared seed effect": Setting(),
    "shared seed effect, 2 seeds": Setting(seeds=2),
    "censored (target at 0.8)": Setting(target_at=0.8),
    "stalls in every arm (p 0.2)": Setting(stall=(0.2, 0.2, 0.2, 0.2)),
    "stall-prone baseline (0.3 vs 0.05)": Setting(stall=(0.3, 0.05, 0.05, 0.05)),
    "stall-prone configuration (0.05 vs 0.3)": Setting(stall=(0.05, 0.3, 0.05, 0.05)),
    "stall-prone baseline, 5 seeds": Setting(seeds=5, stall=(0.3, 0.05, 0.05, 0.05)),
}


@dataclass(frozen=True)
class SimulatedStudy:
    """One simulated study: per configuration, every run's (seed, tokens, reached); the set of
    (configuration, seed) found stalled, and the set drawn to stall (what the check should find)."""

    runs: dict[str, list[tuple[int, float, bool]]]
    stalled: frozenset[tuple[str, int]]
    drawn_stalls: frozenset[tuple[str, int]] = frozenset()

    def seeds(self, drop_stalled: bool) -> dict[str, Seeds]:
        out = {}
        for c, runs in self.runs.items():
            kept = [r for r in runs if not (drop_stalled and (c, r[0]) in self.stalled)]
            reached = [r for r in kept if r[2]]
            censored = [r for r in kept if not r[2]]
            out[c] = Seeds.of(
                [t for _, t, _ in reached],
                [t for _, t, _ in censored],
                ids=[s for s, _, _ in reached + censored],
            )
        return out


def draw(setting: Setting, n: int, seed: int) -> Iterator[SimulatedStudy]:
    rng = np.random.default_rng(seed)
    j, s = len(setting.costs), setting.seeds
    a = setting.sigma_seed * rng.standard_normal((n, 1, s))
    e = setting.sigma_res * rng.standard_normal((n, j, s))
    stretch = (1 + np.asarray(setting.costs))[None, :, None] * np.exp(a + e)
    stalls = rng.random((n, j, s)) < np.asarray(setting.stall)[None, :, None]
    escape = np.where(stalls, rng.uniform(0.25, 0.75, (n, j, s)) * T_SCALE, 0.0)
    tokens, ppl = stall_curves(rng, stretch, escape, T_SCALE)
    target = math.exp(float(base_loss(np.array([setting.target_at * T_SCALE]))[0]))
    hit = crossings(tokens, ppl, target)
    at = int(np.searchsorted(tokens, STALL_AT * T_SCALE * (1 - 1e-9)))
    mid = np.minimum.accumulate(ppl[..., : at + 1], axis=-1)[..., -1]
    names = [f"c{x}" for x in range(j)]
    for k in range(n):
        runs = {
            names[x]: [
                (i, float(hit[k, x, i]), True)
                if math.isfinite(hit[k, x, i])
                else (i, float(tokens[-1]), False)
                for i in range(s)
            ]
            for x in range(j)
        }
        flags = stalled_runs(
            {(names[x], i): float(mid[k, x, i]) for x in range(j) for i in range(s)}
        )
        drawn = frozenset((names[x], i) for x in range(j) for i in range(s) if stalls[k, x, i])
        yield SimulatedStudy(runs, frozenset(key for key, v in flags.items() if v), drawn)


def estimates(study: SimulatedStudy, method: str) -> dict[str, Estimate]:
    """Each configuration's relative token cost by ``method`` (module docstring)."""
    if method == "unpaired":
        seeds = study.seeds(drop_stalled=False)
        return {c: relative_cost(g, seeds["c0"]) for c, g in seeds.items() if c != "c0"}
    return paired_costs(study.seeds(drop_stalled=method == "paired"), "c0")


@dataclass(frozen=True)
class Result:
    """Coverage (share of comparisons), its count, and the median width (hi / lo)."""

    coverage: float
    comparisons: int
    width: float


def coverage(
    setting: Setting, n: int, methods: Sequence[str] = METHODS, seed: int = 20261126
) -> dict[str, Result]:
    """Coverage and width of each method over ``n`` simulated studies of ``setting``."""
    held = {m: 0 for m in methods}
    count = {m: 0 for m in methods}
    widths: dict[str, list[float]] = {m: [] for m in methods}
    for study in draw(setting, n, seed):
        for m in methods:
            for c, est in estimates(study, m).items():
                truth = setting.costs[int(c[1:])]
                if not (math.isfinite(est.lo) or math.isfinite(est.hi)):
                    continue  # no interval at all (no reached seed on a side, no spread)
                count[m] += 1
                held[m] += bool(est.lo <= truth <= est.hi)
                if math.isfinite(est.lo) and math.isfinite(est.hi) and est.lo > -1:
                    widths[m].append((1 + est.hi) / (1 + est.lo))
    return {
        m: Result(
            held[m] / count[m] if count[m] else math.nan,
            count[m],
            float(np.median(widths[m])) if widths[m] else math.nan,
        )
        for m in methods
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ablate.bench.seeds", description=__doc__)
    parser.add_argument("--studies", type=int, default=2000, help="simulated studies a setting")
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS))
    args = parser.parse_args(argv)
    names = args.setting or list(SETTINGS)
    print(f"{args.studies} simulated studies a setting; coverage % (comparisons) and median width")
    print("| setting | " + " | ".join(METHODS) + " |")
    print("| --- |" + " ---: |" * len(METHODS))
    for name in names:
        start = time.perf_counter()
        found = coverage(SETTINGS[name], args.studies)
        cells = [f"{r.coverage:.1%} ({r.comparisons}), ×{r.width:.2f}" for r in found.values()]
        took = time.perf_counter() - start
        print(f"| {name} | " + " | ".join(cells) + f" |  <!-- {took:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
