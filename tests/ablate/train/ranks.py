"""``spawn(fn, args, nprocs)``: the suite's gloo ranks, as ``torch.multiprocessing.spawn`` starts
them, but forked from a server process that imported torch and ablate once (``forkserver`` with
its modules preloaded) rather than each started as a fresh interpreter that imports them again
(about 3 s of CPU a rank on the 2-core machine; the four modules that start ranks took 243 s of
CPU with ``spawn`` and 203 s with this). Each rank gets the caller's environment and working
directory as they are at the call (a forked rank would otherwise have the server's, from when it
started), and ``fn(rank, *args)`` runs as under ``spawn``.

What a rank computes does not depend on how it was started: the server runs no torch operation
(no thread pool exists to fork, no generator has moved), and every rank seeds what it draws."""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

PRELOAD = [
    "torch",
    # every training process imports Dynamo (about 1 s of CPU each): a model built on the meta
    # device draws its default initialization through torch._refs, and the optimizers'
    # constructors are wrapped by torch._disable_dynamo, both of which import it
    "torch._dynamo",
    "torch.distributed",
    "torch.distributed.fsdp",
    "ablate.train.loop",
    "ablate.model",
    "backends",
    "test_distributed",
    "test_recompute",
    # test_tracking's concurrent MLflow writers, forked from the same server
    "ablate.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
]
"""What the server imports once; the rank functions' own modules among them. A process has one
forkserver, started at its first use with the preload set then, so every test that forks from it
goes through ``context`` (a test that set its own, shorter list first left every rank after it in
that pytest worker to import torch and ablate again: about 1.5 s of CPU each, 32 ranks)."""


def context() -> multiprocessing.context.ForkServerContext:
    """The ``forkserver`` context, its server importing ``PRELOAD``."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    _start_server()
    return multiprocessing.get_context("forkserver")


def _start_server() -> None:
    """Start the server (once per process) with the folders of ``PRELOAD``'s test modules on its
    ``PYTHONPATH``. Python 3.11's server imports its preload before it takes the caller's
    ``sys.path`` (``forkserver.main`` receives it and leaves it unused) and skips a module it
    cannot import: the suite's folders, which ``tests/conftest.py`` puts on ``sys.path``, are not
    on the server's, so ``test_distributed`` and ``test_recompute`` were imported again in every
    rank (pytest and all they import: about 0.5 s of CPU a rank)."""
    folders = []
    for name in PRELOAD:
        spec = importlib.util.find_spec(name.partition(".")[0])
        if spec is not None and spec.origin and Path(spec.origin).name == f"{name}.py":
            folders.append(str(Path(spec.origin).parent))  # a test module: a file of its own
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*dict.fromkeys(folders), *filter(None, [before])])
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _enter(
    rank: int, env: dict[str, str], cwd: str, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fn(rank, *args)


def spawn(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, joined; raises as ``mp.spawn`` does when one
    fails."""
    context()
    mp.start_processes(
        _enter,
        args=(dict(os.environ), os.getcwd(), fn, args),
        nprocs=nprocs,
        start_method="forkserver",
    )
