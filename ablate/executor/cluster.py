"""Reaching a Ray cluster: which one a study's cells run on (``--address``, ``RAY_ADDRESS``, or a Ray
that ablate starts on this machine), whether it is remote, and connecting to it with a clear
message when its token authentication refuses this process (``connect``); waiting for a cluster's
nodes to join (``wait_for_nodes``, after ``ablate.slurm`` started them) and leaving it
(``disconnect``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ablate.errors import RunnerError


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a study's cells run on, ``--address`` or else ``RAY_ADDRESS``; None (or
    ``local``): a Ray that ablate starts on this machine."""
    return address or os.environ.get("RAY_ADDRESS") or None


def remote_cluster(address: str | None) -> bool:
    """Whether ``address`` names a Ray cluster that ablate does not start on this machine itself
    (decided without connecting): any address but ``local``, unless this process already started
    the Ray at that address (``ray.init()`` here: its head node is this process's). Such a cluster
    may have, or later get (an autoscaler), nodes that cannot reach this machine's files."""
    address = cluster_address(address)
    if address is None or address == "local":
        return False
    ray = sys.modules.get("ray")  # not imported: this process started no Ray
    if ray is None or not ray.is_initialized():
        return True
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    if not getattr(node, "head", False):  # connected to a cluster, not started here
        return True
    here = ray.get_runtime_context().gcs_address
    return address not in (here, "auto")


_AUTH_FIX = (
    "a cluster with token authentication needs RAY_AUTH_MODE=token here and its token: in "
    "~/.ray/auth_token, or in RAY_AUTH_TOKEN or the file RAY_AUTH_TOKEN_PATH names; `ray "
    "get-auth-token` on the head prints it; see "
    "https://docs.ray.io/en/latest/ray-security/token-auth.html"
)


def _unauthenticated(e: BaseException) -> bool:
    """Whether Ray's error (or its cause) is the cluster refusing the authentication token."""
    while e is not None:
        if "Unauthenticated" in str(e) or "InvalidAuthToken" in str(e):
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False


def check_ray_auth(address: str, timeout: float = 3.0) -> None:
    """Ask the GCS at ``address`` (host:port; not ray://) whether it takes this process's
    authentication, in a second or so: ``ray.init`` retries an authentication refusal for 20 s
    and then says only that it cannot connect. Raises ``RunnerError`` naming what to set; returns
    when the cluster takes it, does not ask for a token, or cannot be asked (``ray.init`` says
    why)."""
    if "://" in address or address == "auto" or os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return
    try:
        import grpc
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        loader = AuthenticationTokenLoader.instance()
        has_token = bool(loader.has_token(ignore_auth_mode=True))
        header = loader.get_token_for_http_header(ignore_auth_mode=True) if has_token else {}
    except Exception:  # a Ray without token authentication: ray.init decides
        return

    def refused(metadata: tuple[tuple[str, str], ...]) -> bool | None:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
            try:
                call(b"", timeout=timeout, metadata=metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    return True
                return None  # unreachable, or not a GCS: ray.init says so
            return False

    if not refused(()):
        return
    where = f"--address {address}: the Ray cluster has token authentication on"
    if not has_token:
        raise RunnerError(f"{where}, and this process has no token ({_AUTH_FIX})")
    if refused(tuple(header.items())):
        raise RunnerError(f"{where}, and refuses this process's token ({_AUTH_FIX})")
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        raise RunnerError(
            f"{where}; this process has its token but does not send it without RAY_AUTH_MODE=token"
            f" (set RAY_AUTH_MODE=token; {_AUTH_FIX})"
        )


def _note_started_cluster() -> None:
    """Say on stderr that ablate starts a Ray of its own although `ray start` runs one here."""
    try:
        from ray._private.services import find_gcs_addresses
        from ray._private.utils import read_ray_address

        started = read_ray_address()
        running = started is not None and started in find_gcs_addresses()
    except Exception:
        return
    if running:
        print(
            f"note: a Ray cluster started with `ray start` runs on this machine ({started}); "
            "ablate starts a local Ray of its own. To run the cells on that cluster, pass "
            f"--address {started} (with a tracking server: --tracking-uri http://<host>:5000).",
            file=sys.stderr,
        )


def connect(
    address: str | None, *, num_cpus: int | None, object_store_mb: int, dashboard: bool
) -> None:
    """``ray.init`` for a study's executor: a Ray of ablate's own on this machine (``address``
    None or ``local``; ``num_cpus`` and ``object_store_mb`` size it) or the cluster at
    ``address``, after asking it whether it takes this process's authentication. Raises
    ``RunnerError`` naming the fix when the cluster cannot be reached or refuses."""
    import ray

    kw: dict[str, Any] = {"include_dashboard": dashboard, "log_to_driver": True}
    if address is None or address == "local":
        # "local": a Ray of its own, even where `ray start` runs one (a plain ray.init()
        # would join that one, and refuse num_cpus / object_store_memory)
        _note_started_cluster()
        address = None
        kw.update(num_cpus=num_cpus, object_store_memory=object_store_mb * 2**20)
    else:
        check_ray_auth(address)
    try:
        ray.init(address=address or "local", **kw)
    except ConnectionError as e:
        if _unauthenticated(e):
            raise RunnerError(
                f"--address {address}: the Ray cluster refused this process's "
                f"authentication ({_AUTH_FIX})"
            ) from e
        raise RunnerError(f"--address {address}: cannot reach a Ray cluster ({e})") from e


def wait_for_nodes(count: int, timeout: float, check: Callable[[], None] = lambda: None) -> None:
    """After ``connect``: return once the cluster has ``count`` live nodes; ``check`` is called
    every half second and may raise (a node that refused to start). ``RunnerError`` naming the
    nodes that joined when the rest do not join within ``timeout`` seconds."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        check()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= count:
            return
        if time.monotonic() > deadline:
            seen = ", ".join(sorted(str(n.get("NodeManagerAddress")) for n in alive)) or "none"
            raise RunnerError(
                f"only {len(alive)} of {count} Ray nodes joined within {timeout:g} s (joined: "
                f"{seen})"
            )
        time.sleep(0.5)


def disconnect() -> None:
    """``ray.shutdown`` of this process's connection (the cluster keeps running)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
