"""What a worker checks about itself before it runs a cell: that it runs the driver's ``ablate`` and
reaches the paths the driver resolved. A Ray worker on another node has its own install and its own
filesystem; without these checks such a cell trains with other numerics, or fails deep in the
trainer (or writes its checkpoint where no retry finds it).

- the same code: the worker's ``ablate.__version__`` and numerics ``code_hash()`` equal those the
  driver recorded on the ``Task`` (an empty field, a task made without them, is not checked);
- the same paths: the driver's working directory (when a relative path of the cell needs it), the
  folder the cell's checkpoint goes in (the driver creates it before it submits the cell: the
  study run's ``task`` in ``ablate.driver.runner``, the tune driver) as a writable folder, and the
  data files and tokenizer the config names (``ablate.data.config.check_sources``), read from the
  driver's working directory as the trainer reads them.

``check_worker(task)`` runs both. ``ablate.executor.worker`` calls it after moving into the driver's
working directory and before it logs anything as running, so a refused cell ends ``failed`` at once
with the message as its reason: ``run_one`` in its worker; a multi-worker cell's task on its own
node before it starts Ray Train (``run_distributed``), then each Ray Train worker on its node.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.errors import RunnerError
from ablate.executor.task import Task

if TYPE_CHECKING:
    from ablate.train import RunConfig

SHARED = (
    "cluster workers need the driver's paths on shared storage, at the same path on every node "
    "(e.g. -o /shared/runs/<study>, data on the same mount)"
)
_LOCAL = ("/", "./", "../")  # a data.hf_dataset written as a path, not a hub name
_SAME_CODE = (
    "fix: install the driver's ablate on every node (the same version and source), or submit the "
    "driver with a Ray runtime environment that ships it (`ray job submit --working-dir <repo> -- "
    "ablate run ...`)"
)


class WorkerSetupError(RunnerError):
    """A worker is not set up like the driver: other ``ablate`` code, or the driver's paths are not
    there. The message names what differs, the host, and the fix."""


def check_worker(task: Task) -> None:
    """Raise ``WorkerSetupError`` when this worker does not run the driver's ``ablate`` or cannot
    reach the paths the driver resolved for ``task`` (see the module docstring)."""
    check_same_code(task.ablate_version, task.code_hash)
    check_paths(task.config, task.workdir)


def check_same_code(version: str, code_hash: str) -> None:
    """This process's ``ablate`` version and numerics code hash are the driver's (empty: not
    recorded, not checked)."""
    from ablate import __version__
    from ablate.train.provenance import code_hash as here_hash

    mine = here_hash() if code_hash else ""
    if (not version or version == __version__) and mine == code_hash:
        return
    raise WorkerSetupError(
        f"the worker on {socket.gethostname()} runs ablate {__version__} (code_hash {mine or '?'})"
        f", the driver ablate {version or '?'} (code_hash {code_hash or '?'}): this cell would "
        f"train with other code than the study's. {_SAME_CODE}"
    )


def check_paths(config: dict[str, Any], workdir: str) -> None:
    """The paths of a cell's config (a ``RunConfig`` as a dict) exist on this worker: relative
    ones from ``workdir`` (the driver's working directory, which the worker has moved into)."""
    from ablate.data import check_sources
    from ablate.train import RunConfig

    cfg = RunConfig.from_dict(config)
    host = socket.gethostname()
    named = _paths(cfg)
    relative = [f"{k}: {v}" for k, v in named.items() if not os.path.isabs(v)]
    if relative and not os.path.isdir(workdir):
        raise WorkerSetupError(
            f"the driver's working directory {workdir} does not exist on {host}, and the cell "
            f"reads {', '.join(relative)} from it; {SHARED}, or give absolute paths"
        )
    if cfg.checkpoint_dir:
        folder = Path(cfg.checkpoint_dir).parent
        if not folder.is_dir():
            raise WorkerSetupError(
                f"the checkpoint folder {folder} (made by the driver) does not exist on {host}: the "
                f"output folder is not shared with this node; {SHARED}"
            )
        if not os.access(folder, os.W_OK | os.X_OK):
            raise WorkerSetupError(
                f"the checkpoint folder {folder} is not writable on {host} by uid {os.getuid()}, "
                "the user the Ray workers run as; make it writable for that user"
            )
    try:
        check_sources(cfg.data)
        for field in ("data.hf_dataset", "data.val.hf_dataset"):
            hf = named.get(field)
            if hf is not None and not os.path.isdir(hf):
                raise FileNotFoundError(f"{field}: {hf!r} does not exist")
    except FileNotFoundError as e:
        raise WorkerSetupError(f"{e} on {host} (working directory {os.getcwd()}); {SHARED}") from e


def _paths(cfg: RunConfig) -> dict[str, str]:
    """The config's fields that name files or folders (by dotted name), those it sets: a local
    dataset folder (``hf_dataset`` written as a path; a hub name never starts with / or .)."""
    from ablate.data.tokenizer import is_hub_name

    d, v = cfg.data, cfg.data.val
    local_tokenizer = d.tokenizer != "byte" and not is_hub_name(d.tokenizer)
    named = {
        "data.path": d.path,
        "data.tokenizer": d.tokenizer if local_tokenizer else None,
        "data.hf_dataset": d.hf_dataset if (d.hf_dataset or "").startswith(_LOCAL) else None,
        "data.val.path": v.path if v is not None else None,
        "data.val.hf_dataset": (
            v.hf_dataset if v is not None and (v.hf_dataset or "").startswith(_LOCAL) else None
        ),
        "checkpoint_dir": cfg.checkpoint_dir,
    }
    return {k: v for k, v in named.items() if v is not None}
