"""Which default target shows what FP4 costs: ``python -m ablate.bench.targets [--studies 1000]``.

Each simulated study has a baseline and configurations whose *penalty grows as training goes on*
(what the 2026 FP4 runs report: NVFP4's token cost is largest at the end of training). A seed's
run needs, to reach the loss the noiseless baseline has at ``u`` tokens,

    t = k * u * (1 + c * (u / T) ** gamma),    k = exp(a_i + e_ji)

tokens (``T`` the budget, ``c`` the configuration's cost at the end, ``gamma`` how late it comes:
0 a constant cost, the model of ``ablate.bench.seeds``; 1 and 2 a cost that grows; ``a_i`` the
seed's effect shared by every configuration, ``e_ji`` the run's own noise). Every target rule of
``ablate.targets.target_ppl`` that reads the baseline's curves is given the same studies, and the
report's paired token cost (``paired.paired_costs``) is read at its target; beside them the
report's paired equal-loss ratio at the end of training (``equal_loss.paired_ratio``).

For each rule and end cost: the mean point estimate (studies with a point), how often the 95%
interval holds the *end* cost ``c`` (a lower bound holds it when below it), the share of studies
where it is only a bound, the share of the configuration's seeds censored (not at the target by
the budget) and the median width (hi / lo of the token ratio). docs/report.md's table is this
module's output and says why the default is ``median``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ablate.report.censored import Estimate, Seeds
from ablate.report.equal_loss import paired_ratio
from ablate.report.paired import paired_costs
from ablate.report.synthetic import T_SCALE, base_loss, crossings
from ablate.targets import Curve, target_ppl

RULES: dict[str, dict[str, object]] = {
    "slowest@0.75": {"from_baseline": "slowest", "at": 0.75},
    "median@0.75": {"from_baseline": "median", "at": 0.75},
    "median@0.9": {"from_baseline": "median", "at": 0.9},
    "final": {"from_baseline": "final"},
}
"""The target rules compared (``target_ppl``'s arguments)."""
EQUAL_LOSS = "equal-loss (end)"
COSTS = (0.1, 0.3)
"""The configurations' token costs at the end of training (the baseline's is 0)."""


@dataclass(frozen=True)
class Setting:
    """Seeds per configuration, how late the cost comes (``gamma``), the shared seed effect's and
    the runs' own noise's sd in log tokens, evaluations per budget."""

    seeds: int = 3
    gamma: float = 2.0
    sigma_seed: float = 0.1
    sigma_res: float = 0.03
    evals: int = 40
    costs: tuple[float, ...] = field(default=COSTS)


def runs(
    rng: np.random.Generator, k: np.ndarray, cost: float, gamma: float, evals: int
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (E,), perplexity (seeds, E)) of runs stretched by ``k`` whose cost at the end is
    ``cost``, growing as (u / T) ** gamma; evaluation noise 0.002 in loss."""
    tokens = np.arange(1, evals + 1) * (T_SCALE / evals)
    u = np.geomspace(T_SCALE * 1e-4, 3 * T_SCALE, 4000)
    need = u * (1 + cost * (u / T_SCALE) ** gamma)  # tokens a run of k = 1 needs to reach u's loss
    reached = np.interp(tokens[None, :] / k[:, None], need, u)
    loss = base_loss(reached) + 0.002 * rng.standard_normal(reached.shape)
    return tokens, np.exp(loss)


@dataclass
class Tally:
    """One rule's results for one cost over the studies."""

    covered: int = 0
    bounds: int = 0
    censored: int = 0
    seeds: int = 0
    logs: list[float] = field(default_factory=list)
    widths: list[float] = field(default_factory=list)

    def add(self, est: Estimate, ratio: float, censored: int, seeds: int) -> None:
        """One study's ``est`` of the relative cost, against the true token ratio ``ratio``."""
        self.censored += censored
        self.seeds += seeds
        lo, hi, value = est.lo + 1, est.hi + 1, est.value + 1
        if est.kind == "bound":
            self.bounds += 1
            self.covered += lo <= ratio
            return
        self.covered += lo <= ratio <= hi
        if math.isfinite(value) and value > 0:
            self.logs.append(math.log(value))
        if math.isfinite(hi) and lo > 0:
            self.widths.append(hi / lo)


def simulate(setting: Setting, studies: int, seed: int = 20261126) -> dict[str, dict[float, Tally]]:
    """Every rule's (and the end equal-loss ratio's) tally per end cost over ``studies``."""
    rng = np.random.default_rng(seed)
    out = {name: {c: Tally() for c in setting.costs} for name in [*RULES, EQUAL_LOSS]}
    costs = (0.0, *setting.costs)
    for _ in range(studies):
        a = setting.sigma_seed * rng.standard_normal(setting.seeds)
        drawn = [
            runs(
                rng,
                np.exp(a + setting.sigma_res * rng.standard_normal(setting.seeds)),
                c,
                setting.gamma,
                setting.evals,
            )
            for c in costs
        ]
        curves = [[Curve(t, p) for p in ppl] for t, ppl in drawn]
        for j, c in enumerate(setting.costs, 1):
            e = paired_ratio(dict(enumerate(curves[j])), dict(enumerate(curves[0])))
            assert e is not None
            ratio = Estimate(e.value - 1, e.lo - 1, e.hi - 1, e.kind)
            out[EQUAL_LOSS][c].add(ratio, 1 + c, 0, setting.seeds)
        for name, rule in RULES.items():
            target = target_ppl(baseline=curves[0], **rule)  # type: ignore[arg-type]
            groups = {str(j): _seeds(t, ppl, target) for j, (t, ppl) in enumerate(drawn)}
            est = paired_costs(groups, "0")
            for j, c in enumerate(setting.costs, 1):
                g = groups[str(j)]
                out[name][c].add(est[str(j)], 1 + c, len(g.censored), setting.seeds)
    return out


def _seeds(tokens: np.ndarray, ppl: np.ndarray, target: float) -> Seeds:
    x = crossings(tokens, ppl, target)
    hit = np.isfinite(x)
    ids = [*np.flatnonzero(hit).tolist(), *np.flatnonzero(~hit).tolist()]
    return Seeds.of(x[hit].tolist(), [float(tokens[-1])] * int((~hit).sum()), ids)


SETTINGS: dict[str, Setting] = {
    "constant cost, 3 seeds": Setting(seeds=3, gamma=0.0),
    "cost growing (gamma 1), 3 seeds": Setting(seeds=3, gamma=1.0),
    "cost growing late (gamma 2), 3 seeds": Setting(seeds=3, gamma=2.0),
    "cost growing late (gamma 2), 5 seeds": Setting(seeds=5, gamma=2.0),
}


def rows(found: dict[str, dict[float, Tally]], studies: int) -> list[str]:
    """The table rows of one setting: rule | per cost: mean estimate, coverage of the end cost,
    bounds, censored seeds, width."""
    out = []
    for name, per_cost in found.items():
        cells = []
        for t in per_cost.values():
            mean = f"{math.expm1(float(np.mean(t.logs))):+.1%}" if t.logs else "–"
            width = f"×{float(np.median(t.widths)):.2f}" if t.widths else "–"
            cells.append(
                f"{mean}, {t.covered / studies:.0%}, {t.bounds / studies:.0%}, "
                f"{t.censored / max(t.seeds, 1):.0%}, {width}"
            )
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main(argv: Sequence[str] | None = None, emit: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(prog="python -m ablate.bench.targets", description=__doc__)
    parser.add_argument("--studies", type=int, default=1000, help="simulated studies a setting")
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS))
    args = parser.parse_args(argv)
    emit(
        f"{args.studies} simulated studies a setting. Per end cost: mean estimate, coverage of "
        "the end cost, bounds, censored seeds, median width"
    )
    for name in args.setting or list(SETTINGS):
        start = time.perf_counter()
        setting = SETTINGS[name]
        found = rows(simulate(setting, args.studies), args.studies)
        emit(f"\n{name} ({time.perf_counter() - start:.0f} s)")
        emit("| rule | " + " | ".join(f"end cost {c:+.0%}" for c in setting.costs) + " |")
        emit("| --- |" + " --- |" * len(setting.costs))
        for row in found:
            emit(row)


if __name__ == "__main__":
    main()
