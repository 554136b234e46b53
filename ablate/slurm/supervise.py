"""A supervisor for the long-running programs of a job (a node's Ray, the MLflow server): it runs the
program as its child and stays until told to stop, then ends every process below it, and it is
the only one that reacts to the signals SLURM sends a job.

- SIGTERM (requeue, preemption, scancel) is blocked here and in everything below (a blocked signal
  stays blocked across ``fork`` and ``exec``): the programs outlive it until the driver has let
  the cells checkpoint, and die at SLURM's SIGKILL ``KillWait`` seconds later at the latest.
- SIGINT stops it: SIGINT to the child, ``grace`` seconds for it to end (0: none), then SIGKILL to
  every process below this one. As a child subreaper (Linux) it sees the orphans of its
  descendants too (Ray's processes outlive their parents), so nothing is left behind to hold the
  job's ports. The driver starts it with SIGINT as its parent-death signal (``ray_nodes.shielded``),
  so that a driver that dies takes its supervisors' programs with it.

``python -m ablate.slurm.supervise [--grace S] -- PROGRAM ARGS...``, or ``supervise`` from Python.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):  # Linux only; elsewhere the supervisor is less thorough
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def on_parent_death(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent (thread) ends (Linux)."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def _descendants() -> list[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{d}/stat").read_text()
                parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [os.getpid()]
    while todo:
        kids = [c for c, pp in parent.items() if pp == todo[-1]]
        todo.pop()
        found += kids
        todo += kids
    return found


def _reap_orphans(keep: int) -> None:
    """Reap the orphans that ended here (as a subreaper), never ``keep`` (Popen reaps that one)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def kill_tree() -> None:
    """SIGKILL every process below this one until none is left, reaping them."""
    for _ in range(50):
        pids = _descendants()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.1)


def supervise(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    grace: float = 0.0,
    say: Callable[[str], None] = lambda m: None,
    until: Callable[[], bool] | None = None,
) -> int:
    """Run ``cmd`` until it exits (its status), SIGINT comes or ``until`` (asked every 0.2 s) says
    so (0), then end every process below this one (see the module docstring)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    stop: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda s, f: stop.append(s))
    # the program dies with this process, however this one ends
    proc = subprocess.Popen(cmd, env=env, preexec_fn=lambda: on_parent_death(signal.SIGKILL))
    say(f"started {Path(cmd[0]).name} (pid {proc.pid})")
    try:
        while not stop and proc.poll() is None:
            _reap_orphans(proc.pid)
            if until is not None and until():
                say("told to stop")
                stop.append(0)
                break
            time.sleep(0.2)
        if not stop:
            say(f"{Path(cmd[0]).name} exited by itself with status {proc.returncode}")
            return proc.returncode or 1
        if grace > 0 and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        return 0
    finally:
        kill_tree()
        signal.signal(signal.SIGINT, previous)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablate.slurm.supervise", description=__doc__)
    p.add_argument("--grace", type=float, default=0.0, help="seconds after SIGINT to the program")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no program to supervise")
    return supervise(cmd, grace=args.grace)


if __name__ == "__main__":
    sys.exit(main())
