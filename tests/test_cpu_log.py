"""The suite's CPU log (``tests/cpu_log.py``): a pytest run with ``ABLATE_TEST_CPU_LOG`` records
each test's own CPU apart from the CPU of the children it ran and from its wait, and the summary
sums them by file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cpu_log import ENV, read, summary

TESTS = """
import subprocess, sys, time

def test_computes():
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass

def test_waits_on_a_child_that_computes():
    time.sleep(0.3)
    subprocess.run([sys.executable, "-c",
        "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"])
"""


def test_each_test_is_recorded_with_its_own_and_its_childrens_cpu(tmp_path):
    (tmp_path / "test_fake.py").write_text(TESTS)
    log = tmp_path / "log"
    env = {**os.environ, ENV: str(log), "PYTHONPATH": str(Path(__file__).parent)}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "cpu_log", "-p", "no:cacheprovider"]
    res = subprocess.run(
        [*cmd, "test_fake.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    tests = {t["id"]: t for t in read(log)}
    assert [p.name for p in log.iterdir()] == ["main.jsonl"]
    computes, waits = (
        tests["test_fake.py::test_computes"],
        tests["test_fake.py::test_waits_on_a_child_that_computes"],
    )
    assert computes["cpu"] >= 0.35 and computes["child"] < 0.05
    assert waits["cpu"] < 0.2 and waits["child"] >= 0.35
    assert waits["t1"] - waits["t0"] >= 0.7 and waits["t0"] >= computes["t1"]
    assert computes["idle"] is None or computes["idle"] >= 0
    text = summary(list(tests.values()))
    assert text.startswith("2 tests in 1 process(es)")
    (row,) = [x for x in text.splitlines() if x.endswith("test_fake.py")]
    cpu = float(row.split()[0])
    assert cpu == round(sum(t["cpu"] + t["child"] for t in tests.values()), 1)
    assert summary([]) == "no tests recorded"
