"""One driver per study in its tracking store: the study's lock, recorded on its MLflow experiment.

The lock file in the output folder (``driver.setup.study_lock``) keeps apart two drivers that
share an output folder; two drivers with different output folders on one tracking store (one
``mlflow server``, or one SQLite file named by ``tracking.uri``) would plan and mark each other's
live cells.
So a driver also claims the study in the store: an experiment tag ``ablate.driver.<lock>.<holder
id>`` (``vocab.driver_tag``) whose value says who holds it (host, pid, output folder, command,
start time, state) and a heartbeat that the driver refreshes every ``HEARTBEAT_S`` seconds; the
driver deletes its tag when it ends. ``lock`` names what is locked: ``run`` (``ablate run``,
``adopt``) or ``tune``.

A claim counts while it is fresh. One is stale when its heartbeat is older than ``STALE_S`` seconds
(a driver killed without cleaning up, a machine lost) or when it was made on this host by a process
that no longer exists; the next driver deletes a stale claim and says that it took the lock over.

MLflow has no compare-and-swap, so two drivers that start at once settle it by the holder ids
(which begin with the start time: the earlier driver's id is the smaller). Each driver:

1. reads the claims: a fresh one that is ``held``, or a fresh one with a smaller id -> refuse;
2. writes its own claim (``claiming``) under its own tag (no driver overwrites another's), waits
   ``SETTLE_S`` and reads again: the same rule as 1 (it deletes its claim and refuses);
3. marks its claim ``held`` and reads once more: a fresh claim with a smaller id -> as in 2.

In a store that answers each read after the writes that returned before it (one database), at most
one driver gets past 3: if drivers A < B both did, B's reads in 2 and 3 saw no claim of A, so A
wrote its claim after B marked itself held, and A's read in 2 saw B held and refused. Both may
refuse (running again then succeeds); both never run. A driver that notices its claim was taken over
(its heartbeats stopped for ``STALE_S``: a suspended process, a partitioned network) says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ablate.errors import AblateError, TrackingError
from ablate.tracking import vocab
from ablate.tracking.store import Client

HEARTBEAT_S = 30.0
STALE_S = 180.0
SETTLE_S = 0.5


@dataclass(frozen=True)
class Holder:
    """One driver's claim on a study's lock, as its tag's value holds it."""

    id: str
    host: str
    pid: int
    output: str
    command: str
    started: float
    """time.time() when the driver made its claim."""
    heartbeat: float
    state: Literal["claiming", "held"] = "claiming"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a tag's value records (None: not readable as one)."""
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):
            return None

    def stale(self, now: float, stale_s: float = STALE_S) -> str:
        """Why this claim no longer counts ("" while it does)."""
        age = now - self.heartbeat
        if age > stale_s:
            return f"its last heartbeat is {age:.0f} s old (more than {stale_s:.0f} s)"
        if self.host == socket.gethostname() and not _alive(self.pid):
            return f"its process {self.pid} no longer exists on {self.host}"
        return ""

    def describe(self, now: float) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started))
        return (
            f"`{self.command}` (pid {self.pid} on {self.host}, output folder {self.output}, since "
            f"{since}, last heartbeat {max(0.0, now - self.heartbeat):.0f} s ago)"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def claims(client: Client, experiment_id: str, lock: str) -> dict[str, Holder | None]:
    """Every claim on ``lock`` recorded on the experiment, by tag (None: an unreadable value)."""
    prefix = vocab.driver_tag(lock)
    tags = client.get_experiment(experiment_id).tags
    return {k: Holder.parse(v) for k, v in tags.items() if k.startswith(prefix)}


def holders(client: Client, experiment_id: str, lock: str) -> list[Holder]:
    """The fresh claims on ``lock``, by id (reads only: stale ones are left for a driver)."""
    now = time.time()
    found = [h for h in claims(client, experiment_id, lock).values() if h and not h.stale(now)]
    return sorted(found, key=lambda h: h.id)


class StoreLock:
    """The study's lock ``lock`` in its tracking store (see the module docstring), held while the
    ``with`` block runs; ``error`` is the exception a refusal raises, ``note`` prints a takeover."""

    def __init__(
        self,
        client: Client,
        experiment_id: str,
        lock: str,
        *,
        study: str,
        command: str,
        output: str,
        error: type[AblateError] = TrackingError,
        note: Callable[[str], None] | None = None,
        stale_s: float = STALE_S,
        heartbeat_s: float = HEARTBEAT_S,
        settle_s: float = SETTLE_S,
    ) -> None:
        self._client, self._eid, self._lock = client, experiment_id, lock
        self.study, self.error = study, error
        self._note = note or (lambda msg: print(msg, file=sys.stderr))
        self.stale_s, self.heartbeat_s, self.settle_s = stale_s, heartbeat_s, settle_s
        now, host, pid = time.time(), socket.gethostname(), os.getpid()
        hid = f"{int(now * 1000):013d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}-{pid}"
        self.holder = Holder(
            f"{hid}-{secrets.token_hex(2)}", host, pid, output, command, now, now, "claiming"
        )
        self.tag = vocab.driver_tag(lock, self.holder.id)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False
        """Whether another driver took this claim over (it deleted it as stale)."""

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Claim the lock, or raise ``error`` naming the driver that holds it."""
        self._refuse_if(self._others(), held=True)
        self._write("claiming")
        try:
            time.sleep(self.settle_s)
            self._refuse_if(self._others(), held=True)
            self._write("held")
            self._refuse_if(self._others(), held=False)
        except BaseException:
            self._delete(self.tag)
            raise
        self._thread = threading.Thread(target=self._beat, daemon=True, name="ablate-lock")
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if not self.lost:
            self._delete(self.tag)

    def _others(self) -> list[Holder]:
        """Other drivers' fresh claims, by id; stale ones are deleted, saying so."""
        now = time.time()
        fresh = []
        for key, h in claims(self._client, self._eid, self._lock).items():
            if key == self.tag:
                continue
            why = "its record is not readable" if h is None else h.stale(now, self.stale_s)
            if not why:
                fresh.append(h)
                continue
            self._delete(key)
            who = key if h is None else h.describe(now)
            self._note(f"note: took over study {self.study}'s lock from {who}: {why}")
        return sorted((h for h in fresh if h is not None), key=lambda h: h.id)

    def _refuse_if(self, others: list[Holder], *, held: bool) -> None:
        """Raise ``error`` for the first claim that wins over this one: one with a smaller id,
        or (``held``) one that holds the lock."""
        mine = self.holder.id
        winner = next((h for h in others if h.id < mine or (held and h.state == "held")), None)
        if winner is None:
            return
        when = time.strftime("%H:%M:%S", time.localtime(winner.heartbeat + self.stale_s))
        raise self.error(
            f"study {self.study}: another driver holds it in the tracking store "
            f"{self._client.uri}: {winner.describe(time.time())}. Wait for it to end, or stop it "
            f"(Ctrl-C where it runs, or `kill {winner.pid}` on {winner.host}); if it is gone (its "
            f"machine lost), its lock lapses {self.stale_s:.0f} s after its last heartbeat (at "
            f"{when}) and the next run takes it over"
        )

    def _write(self, state: Literal["claiming", "held"]) -> None:
        self.holder = dataclasses.replace(self.holder, state=state, heartbeat=time.time())
        self._client.set_experiment_tag(self._eid, self.tag, self.holder.to_json())

    def _delete(self, key: str) -> None:
        with contextlib.suppress(TrackingError):  # gone already (another driver deleted it)
            self._client.delete_experiment_tag(self._eid, key)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(Exception):  # a missed heartbeat must not break the study
                if self.tag not in claims(self._client, self._eid, self._lock):
                    self.lost = True
                    self._note(
                        f"warning: another driver took over study {self.study}'s lock in the "
                        f"tracking store (this driver's heartbeats stopped for more than "
                        f"{self.stale_s:.0f} s); two drivers may now run its cells"
                    )
                    return
                self._write("held")
