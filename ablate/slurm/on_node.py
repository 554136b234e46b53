"""What runs on each node of the allocation: ``python -m ablate.slurm.on_node``, that node's Ray
(the head's, started by the driver; the others', by one ``srun`` over the rest of the nodes).

It checks the job's ports on its node first (``ports.ports_taken``: another job, or a Ray started
by hand, would collide) and refuses with exit status ``REFUSED`` naming them; then it runs ``ray
start --block`` with the job's ports, temporary folder, token and this node's CPUs and GPUs under
``supervise`` (SIGTERM blocked, so that the cells outlive SLURM's signal until the driver has let
them checkpoint; SIGINT, from the driver, stops it), and removes the temporary folder at the end.
A worker node also stops once the head's Ray is gone, and starts its Ray again (``STARTS``) when
it fails while the head is there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ablate.slurm.allocation import SlurmError, read_allocation
from ablate.slurm.ports import REFUSED, JobPorts, ports_taken, temp_dir
from ablate.slurm.supervise import supervise

STARTS = 3
"""How often a worker node starts its Ray before it gives up."""


def ray_command(
    role: str, ports: JobPorts, node_ip: str, head: str, cpus: int, gpus: int, temp: Path,
    object_store_mb: int, dashboard: bool,
) -> list[str]:  # fmt: skip
    """The ``ray start --block`` of one node: every port from the job's block (Ray's fixed defaults
    would collide with another job's), the job's temporary folder, usage stats off."""
    exe = Path(sys.executable).with_name("ray")
    lo, hi = ports.workers
    cmd = [
        str(exe if exe.exists() else "ray"), "start", "--block",
        f"--node-ip-address={node_ip}", f"--num-cpus={cpus}", f"--num-gpus={gpus}",
        f"--object-store-memory={object_store_mb * 2**20}", f"--temp-dir={temp}",
        f"--min-worker-port={lo}", f"--max-worker-port={hi}",
        f"--dashboard-agent-listen-port={ports.dashboard_agent}", "--disable-usage-stats",
    ]  # fmt: skip
    if role == "head":
        # no autoscaler monitor (the allocation's nodes are all there is): one process fewer
        cmd += [
            "--head", f"--port={ports.gcs}", f"--ray-client-server-port={ports.client_server}",
            "--no-monitor",
            f"--include-dashboard={str(dashboard).lower()}", f"--dashboard-port={ports.dashboard}",
            f"--dashboard-host={node_ip}",
        ]  # fmt: skip
    else:
        cmd.append(f"--address={head}")
    return cmd


def _head_gone(address: str) -> Callable[[], bool]:
    """Whether the head's Ray has gone (its GCS refused three connections in a row, a second
    apart): a worker node then stops, as SLURM does not pass it the driver's SIGINT while it ends
    the job."""
    host, port = address.rsplit(":", 1)
    misses: list[float] = []

    def gone() -> bool:
        if misses and time.monotonic() - misses[-1] < 1:
            return False
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                misses.clear()
        except OSError:
            misses.append(time.monotonic())
        return len(misses) >= 3

    return gone


def _say(node: str, message: str) -> None:
    print(f"ablate node {node}: {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablate.slurm.on_node", description=__doc__)
    p.add_argument("role", choices=["head", "worker"])
    p.add_argument("--addresses", required=True, help="JSON: node name -> its IP address")
    p.add_argument("--head", default="", help="the head's GCS address (workers)")
    p.add_argument("--object-store-mb", type=int, default=256)
    p.add_argument("--dashboard", action="store_true")
    args = p.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # from the start: see supervise
    try:
        alloc = read_allocation(os.environ)
    except SlurmError as e:
        print(f"ablate node: {e}", file=sys.stderr, flush=True)
        return REFUSED
    node = alloc.this_node or alloc.head
    ports = JobPorts(alloc.job_id)
    taken = ports_taken(ports.named(head=args.role == "head", mlflow=False))
    if taken:
        print(
            f"ablate node {node}: refused: {'; '.join(taken[:4])}"
            f"{f' (and {len(taken) - 4} more)' if len(taken) > 4 else ''}: another job's Ray or "
            f"MLflow on this node (or one started by hand) uses job {alloc.job_id}'s "
            f"{ports.describe()}; stop it, or run the study in another job",
            file=sys.stderr,
            flush=True,
        )
        return REFUSED
    temp = temp_dir(alloc.job_id, node)
    shutil.rmtree(temp, ignore_errors=True)  # a killed attempt's: its ports are free
    gpus = int(os.environ.get("SLURM_GPUS_ON_NODE") or alloc.gpus_per_node)
    ip = json.loads(args.addresses)[node]
    cmd = ray_command(
        args.role, ports, ip, args.head, alloc.cpus_of(node), gpus, temp, args.object_store_mb,
        args.dashboard,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if args.role == "head":
        # `ray start --head` works out a default node address (asking the route to 8.8.8.8) even
        # when given one; with this it takes loopback instead, and the given address wins. Its
        # other effect (a worker node refuses to start) does not concern the head.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        for attempt in range(1, STARTS + 1):
            until = _head_gone(args.head) if args.role == "worker" else None
            code = supervise(cmd, env=env, grace=0, say=lambda m: _say(node, m), until=until)
            # a worker node whose Ray gave up (``ray start`` allows a node 30 s to register,
            # which a loaded machine can miss) starts again while the head is there; the head's
            # failure is the driver's to report
            if code == 0 or args.role == "head" or attempt == STARTS or (until and until()):
                return code
            _say(node, f"Ray ended with status {code}; starting it again ({attempt + 1}/{STARTS})")
            shutil.rmtree(temp, ignore_errors=True)
        return code
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        _say(node, "Ray stopped")


if __name__ == "__main__":
    sys.exit(main())
