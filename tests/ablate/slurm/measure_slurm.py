"""Measures what docs/slurm.md reports, on the tests' real two-node SLURM (``slurm_cluster``; needs
root and the SLURM packages): ``python tests/ablate/slurm/measure_slurm.py``.

- submit to the first cell training: from ``ablate slurm submit`` returning to the first training
  step a cell recorded (its train_loss point's timestamp), for a two-cell CPU study on both nodes,
  with the job's MLflow server; and the same for one node (SQLite, no server);
- the overhead per job: the job's wall time (SLURM's start to end) less the span its cells trained
  (the first cell's first step to the last cell's last): reading the allocation, Ray on every
  node, the MLflow server, the cells' own start (a Ray worker importing torch, MLflow), the stop;
- the job's own account of its start-up (``slurm: <time> Ray on N node(s) ... (X s)``);
- a job with nothing left to run (the same study submitted again once it has ended): no Ray.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_cluster import missing  # noqa: E402
from slurm_scenario import free_cluster, read_runs  # noqa: E402

STUDY = """name: slurm-measure
base:
  model: {preset: tiny}
  data: {corpus: builtin, val_tokens: 4096}
  train: {steps: 40, batch_size: 4, seq_len: 64, eval_every: 20, eval_batches: 2}
  device: cpu
grid: {seed: [0, 1]}
"""


def _seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def _submit(root: Path, env: dict[str, str], out: str, nodes: int) -> tuple[str, float]:
    res = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "slurm", "submit", str(root / "study.yaml"),
         "--nodes", str(nodes), "--time", "30", "-o", str(root / out), "--no-report"],
        cwd=root, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return res.stdout.strip(), time.time()


def measure(cluster, root: Path) -> dict[str, object]:  # type: ignore[no-untyped-def]
    env = {**cluster.env, "PYTHONUNBUFFERED": "1"}
    (root / "study.yaml").write_text(STUDY)
    subprocess.run(
        [sys.executable, "-m", "ablate.cli", "data", "prepare", str(root / "study.yaml")],
        cwd=root, env=env, check=True, capture_output=True,
    )  # fmt: skip
    figures: dict[str, object] = {}
    for nodes in (2, 1):
        out = f"n{nodes}"
        job, submitted = _submit(root, env, out, nodes)
        info = cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 900)
        points = [
            t / 1000
            for rs in read_runs(root / out / "mlflow.db").values()
            for r in rs
            for _, _, t in r["metrics"]["train_loss"]
        ]
        wall = _seconds(info["EndTime"]) - _seconds(info["StartTime"])
        log = (root / out / "slurm" / f"job-{job}.out").read_text()
        figures[f"{nodes} node(s): submit to first cell training (s)"] = round(
            min(points) - submitted, 1
        )
        figures[f"{nodes} node(s): job wall time (s)"] = wall
        # the job's time outside its cells' training: start-up, the cells' own start, the stop
        figures[f"{nodes} node(s): overhead per job (s)"] = round(
            wall - (max(points) - min(points)), 1
        )
        figures[f"{nodes} node(s): the job's start-up lines"] = re.findall(
            r"slurm: \S+ (?:Ray on|MLflow server)[^\n]*", log
        )
        again, _ = _submit(root, env, out, nodes)  # nothing left to run: no Ray is started
        info = cluster.wait_state(again, ("COMPLETED", "FAILED", "CANCELLED"), 900)
        figures[f"{nodes} node(s): a job with nothing left to run (s)"] = _seconds(
            info["EndTime"]
        ) - _seconds(info["StartTime"])
    figures["load average at the end"] = os.getloadavg()
    return figures


def main() -> None:
    why = missing()
    if why:
        sys.exit(f"no real SLURM here: {why}")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="abl-measure-") as tmp, free_cluster() as cluster:
        figures = measure(cluster, Path(tmp))
    figures["load average at the start"] = load
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
