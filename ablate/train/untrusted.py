"""Pickles read as untrusted: checkpoint files, a sharded checkpoint's DCP metadata and entries.

``plain`` is ``torch.load`` of tensors and plain values only (``weights_only=True``): a pickle that
names a global (an object to build: what a pickle written to run code needs) is refused with
``CheckpointError``, one that does not read (garbage, truncated) with ``DamagedCheckpointError``;
a read the file system fails (an I/O error, a permission refused: not damage, ``is_damage``) passes.
``torch.distributed.checkpoint`` (DCP) unpickles its ``.metadata`` file with plain pickle and a
state dict's non-tensor entries with an unrestricted ``torch.load``; ``dcp_load`` and
``dcp_metadata`` read them instead, the metadata checked by an unpickler that knows only DCP's own
metadata classes (``checked_metadata``), the entries with ``plain``. ``ablate.train.checkpoint``
reads every file through these.
"""

from __future__ import annotations

import errno
import io
import pickle
from pathlib import Path
from typing import Any

import torch

from ablate.errors import CheckpointError, DamagedCheckpointError


def plain(source: Path | io.BytesIO, what: str, *, mmap: bool = False) -> Any:
    """``torch.load`` of tensors and plain values only; ``CheckpointError`` naming ``what`` when the
    pickle names a global (an object to build: what a pickle written to run code needs), else
    ``DamagedCheckpointError`` when it does not read (garbage: an opcode the loader has not)."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "GLOBAL" not in str(e):
            raise DamagedCheckpointError(
                f"{what}: damaged or not a checkpoint file ({_why(e)})"
            ) from None
        raise CheckpointError(
            f"{what}: refused, not loaded: it holds objects other than tensors and plain values, "
            f"which no file this project writes does (unpickling them could run code): {_why(e)}"
        ) from None


_DAMAGE_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EINVAL)


def is_damage(e: BaseException) -> bool:
    """Whether ``e``, raised reading a checkpoint's file, is what damage raises: the file missing
    or not a file (``ENOENT``, ``ENOTDIR``, ``EISDIR``), or its bytes not a checkpoint's (truncated,
    garbage: ``EOFError``, the unpickler's or the zip reader's errors, anything not an ``OSError``;
    an ``OSError`` without an errno, or ``EINVAL``, torch's zip reader seeking past the end of a
    truncated file). Any other ``OSError`` is a read the file system failed (an I/O error, a
    permission refused, a stale NFS handle), no damage: it passes, the attempt fails and is
    retried, and nothing is set aside."""
    return not isinstance(e, OSError) or e.errno is None or e.errno in _DAMAGE_ERRNOS


def _why(e: BaseException) -> str:
    """The line of torch's weights-only refusal that names what was refused."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    named = [ln for ln in lines if "Unsupported" in ln or "GLOBAL" in ln]
    return (named or lines or [type(e).__name__])[0]


# -- sharded checkpoints: DCP's metadata and non-tensor entries (module docstring) ---------------

_DCP_META = "torch.distributed.checkpoint.metadata"
_DCP_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _Refused(pickle.UnpicklingError):
    """A global that DCP's metadata never holds."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import importlib

        if (module, name) in _DCP_GLOBALS:
            return super().find_class(module, name)
        if module == _DCP_META:
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        raise _Refused(f"{module}.{name} is not part of a checkpoint's metadata")


def checked_metadata(path: Path) -> Any:
    """The DCP metadata in the file ``path``, unpickled knowing DCP's metadata classes only:
    ``CheckpointError`` when it names anything else, ``DamagedCheckpointError`` when it does not
    read (missing, truncated, garbage); a read the file system fails passes (``is_damage``)."""
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise DamagedCheckpointError(f"{path}: damaged checkpoint metadata (missing)") from None
    except _Refused as e:
        raise CheckpointError(
            f"{path}: refused, not loaded: not the metadata of a checkpoint ({e}; unpickling it "
            "could run code)"
        ) from None
    except Exception as e:  # noqa: BLE001 (damaged bytes raise anything from the unpickler)
        if not is_damage(e):
            raise
        raise DamagedCheckpointError(f"{path}: damaged checkpoint metadata ({e})") from None


def _reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            checked_metadata(Path(path) / name)  # refuses before DCP unpickles it
            return super().read_metadata(*args, **kwargs)

    return Reader(str(path))


def _planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = plain(value, f"checkpoint entry {read_item.dest_index.fqn}")
            super().load_bytes(read_item, _saved(obj))

    return Planner()


def _saved(obj: Any) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def dcp_metadata(path: Path) -> Any:
    """The DCP metadata of the sharded checkpoint in ``path``, checked (``CheckpointError``)."""
    return _reader(path).read_metadata()


def dcp_load(state: dict[str, Any], path: Path, *, no_dist: bool = False) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` (in place) from ``path``, its metadata and
    non-tensor entries read as untrusted."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=_reader(path), planner=_planner(), no_dist=no_dist)
    except CheckpointException as e:  # DCP wraps each rank's error: ours, named, comes first
        for failure in e.failures.values():
            err = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(err, CheckpointError):  # damaged or refused, as it was
                raise type(err)(f"{path}: {err}") from None
        raise
