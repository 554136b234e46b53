"""A real two-node SLURM on this machine, for the tests: Debian's ``slurmctld``, two ``slurmd`` and a
``munged`` of its own, each node in a network namespace of its own on a bridge.

Everything it makes is named after its index (one per pytest-xdist worker, so that two workers'
clusters never share a name, an address or a port): the folder ``/tmp/abl-slurm<i>`` (config,
state, spool, logs, munge's socket and key), the bridge ``abl<i>br`` (``10.213.<40+i>.1/24``, the
controller's address), and per node ``n1``, ``n2`` the namespace ``abl<i>n1`` with a veth pair
``abl<i>v1``/``abl<i>v1p`` and the address ``10.213.<40+i>.11``, ``.12``. It sends traffic only to
those addresses and to loopback. ``stop`` removes all of it, also after a failed start.

The namespaces share the file system (munge's socket, the spool folders, the job outputs), as the
nodes of a cluster share one; they also share the hostname, so a node is known by
``SLURMD_NODENAME``. Slurm 22.05 needs the controller to be named by the machine's hostname, the
cgroup v1 plugin configured (without it slurmd does not start), and ``proctrack/linuxproc`` with
``task/none`` where the machine has no systemd. ``SlurmdParameters=config_overrides`` lets a node
declare more CPUs than the machine has, so that two jobs of a few one-CPU cells share node n1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "ip")


def missing() -> str:
    """Why a real SLURM cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, slurmd)"
    gone = [d for d in DAEMONS if shutil.which(d) is None]
    if gone:
        return f"{', '.join(gone)} not installed (apt-get install slurmctld slurmd munge iproute2)"
    return ""


def _run(*cmd: str, check: bool = True, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.returncode}: {res.stderr.strip()}")
    return res.stdout


class SlurmCluster:
    """One controller and ``nodes`` compute nodes of ``cpus`` CPUs each (see the module docstring)."""

    def __init__(self, index: int, *, nodes: int = 2, cpus: int = 2, kill_wait: int = 30) -> None:
        self.index = index
        self.root = Path(f"/tmp/abl-slurm{index}")
        self.net = f"10.213.{40 + index}"
        self.bridge = f"abl{index}br"
        self.nodes = [f"n{k}" for k in range(1, nodes + 1)]
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.ctld_port = 16817 + 10 * index
        self.slurmd_port = 16818 + 10 * index
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[subprocess.Popen[bytes]] = []

    def address(self, node: str) -> str:
        return f"{self.net}.{10 + int(node[1:])}"

    def netns(self, node: str) -> str:
        return f"abl{self.index}{node}"

    # --- set-up --------------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        self.stop()  # what a killed earlier run left
        try:
            self.root.mkdir(parents=True)
            self._munge()
            self._network()
            self._write_config()
            self._daemons()
        except BaseException:
            self.stop()
            raise
        return self

    def _munge(self) -> None:
        d = self.root / "munge"
        d.mkdir()
        d.chmod(0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.root.chmod(0o755)
        shutil.chown(d, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        _run(
            "runuser", "-u", "munge", "--", "munged", f"--socket={d}/sock",
            f"--key-file={key}", f"--pid-file={d}/pid", f"--log-file={d}/log",
            f"--seed-file={d}/seed",
        )  # fmt: skip
        for _ in range(50):
            if (d / "sock").exists():
                return
            time.sleep(0.1)
        raise RuntimeError(f"munged did not start: {(d / 'log').read_text()[-500:]}")

    def _network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for node in self.nodes:
            ns, k = self.netns(node), node[1:]
            veth, peer = f"abl{self.index}v{k}", f"abl{self.index}v{k}p"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(node)}/24",
                 "dev", peer)  # fmt: skip
            _run("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def _write_config(self) -> None:
        r = self.root
        for sub in ("state", "spool", "jobs", *(f"spool/{n}" for n in self.nodes)):
            (r / sub).mkdir()
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.address(n)} CPUs={self.cpus} RealMemory=4000 "
            "State=UNKNOWN"
            for n in self.nodes
        )
        self.conf.write_text(
            f"""ClusterName=ablate{self.index}
SlurmctldHost={socket.gethostname()}({self.net}.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge/sock,cred_expire=5
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait={self.kill_wait}
InactiveLimit=0
PlugStackConfig={r}/plugstack.conf
{nodes}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (r / "plugstack.conf").write_text("")
        (r / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n"
        )

    def _daemons(self) -> None:
        log = open(self.root / "daemons.out", "ab")  # noqa: SIM115 (closed with the processes)
        self._procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )  # fmt: skip
        )
        for node in self.nodes:
            self._procs.append(
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        self.netns(node),
                        "slurmd",
                        "-D",
                        "-N",
                        node,
                        "-f",
                        str(self.conf),
                    ],
                    env=self.env,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )  # fmt: skip
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited: {self.logs()}")
            out = _run("sinfo", "-h", "-N", "-o", "%N %t", check=False, env=self.env)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the nodes did not come up: {self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")) + [self.root / "daemons.out"]:
            if f.is_file():
                out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # --- use -----------------------------------------------------------------------------------

    def run(self, *cmd: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        """A SLURM client command (``sbatch``, ``scontrol``, ...) against this cluster."""
        return _run(*cmd, check=check, env={**self.env, **(env or {})})

    def job_state(self, job: str) -> dict[str, str]:
        """``scontrol show job`` as a mapping (JobState, NodeList, Restarts, ExitCode...)."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False)
        fields: dict[str, str] = {}
        for word in out.split():
            k, _, v = word.partition("=")
            fields.setdefault(k, v)
        return fields

    def wait_state(self, job: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job_state(job)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} is {info.get('JobState')}, not {states}")
            time.sleep(0.5)

    # --- tear-down -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every daemon this cluster started (and what its jobs left), remove its
        namespaces, links and folder. Safe to call on a cluster that never started."""
        for p in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._procs.clear()
        for node in self.nodes:  # the jobs' processes in the node's namespace
            ns = self.netns(node)
            pids = _run("ip", "netns", "pids", ns, check=False).split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        for node in self.nodes:
            _run("ip", "link", "del", f"abl{self.index}v{node[1:]}", check=False)
        pid_file = self.root / "munge" / "pid"
        if pid_file.is_file():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        shutil.rmtree(self.root, ignore_errors=True)
