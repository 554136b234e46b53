"""Where the suite's CPU goes, test by test. With ``ABLATE_TEST_CPU_LOG=<folder>`` each process
that runs tests (each pytest-xdist worker; ``tests/conftest.py`` turns it on, ``-p cpu_log`` does
elsewhere) appends one JSON line per test to ``<folder>/<worker>.jsonl``: the test's id, its wall
start and end (``time.time``), the CPU seconds of the test process itself (``cpu``) and of the
child processes it reaped meanwhile (``child``), and the machine's idle core-seconds meanwhile
(``idle``, from ``/proc/stat``; None where there is none). ``python tests/cpu_log.py <folder>``
sums them by test file.

Why not ``--durations``: the suite keeps both cores of the 2-core machines busy (the machine was
idle 109 of 3,098 core-seconds of a two-worker run on 2026-11-27), so a test's wall time says as
much about what ran beside it as about the test: native FP8 through Inductor took 70 s of wall on
16 s of CPU beside the SLURM scenario's start. What a process does not reap is not in ``child``:
Ray's daemons and workers, the SLURM daemons, ``mlflow server``, ranks forked from a fork server;
the machine's idle time says how busy the rest was. A child started in one test and reaped in a
later one (the SLURM scenario's process, started with the session) counts in the later one."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ENV = "ABLATE_TEST_CPU_LOG"


def machine_idle() -> float | None:
    """The machine's idle core-seconds since boot (idle + iowait of ``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


class Recorder:
    """The plugin: one JSON line per test, written as the test ends."""

    def __init__(self, folder: Path) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._path = folder / f"{worker}.jsonl"
        self._file: Any = None  # opened by the first test (pytest-xdist's controller runs none)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        t0, c0, i0 = time.time(), os.times(), machine_idle()
        yield
        t1, c1, i1 = time.time(), os.times(), machine_idle()
        line = {
            "id": item.nodeid,
            "t0": t0,
            "t1": t1,
            "cpu": round(c1.user - c0.user + c1.system - c0.system, 3),
            "child": round(
                c1.children_user - c0.children_user + c1.children_system - c0.children_system, 3
            ),
            "idle": None if i0 is None or i1 is None else round(i1 - i0, 2),
        }
        if self._file is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._path, "a", buffering=1)  # noqa: SIM115
        self._file.write(json.dumps(line) + "\n")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._file is not None:
            self._file.close()


def activate(config: pytest.Config) -> None:
    """Register the recorder when ``ABLATE_TEST_CPU_LOG`` names a folder (once per process)."""
    folder = os.environ.get(ENV)
    if folder and not config.pluginmanager.has_plugin("ablate-cpu-log"):
        config.pluginmanager.register(Recorder(Path(folder)), "ablate-cpu-log")


pytest_configure = activate  # as a plugin of its own: ``pytest -p cpu_log``


def read(folder: Path) -> list[dict[str, Any]]:
    """Every test's line from every process's file in ``folder``, ``worker`` added."""
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        for text in path.read_text().splitlines():
            if text.strip():
                out.append({**json.loads(text), "worker": path.stem})
    return out


def summary(tests: list[dict[str, Any]], top: int = 25) -> str:
    """The CPU of the test processes and their reaped children, by test file, largest first,
    with each file's wall time and share; the machine's idle share over the run."""
    if not tests:
        return "no tests recorded"
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for t in tests:
        name = t["id"].split("::")[0]
        cpu[name] += t["cpu"] + t["child"]
        wall[name] += t["t1"] - t["t0"]
    total = sum(cpu.values())
    span = max(t["t1"] for t in tests) - min(t["t0"] for t in tests)
    workers = len({t["worker"] for t in tests})
    lines = [
        f"{len(tests)} tests in {workers} process(es) over {span:.0f} s; CPU of the test "
        f"processes and their reaped children {total:.0f} s"
    ]
    idle = [t["idle"] for t in tests if t.get("idle") is not None]
    if idle and span > 0:
        # each process's tests see the same machine: its idle time counted once per process
        lines.append(
            f"machine idle: {sum(idle) / workers:.0f} core-s ({sum(idle) / workers / span:.1f} "
            "cores on average)"
        )
    lines.append(f"{'CPU s':>8} {'wall s':>8} {'share':>6}  file")
    for name in sorted(cpu, key=lambda n: -cpu[n])[:top]:
        share = cpu[name] / total if total else 0.0
        lines.append(f"{cpu[name]:8.1f} {wall[name]:8.1f} {share:6.1%}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/cpu_log.py <folder of ABLATE_TEST_CPU_LOG>")
    print(summary(read(Path(sys.argv[1]))))
