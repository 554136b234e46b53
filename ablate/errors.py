"""The library's exceptions, one place for all of them.

Every error that ``ablate`` raises on purpose is an ``AblateError``: a plain sentence that says what
was wrong, where (the YAML path, the argument, the file) and what would be right. The CLI turns an
``AblateError`` into a ``click.ClickException`` (exit status 1; ``StudyError``, ``CannotRunError``
and ``DamagedStoreError``, refusals before anything starts: 2); nothing below the CLI prints or
exits.

This module imports nothing but the standard library, so any layer may raise these errors.
"""

from __future__ import annotations

from collections.abc import Sequence


class AblateError(Exception):
    """Base of the library's own errors."""


class StudyError(AblateError, ValueError):
    """A study that cannot run; ``errors`` holds one ``"yaml.path: what is wrong"`` line each."""

    def __init__(self, errors: Sequence[str], source: str | None = None) -> None:
        self.errors = list(errors)
        self.source = source
        head = f"{source}: " if source else ""
        n = len(self.errors)
        super().__init__(
            f"{head}{n} problem{'s' if n > 1 else ''} in the study:\n  " + "\n  ".join(self.errors)
        )


class TrackingError(AblateError):
    """The MLflow store cannot do what was asked (unreachable, missing, locked past the retries)."""


class DamagedStoreError(TrackingError):
    """A SQLite store file that is there but that SQLite cannot read (not a database, truncated,
    malformed): refused before anything reads or writes it, by every command alike."""


class MissingStoreError(TrackingError):
    """A SQLite store that a reading command needs and that is not there (or is an empty file),
    or a record in a store that it needs and the store lacks (a study's kept study.yaml): refused
    before anything starts, never made."""


class RunnerError(AblateError, RuntimeError):
    """The study cannot be run as asked (another driver holds it, the cluster is unreachable...)."""


class CannotRunError(RunnerError):
    """A valid study that this machine, cluster or tracking store cannot run (a format the device
    has no GEMM for, more CPUs or GPUs per cell than a node has, an unusable store); raised before
    anything is written or started. The CLI exits with status 2, as for a bad study."""


class TuneError(AblateError, RuntimeError):
    """A search that cannot run as asked (no tune section, target not evaluable, locked...)."""


class ReportError(AblateError):
    """A study cannot be reported as asked (bad input, undefined target, unsupported format)."""


class ExportError(AblateError):
    """A checkpoint that cannot be exported as asked (an unknown cell, no checkpoint, an occupied
    output folder)."""


class AdoptError(AblateError):
    """A run that ``ablate adopt`` cannot adopt: its checkpoint cannot be read (refused, damaged, or
    a read the file system failed)."""


class CheckpointError(AblateError, ValueError):
    """A checkpoint, train state or RNG state file refused: damaged, truncated, not what the project
    writes, or holding more than tensors and plain values (such a pickle could run code, so it is
    never unpickled)."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint file that does not read as one (truncated, garbage, not the mapping the project
    writes), as opposed to one refused for naming an object to build (which only a pickle written
    to run code does): a run sets it aside and trains from step 0
    (``ablate.train.checkpoint.set_aside``)."""
