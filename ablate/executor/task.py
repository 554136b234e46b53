"""What travels between a study's driver and a worker: ``Task``, everything a worker needs to run
one cell (or tune trial), and ``Outcome``, how that cell ended. Plain, picklable data that imports
nothing of the project at module level, so that the executors (``ablate.executor``), the checks a
worker makes about itself (``ablate.executor.worker_checks``), the runner and the tune driver all import it
and none of them imports another for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """Everything a worker needs to run one cell (plain data: it travels to Ray workers)."""

    key: str
    label: str
    config: dict[str, Any]
    """The resolved RunConfig as a dict, checkpoint_dir set."""
    tracking_uri: str
    run_id: str
    workdir: str
    """The driver's working directory (relative data paths are read from there)."""
    threads: int = 1
    stop_after: int | None = None
    """Stop after this many steps (tests: an interruption at a known step)."""
    branches: dict[str, Any] | None = None
    """A member of a family of decay branches: the trainer's ``ablate.train.branch.Branches`` as
    its dict (the branch checkpoints it saves, or the one it starts from)."""
    trunk_run: str = ""
    """A decay branch: its trunk's MLflow run, whose curve up to the branch point it copies when it
    starts from the trunk's checkpoint."""
    ablate_version: str = field(default_factory=lambda: _driver_code()[0])
    code_hash: str = field(default_factory=lambda: _driver_code()[1])
    """The driver's ``ablate.__version__`` and numerics ``code_hash()``, taken where the task is
    made; the worker refuses to run other code (``ablate.executor.worker_checks``; "": not checked)."""


def _driver_code() -> tuple[str, str]:
    from ablate import __version__
    from ablate.train.provenance import code_hash

    return __version__, code_hash()


@dataclass(frozen=True)
class Outcome:
    """How one task ended, as the worker (or the executor, for a worker lost too often) says."""

    key: str
    status: str
    """finished, diverged, failed, or interrupted."""
    steps: int = 0
    tokens: int = 0
    final_val_loss: float = math.nan
    tokens_per_s: float = 0.0
    diverged_at: int | None = None
    reason: str = ""
    wall_time_s: float = 0.0

    @property
    def final_val_ppl(self) -> float:
        return math.exp(min(self.final_val_loss, 700.0))
