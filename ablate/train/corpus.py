"""The built-in corpus: real English prose from Python's own documentation topics, docstrings and
comments, identical on every machine with the same Python version, no download needed."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import pkgutil
import tokenize
import warnings
from types import ModuleType

# Standard-library modules (and, for packages, their submodules) whose docstrings and comments make
# the built-in corpus. Mostly pure Python and the same on every platform; modules that need optional
# C libraries (sqlite3, ssl, curses, tkinter, ...) or only exist on one OS are left out, so a build
# that lacks them still gives the same corpus. Modules that fail to import are skipped anyway.
_BUILTIN_MODULE_NAMES = """
abc argparse ast asyncio base64 bdb binascii bisect builtins calendar cmath cmd code codecs codeop
collections colorsys compileall concurrent configparser contextlib contextvars copy copyreg csv
dataclasses datetime decimal difflib dis doctest email enum filecmp fileinput fnmatch fractions
ftplib functools gettext glob graphlib gzip heapq hmac html http imaplib importlib inspect io
ipaddress itertools json keyword linecache locale logging mailbox math mimetypes modulefinder
multiprocessing netrc ntpath numbers opcode operator optparse pathlib pdb pickle pickletools
pkgutil platform plistlib poplib posixpath pprint profile pstats py_compile pyclbr pydoc queue
quopri random re reprlib rlcompleter runpy sched secrets shelve shlex shutil smtplib socketserver
statistics string stringprep struct symtable sysconfig tabnanny tarfile tempfile textwrap
threading timeit token tokenize tomllib trace traceback types typing unicodedata unittest urllib
uuid warnings wave weakref webbrowser wsgiref xml xmlrpc zipapp zipfile zipimport zoneinfo
"""
_BUILTIN_MODULES = _BUILTIN_MODULE_NAMES.split()


def _stdlib_modules() -> list[ModuleType]:
    mods = []
    for name in _BUILTIN_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        mods.append(mod)
        if not hasattr(mod, "__path__"):
            continue
        walk = pkgutil.walk_packages(mod.__path__, name + ".", onerror=lambda _: None)
        for sub in sorted(info.name for info in walk):
            if "__main__" in sub or ".test" in sub:
                continue
            try:
                mods.append(importlib.import_module(sub))
            except Exception:  # e.g. asyncio.windows_events on Linux
                continue
    return mods


def _docstrings(mod: ModuleType) -> dict[str, str]:
    """Qualified name -> docstring of the module, its classes and functions, and their methods.
    Each object's own ``__doc__``: ``inspect.getdoc`` would repeat a base class's text."""
    out: dict[str, str] = {}

    def add(qualname: str, obj: object) -> None:
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and doc.strip():
            out[qualname] = inspect.cleandoc(doc)

    add(mod.__name__, mod)
    for name, obj in vars(mod).items():
        if name.startswith("__") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) != mod.__name__:  # re-exported from elsewhere
            continue
        add(f"{mod.__name__}.{name}", obj)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if not attr.startswith("__") and (
                    inspect.isroutine(member) or isinstance(member, property)
                ):
                    add(f"{mod.__name__}.{name}.{attr}", member)
    return out


def _comment_blocks(mod: ModuleType) -> list[str]:
    """Runs of two or more ``#`` comment lines in the module's source that are mostly letters:
    prose, not banners, tables or commented-out code."""
    path = getattr(mod, "__file__", None)
    if not path or not path.endswith(".py"):
        return []
    blocks: list[str] = []
    block: list[str] = []
    with tokenize.open(path) as f:
        for line in [*f, ""]:
            s = line.strip()
            if s.startswith("#") and not s.startswith("#!"):
                block.append(s.lstrip("#").strip())
                continue
            text = "\n".join(block)
            block = []
            if len(text.splitlines()) >= 2 and sum(
                c.isalpha() or c.isspace() for c in text
            ) >= 0.8 * len(text):
                blocks.append(text)
    return blocks


def builtin_documents() -> list[str]:
    """The built-in corpus as documents: the Python documentation topics (``pydoc_data``), then per
    module one document of its docstrings (sorted by qualified name, duplicates dropped) and one of
    its comment blocks. Identical on every machine with the same Python version and OS.

    Documents are ordered by the sha256 of their key (``topic:for``, ``doc:json``, ...), a fixed order
    that mixes the sources, so the validation set at the end of the stream is a fair sample of them.
    """
    topics: dict[str, str] = {}
    try:
        import pydoc_data.topics  # a stripped Python may lack it

        topics = pydoc_data.topics.topics
    except ImportError:
        pass
    keyed = [(f"topic:{k}", v) for k, v in topics.items()]
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules warn on import and attribute access
        for mod in _stdlib_modules():
            parts = []
            for _, doc in sorted(_docstrings(mod).items()):
                if doc not in seen:
                    seen.add(doc)
                    parts.append(doc)
            keyed.append((f"doc:{mod.__name__}", "\n\n".join(parts)))
            keyed.append((f"comments:{mod.__name__}", "\n\n".join(_comment_blocks(mod))))
    keyed.sort(key=lambda kv: hashlib.sha256(kv[0].encode()).digest())
    return [text for _, text in keyed if text.strip()]
