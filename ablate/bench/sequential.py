"""How often sequential seeds decide wrongly, and how many runs they spend, on simulated studies:
``python -m ablate.bench.sequential [--studies 2000]``.

Each setting is a study of four configurations against one baseline, trained in waves of seeds as
``ablate.report.sequential`` plans them (3 seeds, then 2 more for each comparison still open, up to
10), with log tokens to target ``mu + delta_j + a_i + e_ij`` (a seed effect ``a_i`` shared by every
configuration, sd 0.1; run noise ``e_ij``), runs that stall left out of their pair, and runs past a
budget censored there. Columns, over the studies:

    error       family-wise: the share of studies in which any comparison was decided wrongly
                (slower or faster against the truth, or equivalent outside the margin) at any
                look, with two standard errors; the confidence sequence's, then the same waves
                judged by a fixed-n t interval (t_0.975) at every look
    decided     the share of comparisons decided, sequential and fixed (one look at 10 seeds, the
                confidence sequence's level)
    runs        mean runs a study trained against the fixed design's 50 (10 seeds x 5 arms)

The table in docs/report.md is this module's output.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field

from ablate.report.sequential import MARGIN, Outcome, simulate
from ablate.study.seeds import SeedPlan

M = MARGIN


@dataclass(frozen=True)
class Setting:
    """True log token ratios of the four configurations; run noise (sd, log tokens); each run's
    stall probability; the censoring point (log tokens above the baseline's mean) or None."""

    deltas: tuple[float, ...]
    sigma: float = 0.05
    stall_p: float = 0.0
    censor_at: float | None = None
    plan: SeedPlan = field(default_factory=SeedPlan)


SETTINGS = {
    "no effect anywhere": Setting((0.0, 0.0, 0.0, 0.0)),
    "at the boundaries (0, +-5%, 2%)": Setting((0.0, M, -M, 0.02)),
    "mixed (0, +5%, +35%, -9.5%)": Setting((0.0, 0.05, 0.3, -0.1)),
    "mixed, stalls 0.1, censored at +28%": Setting(
        (0.0, M, 0.3, -0.1), stall_p=0.1, censor_at=0.25
    ),
    "quiet runs (sd 0.02): 0, +2%, +10.5%, +35%": Setting((0.0, 0.02, 0.1, 0.3), sigma=0.02),
}


def run(s: Setting, studies: int, seed: int) -> tuple[Outcome, Outcome]:
    """The confidence sequence's outcome and the naive repeated t intervals', on the same draws."""
    kw = dict(plan=s.plan, sigma=s.sigma, stall_p=s.stall_p, censor_at=s.censor_at, studies=studies)
    return simulate(s.deltas, seed=seed, **kw), simulate(s.deltas, seed=seed, naive=True, **kw)  # type: ignore[arg-type]


def _pm(p: float, n: int) -> str:
    return f"{100 * p:.1f}% ± {200 * math.sqrt(max(p * (1 - p), 1e-12) / n):.1f}"


def table(studies: int, seed: int = 0) -> str:
    head = (
        "| setting | error (sequential) | error (repeated t) | decided (sequential / fixed) "
        "| runs (sequential / fixed) |\n| --- | --- | --- | --- | --- |"
    )
    rows = [head]
    for name, s in SETTINGS.items():
        seq, naive = run(s, studies, seed)
        dec = sum(seq.decided) / len(seq.decided)
        fix = sum(seq.fixed_decided) / len(seq.fixed_decided)
        rows.append(
            f"| {name} | {_pm(seq.family_error, studies)} | {_pm(naive.family_error, studies)} "
            f"| {100 * dec:.0f}% / {100 * fix:.0f}% | {seq.mean_seeds:.1f} / {seq.fixed_seeds} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ablate.bench.sequential", description=__doc__)
    ap.add_argument("--studies", type=int, default=2000, help="studies per setting (2000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(table(args.studies, args.seed))
    print(f"\n{args.studies} studies a setting, {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
