"""``ablate ui``: the MLflow UI on a study's store, opened at the study's runs table.

MLflow 3's ``mlflow ui`` starts four server workers and a job runner (~1.5 GB resident, a first
answer after ~18 s on a 2-core machine) and opens an experiment without a kind in its GenAI view
(traces, no runs). Here: ``mlflow server`` with one worker by default and job execution off, the
experiment tagged for the training view (``vocab.TRAINING_KIND``), and the URL of its runs printed
once the server answers. A server store (``http://...``) is already served: only its URL is given.
The address to listen on is checked before anything starts (``check_host``), where the server will
listen (``listen_addresses``: uvicorn's IPv4 unless the host has a ':', or every address with one
worker): an empty one, or one this machine cannot resolve or listen on, is refused as such, not
taken for a port in use. The port is checked by a bind with the server's own socket options
(``_set_as_server``), so a port in TIME_WAIT is free as it is to the server.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ablate.errors import TrackingError
from ablate.tracking import vocab
from ablate.tracking.runs import repair_artifacts
from ablate.tracking.server import answers, local_url, server_command
from ablate.tracking.store import Client, check_sqlite_file, check_store, sqlite_path


def view_state(axes: Sequence[str] = ()) -> dict[str, Any]:
    """The runs-table view ``ablate ui`` opens (MLflow's shared view state): the cells only (the
    parent run's per-configuration metrics would otherwise nest the cells under it and fill the
    charts), their recipe axes, seed and other axes as param columns, the report's summary metrics
    as metric columns, every cell in the charts (validation against tokens is the chart of
    ``val_ppl_by_tokens``, whose step is the tokens seen)."""
    params = [*vocab.AXIS_PARAMS, "seed", *(a for a in axes if "." in a)]
    return {
        "searchFilter": vocab.role_filter("cell"),
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
        "selectedColumns": [f"params.`{p}`" for p in dict.fromkeys(params)]
        + [f"metrics.`{m}`" for m in vocab.SUMMARY_METRICS],
        "runsHiddenMode": "SHOW_ALL",  # charts compare every cell, not MLflow's first ten
    }


def study_url(base: str, uri: str, experiment: str | None, *, axes: Sequence[str] = ()) -> str:
    """The UI's page of the experiment's runs in ablate's view (``view_state``), or its home page
    without an experiment. Marks the experiment for MLflow 3's training view and (re)writes the
    view on the way, so a study recorded before either existed opens the same way."""
    base = base.rstrip("/")
    if experiment is None:
        return base + "/"
    client = Client(uri, must_exist=True)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise TrackingError(f"no experiment {experiment!r} in {uri}: has the study been run there?")
    eid = found.experiment_id
    repair_artifacts(uri, found.artifact_location)
    if found.tags.get(vocab.EXPERIMENT_KIND) != vocab.TRAINING_KIND:
        client.set_experiment_tag(eid, vocab.EXPERIMENT_KIND, vocab.TRAINING_KIND)
    client.set_experiment_tag(eid, vocab.SHARED_VIEW + vocab.VIEW, json.dumps(view_state(axes)))
    # workflowType: the sidebar of MLflow 3's training mode, not its GenAI one
    view = f"viewStateShareKey={vocab.VIEW}&workflowType=machine_learning"
    return f"{base}/#/experiments/{eid}/runs?{view}"


def check_browsable(uri: str) -> None:
    """Refuse, in seconds and writing nothing, a store ``ablate ui`` cannot show: a SQLite file
    that is missing, empty or damaged (``mlflow server`` would create a new store there, or fail
    with a traceback), a server that does not answer (one request of 5 s, never the client's
    retries) and any other scheme; a ``TrackingError`` that says which."""
    path = sqlite_path(uri)  # refuses a malformed or in-memory SQLite URI
    if path is None:
        check_store(uri, create=False)  # http(s): answers; any other scheme: unsupported
        return
    if not path.is_file() or path.stat().st_size == 0:
        raise TrackingError(
            f"no MLflow store at {path}{' (an empty file)' if path.is_file() else ''}: give the "
            "sqlite:/// URI of a study's mlflow.db, or run the study first"
        )
    check_sqlite_file(path)


def check_host(host: str, workers: int = 1) -> None:
    """Refuse, with a ``TrackingError`` that says why, an address the server could not listen on:
    empty (which would listen on every interface, unasked), a name or address this machine does
    not resolve (``999.1.1.1``, ``no-such-host.invalid``) as the server does (``listen_addresses``),
    or one that is not this machine's (a bind to a free port on it fails; ``::`` on a kernel
    without IPv6). Binds nothing past the check itself."""
    if not host:
        raise TrackingError(
            "an empty address; give one of this machine's (127.0.0.1, or 0.0.0.0 for every "
            "interface)"
        )
    shown = repr(host if len(host) <= 80 else host[:80] + "...")
    try:
        addresses = listen_addresses(host, workers)
    except (OSError, UnicodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TrackingError(
            f"{shown} is not an address or a host name this machine resolves ({why})"
        ) from None

    def refuse(e: OSError) -> TrackingError:
        return TrackingError(
            f"{shown} is not an address of this machine ({e.strerror or e}): the server could not "
            "listen on it"
        )

    _bind_each(addresses, 0, refuse, workers)


def listen_addresses(host: str, workers: int = 1) -> list[tuple[int, tuple[Any, ...]]]:
    """Where ``mlflow server`` (uvicorn) listens at ``host``, as (family, address) pairs: with one
    worker, on every address ``getaddrinfo`` gives (asyncio's ``create_server``: ``localhost`` may
    be ::1 and 127.0.0.1); with several, on the first IPv4 address, or IPv6 if ``host`` has a ':'
    (uvicorn's one shared socket: a name that resolves to IPv6 only is not listened on).
    ``OSError`` or ``UnicodeError`` when ``host`` does not resolve so."""
    if workers > 1:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        infos = socket.getaddrinfo(host, 0, family, socket.SOCK_STREAM)[:1]
    else:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return list(dict.fromkeys((info[0], info[4]) for info in infos))


def _bind_each(
    addresses: Sequence[tuple[int, tuple[Any, ...]]],
    port: int,
    refuse: Callable[[OSError], TrackingError],
    workers: int = 1,
) -> None:
    """Bind a socket to ``port`` at each address in turn (and close it), with the options the
    server sets (``_set_as_server``); ``refuse(error)`` for the first that cannot be bound, or when
    no socket of any of their families can be made. As the server does, an address whose family
    this kernel lacks is passed over while another is left."""
    lacking: OSError | None = None
    bound = False
    for family, addr in addresses:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:  # no IPv6 in this kernel, say
            lacking = lacking or e
            continue
        with s:
            try:
                _set_as_server(s, workers)
                s.bind((addr[0], port, *addr[2:]))
            except OSError as e:
                raise refuse(e) from None
        bound = True
    if not bound:
        raise refuse(lacking or OSError("no address to listen on"))


def _set_as_server(s: socket.socket, workers: int) -> None:
    """The options the server sets on its socket before the bind: SO_REUSEADDR (with one worker
    asyncio's ``create_server``, with several uvicorn's ``bind_socket``: a port left in TIME_WAIT
    by a server that stopped binds again) and, with one worker, IPV6_V6ONLY on IPv6 (asyncio's:
    ``::`` then listens on IPv6 only, whatever holds the port on IPv4; uvicorn's one socket keeps
    the kernel's default, dual stack on Linux)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if workers == 1 and s.family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)


def _check_port(host: str, port: int, workers: int = 1) -> None:
    """``TrackingError`` when ``port`` cannot be listened on at ``host`` (taken, or privileged)."""

    def refuse(e: OSError) -> TrackingError:
        if e.errno == errno.EADDRINUSE:
            return TrackingError(
                f"port {port} on {host} is in use (another `ablate ui` or MLflow server?); "
                "pass --port"
            )
        return TrackingError(
            f"port {port} on {host} cannot be listened on ({e.strerror or e}); pass --port"
        )

    _bind_each(listen_addresses(host, workers), port, refuse, workers)


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid`` (from /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p:
                found.append(child)
                todo.append(child)
    out = []
    for p in found:
        try:
            cmd = (Path("/proc") / str(p) / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        out.append((p, cmd.decode(errors="replace").strip()))
    return out


def _exit(signum: int, frame: Any) -> None:
    sys.exit(128 + signum)


def serve(
    uri: str,
    *,
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    timeout: float = 120.0,
    experiment: str | None = None,
    axes: Sequence[str] = (),
    echo: Callable[[str], None] = print,
) -> int:
    """Run the MLflow server on ``uri`` until it exits or Ctrl-C; return its exit status (0 after
    Ctrl-C). Raises TrackingError when ``host`` cannot be listened on (``check_host``), the port is
    taken or the server does not answer in time."""
    check_host(host, workers)
    _check_port(host, port, workers)
    base = local_url(host, port)
    url = study_url(base, uri, experiment, axes=axes)  # checks the store and experiment first
    cmd, env = server_command(uri, host, port, workers=workers)
    start = time.monotonic()
    # SIGTERM/SIGHUP (a closed terminal, a supervisor) end this process through ``finally``,
    # which stops the server: it runs in its own session, so nothing else would
    previous = {sig: signal.signal(sig, _exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        while not answers(base + "/health"):
            if proc.poll() is not None:
                raise TrackingError(f"the MLflow server exited with status {proc.returncode}")
            if time.monotonic() - start > timeout:
                raise TrackingError(f"the MLflow server did not answer within {timeout:g} s")
            time.sleep(0.25)
        echo(f"MLflow UI: {url}  (answered after {time.monotonic() - start:.1f} s; Ctrl-C stops)")
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
