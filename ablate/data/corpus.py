"""The built-in corpus: real English prose from Python's own documentation topics, docstrings and
comments, identical on every machine with the same Python version, no download needed."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import tokenize
import warnings
from pathlib import Path
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

    Read from the module's *source* where it has one, so the corpus never depends on what else the
    process has imported or patched (Ray and MLflow, for one, replace ``logging``'s record factory;
    reading live objects once gave a Ray worker different data than the driver). Extension modules
    (``math``, ``itertools``...) have no source: their own objects' ``__doc__`` is read instead."""
    path = getattr(mod, "__file__", None)
    if path and path.endswith(".py"):
        return _source_docstrings(mod.__name__, path)
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


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _source_docstrings(modname: str, path: str) -> dict[str, str]:
    """Docstrings of a module file: the module, its top-level classes and functions (also those
    defined under a top-level ``if``/``try``), and the classes' methods."""
    with tokenize.open(path) as f:
        tree = ast.parse(f.read())
    out: dict[str, str] = {}

    def add(qualname: str, node: ast.AST) -> None:
        doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
        if doc and doc.strip():
            out[qualname] = doc

    def top_level(body: list[ast.stmt]) -> list[ast.stmt]:
        stmts: list[ast.stmt] = []
        for st in body:
            if isinstance(st, ast.If):
                stmts += top_level(st.body) + top_level(st.orelse)
            elif isinstance(st, ast.Try):
                stmts += top_level(st.body) + top_level(st.orelse)
                for h in st.handlers:
                    stmts += top_level(h.body)
            else:
                stmts.append(st)
        return stmts

    add(modname, tree)
    for node in top_level(tree.body):
        if not isinstance(node, _DEFS) or node.name.startswith("__"):
            continue
        add(f"{modname}.{node.name}", node)
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, _DEFS[:2]) and not member.name.startswith("__"):
                    add(f"{modname}.{node.name}.{member.name}", member)
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
    """The built-in corpus as documents (see ``_build_documents`` for what and in which order).

    Built by running this file in a pristine interpreter (``python -I -S``: the standard library and
    nothing else), so that nothing the calling process imported or patched can change it: libraries
    such as Ray, MLflow and pytest patch stdlib modules, and a corpus read from a live process once
    differed between a Ray worker and the driver. The result is cached on disk, keyed by the Python
    version and this file's source (``$ABLATE_CACHE_DIR``, default ``~/.cache/ablate``)."""
    from backends.env import cache_dir  # here: this file also runs alone, as `python -I -S`

    src = Path(__file__).read_bytes()
    tag = hashlib.sha256(src + sys.version.encode()).hexdigest()[:16]
    cache = cache_dir()
    path = cache / f"builtin-corpus-{tag}.json"
    try:
        docs: list[str] = json.loads(path.read_text(encoding="utf-8"))
        return docs
    except (OSError, ValueError):
        pass
    out = subprocess.run([sys.executable, "-I", "-S", __file__], capture_output=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(
            f"building the built-in corpus failed: {out.stderr.decode(errors='replace')[-2000:]}"
        )
    docs = json.loads(out.stdout.decode("utf-8"))
    try:  # atomic: concurrent workers may build it at once
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(docs), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # no writable cache: build again next time
    return docs


def _build_documents() -> list[str]:
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


if __name__ == "__main__":  # run by builtin_documents() in a pristine interpreter
    sys.stdout.buffer.write(json.dumps(_build_documents()).encode("utf-8"))
