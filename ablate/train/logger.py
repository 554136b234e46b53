"""The trainer's reporting interface: a ``Logger`` protocol and two small implementations.

The trainer never imports a tracking library; ``ablate.tracking`` implements ``Logger`` for MLflow.
``NullLogger`` stands in when tracking is off; ``MemoryLogger`` keeps everything in lists (tests, the
in-process executor) and can echo progress to stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Protocol, TextIO


class Logger(Protocol):
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Run configuration (flattened, once per run; again with the same values on resume)."""
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Metrics of one optimizer step (every step is reported exactly once per run)."""
        ...

    def log_status(self, status: str, info: Mapping[str, Any]) -> None:
        """The run ended: ``finished``, ``diverged`` or ``stopped``, with details."""
        ...

    def flush(self) -> None:
        """Make everything logged so far durable. The trainer calls it before each checkpoint: a
        run resumed from that checkpoint re-reports only the steps after it, so the steps up to it
        must already be stored."""
        ...


class NullLogger:
    """Discards everything."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_status(self, status: str, info: Mapping[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass


class MemoryLogger:
    """Keeps params, per-step metrics and the final status in memory; optionally prints progress."""

    def __init__(self, echo_every: int = 0, stream: TextIO | None = None) -> None:
        self.params: dict[str, Any] = {}
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.status: tuple[str, dict[str, Any]] | None = None
        self.echo_every = echo_every
        self.stream = stream or sys.stderr

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.metrics.append((step, dict(metrics)))
        if self.echo_every and (step % self.echo_every == 0 or "val_loss" in metrics):
            shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
            print(f"step {step}: {shown}", file=self.stream)

    def log_status(self, status: str, info: Mapping[str, Any]) -> None:
        self.status = (status, dict(info))

    def flush(self) -> None:
        pass  # nothing is buffered

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) of one metric, in logging order."""
        return [(s, m[name]) for s, m in self.metrics if name in m]
