"""A study's own MLflow tracking server, for workers on several nodes (``ablate slurm run``).

MLflow's SQLite store is one file that its clients write directly; a file on a shared file system
written from several nodes at once is unsafe (SQLite's locks do not hold across NFS clients, and a
lost lock corrupts the file). ``TrackingServer`` serves the study's store from one process on one
node instead (``mlflow server``, one worker, no job runner, bound to that node's address): every
node's workers log over HTTP and only the server writes the file. Artifacts go where the study's
experiment says (created before the server starts: the output folder), or into
``artifacts_destination`` for anything the server creates.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from ablate.errors import TrackingError


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def local_url(host: str, port: int) -> str:
    """The URL of a server listening at ``host:port`` (``ablate ui``'s, a ``TrackingServer``), from
    this machine: an address for every interface by its loopback (``::`` by ::1: one worker listens
    on IPv6 only there), an IPv6 address in brackets (``http://[::1]:5000``)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a name
        ip = None
    if ip is not None and ip.is_unspecified:
        host = "::1" if ip.version == 6 else "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server_command(
    store: str, host: str, port: int, *, workers: int = 1, extra: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of ``mlflow server`` on ``store`` as ablate starts it
    (``TrackingServer``, ``ablate ui``): ``workers`` server workers, ``extra`` options, no access
    log, and no job runner (ablate runs no MLflow jobs, and the runner starts seven consumer
    processes)."""
    exe = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    cmd = [
        exe, "server", "--backend-store-uri", store, "--host", host, "--port", str(port),
        "--workers", str(workers), *extra, "--uvicorn-opts", "--no-access-log",
    ]  # fmt: skip
    return cmd, {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class TrackingServer:
    """``mlflow server`` on ``store`` at ``host:port``, started in a session of its own (so that a
    signal to the driver's process group does not reach it); ``wrap`` goes before its command (a
    supervisor: ``ablate.slurm.supervise``) and ``preexec`` runs in its process before it
    starts. ``url`` is where it answers (``local_url``: an IPv6 address in brackets)."""

    def __init__(
        self,
        store: str,
        *,
        host: str,
        port: int,
        artifacts_destination: Path,
        log: Path,
        preexec: Callable[[], None] | None = None,
        wrap: list[str] | None = None,
    ) -> None:
        self.store, self.host, self.port = store, host, port
        self.url = local_url(host, port)
        self.artifacts_destination, self.log = artifacts_destination, log
        self.preexec, self.wrap = preexec, wrap or []
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The command line (``wrap`` first) and environment that ``start`` runs; the server allows
        the Host header a client of ``url`` sends (``10.0.0.1:5000``, ``[fd00::1]:5000``) and the
        host alone."""
        netloc = self.url.removeprefix("http://")
        extra = [
            "--artifacts-destination", str(self.artifacts_destination),
            "--allowed-hosts", f"{netloc},{netloc.rpartition(':')[0]}",
        ]  # fmt: skip
        cmd, env = server_command(self.store, self.host, self.port, extra=extra)
        return [*self.wrap, *cmd], env

    def start(self) -> None:
        cmd, env = self.command()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self._proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=self.preexec,
            )  # fmt: skip

    def wait(self, timeout: float) -> None:
        """Return once the server answers; ``TrackingError`` naming its log when it exits or does
        not answer within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not answers(self.url + "/health"):
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise TrackingError(
                    f"the MLflow server for {self.store} exited (status {code}): {self.tail()}"
                )
            if time.monotonic() > deadline:
                raise TrackingError(
                    f"the MLflow server at {self.url} did not answer within {timeout:g} s: "
                    f"{self.tail()}"
                )
            time.sleep(0.25)

    def tail(self, n: int = 600) -> str:
        """The end of the server's log, for messages."""
        with contextlib.suppress(OSError):
            return f"... {self.log.read_text(errors='replace')[-n:].strip()} (log: {self.log})"
        return f"(no log at {self.log})"

    def stop(self, timeout: float = 15.0) -> None:
        """SIGINT to its session (its graceful stop; SIGTERM may be blocked in it), SIGKILL after
        ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
