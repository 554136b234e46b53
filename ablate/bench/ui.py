"""``python -m ablate.bench.ui STORE.db``: how long the MLflow UI takes to answer and how much
memory it holds, MLflow's default ``mlflow ui`` against ``ablate ui`` on the same SQLite store, in
one run (time to the first ``/health`` answer; resident memory of the whole process tree 5 s later;
``--repeat`` runs each, medians printed)."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ablate.tracking.ui import descendants


def _rss_mb(pid: int) -> float:
    total = 0
    for p in [pid, *(q for q, _ in descendants(pid))]:
        try:
            for line in (Path("/proc") / str(p) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def measure(cmd: list[str], port: int, settle_s: float = 5.0) -> tuple[float, float]:
    """(seconds to the first /health answer, resident MB of the process tree after ``settle_s``)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd[:2]} exited with {proc.returncode}") from None
                time.sleep(0.2)
        seconds = time.monotonic() - t0
        time.sleep(settle_s)
        return seconds, _rss_mb(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        time.sleep(2)  # the port and the children go


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("store", help="an MLflow SQLite file, e.g. runs/quickstart/mlflow.db")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--port", type=int, default=5071)
    args = ap.parse_args(argv)
    uri = "sqlite:///" + str(Path(args.store).resolve())
    exe = Path(sys.executable).parent
    commands = {
        "mlflow ui (MLflow's defaults)": [str(exe / "mlflow"), "ui", "--backend-store-uri", uri],
        "ablate ui": [str(exe / "ablate"), "ui", "--tracking-uri", uri],
    }
    for name, cmd in commands.items():
        runs = [measure([*cmd, "--port", str(args.port)], args.port) for _ in range(args.repeat)]
        t = statistics.median(s for s, _ in runs)
        m = statistics.median(mb for _, mb in runs)
        each = ", ".join(f"{s:.1f} s / {mb:.0f} MB" for s, mb in runs)
        print(f"{name:32s} first answer {t:5.1f} s, {m:6.0f} MB resident (runs: {each})")


if __name__ == "__main__":
    main()
