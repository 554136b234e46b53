"""Damaged checkpoints found before a run loads them: whether it would set one aside.

A checkpoint that does not read as one (``DamagedCheckpointError``: a file truncated or garbage,
or a sharded checkpoint's file missing) a run sets aside and trains from step 0
(``ablate.train.checkpoint.set_aside``). This module tells so beforehand, two ways: from the ends
of its files alone, nothing unpickled (``checkpoint_damage``: ``ablate plan``, milliseconds a
cell), and as the run finds it before training (``load_damage``: a worker, logging the step its
attempt starts from, and before a decay branch copies its trunk's curve up to its branch
checkpoint), a sharded one as rank 0 checks it before any rank loads it
(``checkpoint.sharded_damage``, part of the load itself).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

from ablate.errors import CheckpointError, DamagedCheckpointError
from ablate.train.checkpoint import (
    CHECKPOINT,
    SHARDED,
    SINGLE_KEYS,
    checkpoint_info,
    load_file,
    sharded_damage,
)
from ablate.train.untrusted import is_damage


def checkpoint_damage(checkpoint_dir: str | Path, info: dict[str, Any] | None = None) -> str | None:
    """Why a run in ``checkpoint_dir`` would set its checkpoint aside as damaged, judged from the
    ends of its files alone, for ``ablate plan`` (milliseconds, nothing unpickled), or None: no
    checkpoint, or no damage found so. ``torch.save`` writes a zip whose central directory is its
    last bytes (``zipfile`` reads it): a truncated, empty or garbage ``checkpoint.pt`` has none.
    A sharded one (its sidecar's) also needs its train state, each rank's RNG state, and its
    ``.metadata``, a pickle, which ends with pickle's STOP byte. What only a load finds (a pickle
    that does not read, a shard shorter than its metadata says) the run finds; a read the file
    system fails (``untrusted.is_damage``: no damage, the run fails on it) finds none. ``info``:
    its sidecar where the caller has read it (``checkpoint_info``), not read again."""
    d = Path(checkpoint_dir)
    info = checkpoint_info(d) if info is None else info
    if info is None or info.get("format") != SHARDED:
        return _zip_damage(d / CHECKPOINT) if (d / CHECKPOINT).exists() else None
    path, world = d / info["path"], info.get("world", 1)
    for name in ("train_state.pt", *(f"rng-rank{r}.pt" for r in range(world))):
        if why := _zip_damage(path / name):
            return why
    try:
        with open(path / ".metadata", "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(end - 1, 0))
            whole = f.read(1) == pickle.STOP  # b"" when empty
    except OSError as e:
        return f"{path / '.metadata'}: damaged checkpoint metadata ({e})" if is_damage(e) else None
    return None if whole else f"{path / '.metadata'}: damaged checkpoint metadata (truncated)"


def load_damage(
    checkpoint_dir: str | Path, info: dict[str, Any] | None = None
) -> DamagedCheckpointError | None:
    """What makes a run in ``checkpoint_dir`` set its checkpoint aside, found as the run finds it
    before training (the step its attempt starts from, logged first): ``checkpoint.pt`` read as
    ``load_checkpoint`` reads it (its tensors mapped, not read), a sharded one checked as rank 0
    checks it (``sharded_damage``); None: no checkpoint, a sound one, one refused for what it
    holds (``CheckpointError``), or one whose read the file system failed (``OSError``, no
    damage: ``untrusted.is_damage``): the run fails on those. ``info``: its sidecar where the
    caller has read it, not read again."""
    d = Path(checkpoint_dir)
    info = checkpoint_info(d) if info is None else info
    try:
        if info is not None and info.get("format") == SHARDED:
            return sharded_damage(d / info["path"])
        if (d / CHECKPOINT).exists():
            load_file(d / CHECKPOINT, keys=SINGLE_KEYS, mmap=True)
    except DamagedCheckpointError as e:
        return e
    except (CheckpointError, OSError):
        pass
    return None


def _zip_damage(path: Path) -> str | None:
    """Why ``path`` is not a whole ``torch.save`` file (its zip directory, read), or None."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except Exception as e:  # noqa: BLE001 (damaged bytes raise anything from the reader)
        if not is_damage(e):
            return None  # a read the file system failed: the run fails on it
        return f"{path}: damaged or not a checkpoint file ({type(e).__name__}: {e})"
    if not any(n.endswith("/data.pkl") for n in names):
        return f"{path}: not a checkpoint file (no data.pkl in it)"
    return None
