"""The ports and folders of one job's Ray and MLflow server, derived from the job id so that two jobs
on one node (a shared node, or two of a user's jobs) never pick the same ones, and the check that
they are free on a node before anything starts there.

Ray's defaults collide: every ``ray start --head`` listens on 6379 (GCS), 10001 (client server),
8265 (dashboard) and 52365 (dashboard agent), and its workers take ports 10002-19999 (Ray issues
#59551, #58875). Here each job gets a block of ``BLOCK`` ports at ``BASE + (job id mod SLOTS) *
BLOCK``, below Linux's ephemeral range (32768 and up, where the OS picks the ports Ray leaves at 0),
and a Ray temporary folder of its own per node: ``/tmp/ablate-<job>-<node>`` (short: Ray's socket
paths, under it, must stay within the 107 bytes of a Unix socket name).

Two jobs whose ids are equal modulo ``SLOTS`` would share a block; the check before the start
(``ports_taken``) refuses then, naming the port and the process that listens on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

BASE = 20000
BLOCK = 64
SLOTS = (32768 - BASE) // BLOCK  # 199 blocks below the ephemeral range
FIXED = 8  # the first ports of a block: the named ones below, and room for more
REFUSED = 3
"""Exit status of a node that refuses to start because the job's ports are taken there."""


@dataclass(frozen=True)
class JobPorts:
    """One job's ports (see the module docstring)."""

    job_id: int

    @property
    def base(self) -> int:
        return BASE + (self.job_id % SLOTS) * BLOCK

    @property
    def gcs(self) -> int:
        return self.base

    @property
    def client_server(self) -> int:
        return self.base + 1

    @property
    def dashboard(self) -> int:
        return self.base + 2

    @property
    def dashboard_agent(self) -> int:
        return self.base + 3

    @property
    def mlflow(self) -> int:
        return self.base + 4

    @property
    def workers(self) -> tuple[int, int]:
        """Ray's worker ports, first and last (inclusive)."""
        return self.base + FIXED, self.base + BLOCK - 1

    def named(self, *, head: bool, mlflow: bool = True) -> dict[int, str]:
        """Port -> what uses it, for the head node (``head``; with the MLflow server's unless not
        ``mlflow``) or a worker node."""
        lo, hi = self.workers
        out = {p: "a Ray worker" for p in range(lo, hi + 1)}
        out[self.dashboard_agent] = "Ray's dashboard agent"
        if head:
            out.update(
                {
                    self.gcs: "Ray's GCS",
                    self.client_server: "Ray's client server",
                    self.dashboard: "Ray's dashboard",
                }
            )
            if mlflow:
                out[self.mlflow] = "the MLflow server"
        return dict(sorted(out.items()))

    def describe(self) -> str:
        return f"ports {self.base}-{self.base + BLOCK - 1} (job {self.job_id} mod {SLOTS})"


def temp_dir(job_id: int, node: str) -> Path:
    """Ray's temporary folder for one job on one node; node names past 16 characters are hashed
    (the path stays short: see the module docstring)."""
    tag = node if len(node) <= 16 else node[:8] + hashlib.sha1(node.encode()).hexdigest()[:8]
    return Path("/tmp") / f"ablate-{job_id}-{tag}"


def _listening(port: int) -> bool:
    """Whether a socket listens on ``port`` on any address of this node (IPv4 or IPv6)."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR: a connection of a job that ended (TIME_WAIT) does not count, a
            # listener does, as it does for Ray's and MLflow's own binds
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((addr, port))
            except OSError as e:
                if e.errno == 98:  # EADDRINUSE
                    return True
                continue  # no IPv6 on this node
    return False


def holder(port: int) -> str:
    """Who listens on TCP ``port`` here, as ``pid N (command)``, from /proc; "" when it cannot be
    told (another user's process, or no /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f[9])
    if not inodes:
        return ""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    return f"pid {pid} ({cmd.decode(errors='replace').strip()[:120]})"
    return ""


def ports_taken(ports: dict[int, str]) -> list[str]:
    """The ports of ``ports`` (port -> what would use it) that a process on this node listens on
    already, each as a line naming the port, its use and the process if it can be told."""
    out = []
    for port, use in ports.items():
        if _listening(port):
            who = holder(port)
            out.append(f"port {port} (for {use}) is taken{f' by {who}' if who else ''}")
    return out
