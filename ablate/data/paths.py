"""What a path that a study names is, from its ``stat`` alone, said the same way for every field:
``not_a_file`` (a file to read: a corpus file, the study file), ``not_a_folder`` (a folder: the
data cache) and ``neither_file_nor_folder`` (either: a tokenizer, a local dataset). A named pipe
is never opened (its read would wait for a writer), a device never read, a symbolic link loop
never followed: each is named as what it is, not as missing."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

_KINDS = {
    stat.S_ISREG: "a regular file",
    stat.S_ISDIR: "a directory",
    stat.S_ISFIFO: "a named pipe",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISSOCK: "a socket",
}


def _why_not(path: str | Path, ok: tuple[Callable[[int], bool], ...], wanted: str) -> str | None:
    """Why ``path`` is not one of the kinds ``ok`` accepts (named ``wanted``), or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a link to a missing file" if os.path.islink(path) else "does not exist"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symbolic link loop"
        return f"cannot be read ({e.strerror})"
    if any(test(mode) for test in ok):
        return None
    kind = next((name for test, name in _KINDS.items() if test(mode)), "another kind of file")
    return f"is not {wanted} ({kind})"


def not_a_file(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file to read (``does not exist``, ``is a symbolic link loop``,
    ``is not a regular file (a named pipe)``...). None for a regular file, or a link to one."""
    return _why_not(path, (stat.S_ISREG,), "a regular file")


def not_a_folder(path: str | Path) -> str | None:
    """Why ``path`` is not a folder (``is not a folder (a named pipe)``...). None for a folder, or
    a link to one."""
    return _why_not(path, (stat.S_ISDIR,), "a folder")


def neither_file_nor_folder(path: str | Path) -> str | None:
    """Why ``path`` is neither a regular file nor a folder (``is not a regular file or a folder (a
    character device)``...). None for either, or a link to either."""
    return _why_not(path, (stat.S_ISREG, stat.S_ISDIR), "a regular file or a folder")
