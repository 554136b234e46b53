"""Ray across the allocation's nodes, started and stopped by the driver: the head on this node (the
first of the allocation, which runs the batch script) as a child of the driver, and one ``srun``
step that starts a Ray worker node on every other node; both through ``ablate.slurm.on_node``, which
checks the job's ports on its node, supervises that node's Ray and stops it on SIGINT.

Every node's address is its ``NodeAddr`` in SLURM's configuration (``scontrol show node``): the
address the controller reaches it at, and not whatever the hostname resolves to (nodes may share
one, and have several interfaces). The driver's children start with SIGTERM blocked
(``shielded``): see ``on_node``'s docstring for why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ablate.slurm.allocation import Allocation, SlurmError
from ablate.slurm.ports import REFUSED, JobPorts
from ablate.slurm.supervise import on_parent_death

STEP_NAME = "ablate-ray"


def shielded() -> None:
    """``preexec_fn`` of the driver's supervisors (``supervise``): SIGTERM blocked (inherited across
    exec), and SIGINT, their stop, when the driver dies."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    on_parent_death(signal.SIGINT)


def node_addresses(nodes: tuple[str, ...]) -> dict[str, str]:
    """Each node's IP address, from its ``NodeAddr`` (resolved when it is a name). ``SlurmError``
    naming the node when SLURM does not know it or its address does not resolve."""
    res = subprocess.run(
        ["scontrol", "-o", "show", "node", ",".join(nodes)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found: dict[str, str] = {}
    for line in res.stdout.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    out = {}
    for node in nodes:
        if node not in found:
            why = res.stderr.strip() or "not in its output"
            raise SlurmError(f"`scontrol show node {node}` does not give its address ({why})")
        try:
            out[node] = socket.gethostbyname(found[node])
        except OSError as e:
            raise SlurmError(
                f"node {node}: its NodeAddr {found[node]!r} does not resolve ({e})"
            ) from None
    return out


def _on_node(
    role: str, addresses: dict[str, str], head: str, mb: int, dashboard: bool
) -> list[str]:
    cmd = [sys.executable, "-m", "ablate.slurm.on_node", role, "--addresses",
           json.dumps(addresses), f"--object-store-mb={mb}"]  # fmt: skip
    if head:
        cmd.append(f"--head={head}")
    if dashboard:
        cmd.append("--dashboard")
    return cmd


class JobRay:
    """The job's Ray: ``start_head`` launches the head here, ``start_nodes`` the other nodes through
    ``srun``;
    ``check`` raises ``SlurmError`` with a node's refusal once one has refused; ``stop`` ends them
    all. Logs go to ``job_dir`` (``ray-head.log``, ``ray-nodes.log``)."""

    def __init__(
        self, alloc: Allocation, job_dir: Path, *, object_store_mb: int, dashboard: bool
    ) -> None:
        self.alloc, self.job_dir = alloc, job_dir
        self.ports = JobPorts(alloc.job_id)
        self.object_store_mb, self.dashboard = object_store_mb, dashboard
        self.addresses = node_addresses(alloc.nodes)
        self.address = f"{self.addresses[alloc.head]}:{self.ports.gcs}"
        """The GCS address the driver and the other nodes connect to."""
        self._head: subprocess.Popen[bytes] | None = None
        self._srun: subprocess.Popen[bytes] | None = None

    @property
    def others(self) -> list[str]:
        return [n for n in self.alloc.nodes if n != self.alloc.head]

    def start_head(self) -> None:
        """Start the head's Ray here (it comes up in the background: ``start_nodes`` waits)."""
        with open(self.job_dir / "ray-head.log", "ab") as log:
            self._head = subprocess.Popen(
                _on_node("head", self.addresses, "", self.object_store_mb, self.dashboard),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=shielded,
            )  # fmt: skip

    def start_nodes(self) -> None:
        """Once the head listens, start a Ray node on every other node: one ``srun`` step."""
        self._wait_gcs(timeout=120)
        if not self.others:
            return
        n = len(self.others)
        cpus = min(self.alloc.cpus_of(x) for x in self.others)
        cmd = [
            "srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
            f"--nodelist={','.join(self.others)}", f"--cpus-per-task={cpus}", "--mem=0",
            f"--job-name={STEP_NAME}", "--kill-on-bad-exit=0",
        ]  # fmt: skip
        if self.alloc.gpus_per_node:
            cmd.append(f"--gres=gpu:{self.alloc.gpus_per_node}")
        cmd += _on_node("worker", self.addresses, self.address, self.object_store_mb, False)
        with open(self.job_dir / "ray-nodes.log", "ab") as log:
            # SIGTERM blocked, as in the supervisors; no parent-death signal: the nodes stop by
            # themselves once the head's Ray is gone (on_node)
            self._srun = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}),
            )  # fmt: skip

    def _wait_gcs(self, timeout: float) -> None:
        host, port = self.address.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
                return
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"Ray's head did not listen at {self.address} within {timeout:g} s: "
                    f"{self._tail('ray-head.log')}"
                )
            time.sleep(0.2)

    def _tail(self, name: str, n: int = 800) -> str:
        text = (
            (self.job_dir / name).read_text(errors="replace")
            if (self.job_dir / name).exists()
            else ""
        )
        lines = [x for x in text.splitlines() if x.startswith(("ablate node", "srun:"))]
        return ("; ".join(lines[-6:]) or text[-n:]).strip() + f" (log: {self.job_dir / name})"

    def check(self) -> None:
        """Raise ``SlurmError`` when the head or a node has refused (its ports are taken), or
        ``RunnerError`` when one ended otherwise."""
        for proc, name, what in (
            (self._head, "ray-head.log", f"the head ({self.alloc.head})"),
            (self._srun, "ray-nodes.log", f"the nodes {','.join(self.others)}"),
        ):
            if proc is None or proc.poll() is None:
                continue
            if proc.returncode == REFUSED or self._refused(name):
                raise SlurmError(self._tail(name))
            raise SlurmError(
                f"Ray on {what} ended with status {proc.returncode}: {self._tail(name)}"
            )

    def _refused(self, name: str) -> bool:
        path = self.job_dir / name
        return path.exists() and ": refused: " in path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGINT to the head's supervisor (which kills its Ray and removes its temporary folder),
        and to the other nodes' through ``scancel`` (they also stop by themselves once the head's
        Ray is gone: SLURM refuses signals to a job it is ending); SIGKILL what does not end in
        15 s."""
        srun, self._srun = self._srun, None
        head, self._head = self._head, None
        if head is not None and head.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(head.pid, signal.SIGINT)
        if srun is not None and srun.poll() is None and (step := self._step()):
            subprocess.run(["scancel", "--signal=INT", step], capture_output=True, timeout=60)
        for proc, step_kill in ((head, False), (srun, True)):
            if proc is None:
                continue
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                if step_kill and (step := self._step()):
                    subprocess.run(["scancel", "--signal=KILL", step], capture_output=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def _step(self) -> str:
        """The ``<job>.<step>`` of the nodes' ``srun`` ("" when SLURM does not list it)."""
        res = subprocess.run(
            ["squeue", "--steps", f"--jobs={self.alloc.job_id}", "--noheader", "--format=%i %j"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        for line in res.stdout.splitlines():
            step, _, name = line.strip().partition(" ")
            if name.strip() == STEP_NAME:
                return step
        return ""
