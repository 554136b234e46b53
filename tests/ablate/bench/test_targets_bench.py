"""The target-rule simulation (``ablate.bench.targets``) on a few hundred studies: what
docs/report.md's table says, held by the numbers (a constant cost read alike by every rule that
reads the baseline at 75% of its budget; a cost that grows late read ever lower the earlier the
target; the median rule censoring more seeds than the slowest one)."""

from __future__ import annotations

import math

import numpy as np

from ablate.bench.targets import EQUAL_LOSS, Setting, main, simulate


def _mean(tally) -> float:
    return math.expm1(float(np.mean(tally.logs)))


def test_a_constant_cost_is_read_alike_and_covered_at_75_percent_of_the_budget():
    n = 120
    found = simulate(Setting(seeds=3, gamma=0.0, costs=(0.1,)), n)
    for rule in ("slowest@0.75", "median@0.75", EQUAL_LOSS):
        t = found[rule][0.1]
        assert abs(_mean(t) - 0.1) < 0.01, rule
        assert t.covered / n >= 0.9 and t.bounds == 0, rule


def test_a_cost_that_grows_late_is_read_lower_the_earlier_the_target():
    n = 200
    found = simulate(Setting(seeds=3, gamma=2.0, costs=(0.3,)), n)
    slowest, median = found["slowest@0.75"][0.3], found["median@0.75"][0.3]
    late = found[EQUAL_LOSS][0.3]
    assert _mean(slowest) < _mean(median) < _mean(late) < 0.3
    assert slowest.censored < median.censored  # the later target leaves more seeds short of it
    assert late.censored == 0 and late.bounds == 0  # the paired end reading: never censored
    assert found["final"][0.3].bounds > 0.9 * n  # the baseline's end: nothing but bounds


def test_the_command_prints_a_table_per_setting():
    lines: list[str] = []
    main(["--studies", "20", "--setting", "constant cost, 3 seeds"], emit=lines.append)
    assert lines[1].startswith("\nconstant cost, 3 seeds")
    assert lines[2] == "| rule | end cost +10% | end cost +30% |"
    assert sum(line.startswith("| slowest@0.75 |") for line in lines) == 1
