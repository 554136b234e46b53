"""A cell that a real local Ray holds without starting it (the one CPU is taken by the other cell)
is reported in the progress output: which cell, what it asks for, what the cluster has free."""

from __future__ import annotations

import io
import re

import pytest
from mlflow.tracking import MlflowClient
from test_runner import tiny_study

from ablate.runner import run_study


@pytest.mark.slow
def test_a_cell_that_waits_for_a_cpu_is_reported_with_what_it_asks_and_what_is_free(tmp_path):
    study = tiny_study(tmp_path, steps=200, seed=[0, 1])  # ~10 s a cell on one core, and its start
    out = io.StringIO()
    res = run_study(
        study, executor="ray", num_cpus=1, progress=False, stream=out, wait_warning_s=2.0
    )
    text = out.getvalue()
    assert sorted(o.status for o in res.outcomes.values()) == ["finished", "finished"], text
    lines = [x for x in text.splitlines() if x.startswith("waiting for resources: ")]
    assert lines, text
    # the cell that started second (its run's clock starts when it starts) waited for the first
    client = MlflowClient(tracking_uri=study.tracking_uri)
    start = {k: client.get_run(rid).info.start_time for k, rid in res.run_ids.items()}
    second = next(c.label for c in study.cells if start[c.key] == max(start.values()))
    alone = [x for x in lines if "more cell(s) wait" not in x]  # once the first one ran
    assert alone, lines
    assert all(
        re.search(f"cell {re.escape(second)} was submitted \\d+m\\d\\ds ago", x) for x in alone
    )
    assert (
        "and has not started; a cell asks for 1 CPU(s) and 0 GPU(s) (resources); the Ray "
        "cluster has 0 of 1 CPUs free and 0 of 0 GPUs free; this study has 2 cell(s) on the "
        "cluster now." in alone[0]
    )
    # again every 5 x 2 s while it waits, not more often
    waited = [
        int(m) * 60 + int(s) for m, s in (re.findall(r"(\d+)m(\d\d)s ago", x)[0] for x in lines)
    ]
    assert all(b - a >= 9 for a, b in zip(waited, waited[1:], strict=False)), lines
