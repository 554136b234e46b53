"""Every package's index stays true: the ``__init__`` docstring of each package of ``ablate`` and
``backends`` names each of its modules and subpackages, and names no module it does not have.

The docstring lists a module (or subpackage) where it names it as code, in double backticks, bare
or under the package's dotted name (``render`` or ``ablate.report.render`` in ``ablate.report``),
or where the name heads a row of an indented table of modules (four spaces, the name, two spaces
or more, what it holds). Its entries are those table rows and each name in double backticks that
opens a bullet (``- ``) or a clause after ``; ``, followed by a colon and what the module holds;
each entry must name a module or subpackage the package has. ``__main__`` and the other dunder
modules are not listed. The checks are functions of a folder, so a test runs them on a small
fake package to show that each one fails.

An index that loads its modules on first use (``backends.lazy``) says its names three times: to
mypy, to Python and in ``__all__``; the three must agree, checked on its source (and on a fake one).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ablate", "backends")

NAME = r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*"
QUOTED = re.compile(rf"``({NAME})``")
ENTRY = re.compile(rf"(?:^\s*- |; )``({NAME})``:", re.MULTILINE)
ROW = re.compile(r"^ {4}([a-z_][a-z0-9_]*) {2,}\S", re.MULTILINE)


def members(folder: Path) -> set[str]:
    """The modules and subpackages of the package at ``folder`` (dunder modules aside)."""
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")}
    return modules | {p.parent.name for p in folder.glob("*/__init__.py")}


def _relative(name: str, dotted: str) -> str | None:
    """``name`` as a member of package ``dotted``: itself when bare, its part under the package
    when dotted under it (``ablate.report.render`` -> ``render``), else None (another package's)."""
    if "." not in name:
        return name
    if name.startswith(dotted + "."):
        return name[len(dotted) + 1 :].split(".")[0]
    return None


def index_problems(folder: Path, dotted: str) -> list[str]:
    """What the index of the package at ``folder`` (imported as ``dotted``) gets wrong: each member
    it does not list, each entry that names no member."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()), clean=False) or ""
    have = members(folder)
    heads = set(ROW.findall(doc))
    named = {_relative(n, dotted) for n in QUOTED.findall(doc)} | heads
    entries = {_relative(n, dotted) for n in ENTRY.findall(doc)} | heads
    rel = (folder / "__init__.py").relative_to(folder.parents[dotted.count(".")]).as_posix()
    out = [f"{rel} does not list {m}" for m in sorted(have - named)]
    out += [f"{rel} lists {m}, which it does not have" for m in sorted(entries - {None} - have)]
    return out


def packages(root: Path) -> dict[str, Path]:
    """Every package under ``root``'s ``PACKAGES``: its dotted name -> its folder."""
    out = {}
    for pkg in PACKAGES:
        for init in sorted((root / pkg).rglob("__init__.py")):
            folder = init.parent
            out[".".join(folder.relative_to(root).parts)] = folder
    return out


def test_every_package_lists_its_modules_and_only_those():
    found = packages(ROOT)
    assert {"ablate", "ablate.report.ladder", "backends.quant"} <= set(
        found
    )  # the walk found the code
    problems = [p for dotted, folder in found.items() for p in index_problems(folder, dotted)]
    assert not problems, "fix the package's index: " + "; ".join(problems)


def test_the_index_check_finds_a_missing_module_and_a_module_that_is_not_there(tmp_path):
    pkg = tmp_path / "ablate" / "fake"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "__init__.py").write_text('"""A subpackage.\n\n    one  the one module\n"""\n')
    for name in ("one", "two", "three", "four", "__main__"):
        (pkg / name).with_suffix(".py").write_text("x = 1\n")
    (pkg / "sub" / "one.py").write_text("x = 1\n")
    (pkg / "__init__.py").write_text(
        '"""A fake package.\n\n'
        "    one    the first module\n"
        "    gone   a module that was moved away\n"
        "           (a continuation line)\n\n"
        "- ``two``: the second; ``stale``: a renamed one\n"
        "- the third is ``ablate.fake.three``, ``ablate.other.four`` another package's\n"
        '"""\n'
    )
    assert members(pkg) == {"one", "two", "three", "four", "sub"}
    assert index_problems(pkg, "ablate.fake") == [
        "ablate/fake/__init__.py does not list four",
        "ablate/fake/__init__.py does not list sub",
        "ablate/fake/__init__.py lists gone, which it does not have",
        "ablate/fake/__init__.py lists stale, which it does not have",
    ]
    assert index_problems(pkg / "sub", "ablate.fake.sub") == []
    assert set(packages(tmp_path)) == {"ablate.fake", "ablate.fake.sub"}


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def lazy_index_problems(source: str, dotted: str) -> list[str]:
    """What the index ``source`` of package ``dotted``, one that loads on first use, gets wrong:
    the names imported under ``if TYPE_CHECKING:`` (what mypy reads), the ``_LAZY`` table (what
    Python loads) and ``__all__`` must be the same names from the same modules (``ROOMS``, the
    subpackages an index gives by name, aside), and ``__getattr__`` must be bound only under ``if
    not TYPE_CHECKING:``: one that mypy sees makes every name of the package ``Any`` to it, a
    misspelt import included."""
    typed: dict[str, str] = {}
    table: dict[str, str] = {}
    exported: list[str] = []
    rooms: tuple[str, ...] = ()
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    owner = importlib.util.resolve_name(
                        "." * imp.level + (imp.module or ""), dotted
                    )
                    typed.update({alias.asname or alias.name: owner for alias in imp.names})
        elif isinstance(node, ast.If) and (
            isinstance(node.test, ast.UnaryOp)
            and isinstance(node.test.op, ast.Not)
            and _is_type_checking(node.test.operand)
        ):
            continue
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            out.append("mypy sees its __getattr__")
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
            if target == "__getattr__":
                out.append("mypy sees its __getattr__")
            elif target == "_LAZY":  # a dict display, with ``**dict.fromkeys(names, module)``
                code = compile(ast.Expression(value), "<_LAZY>", "eval")
                lazy = eval(code, {"__builtins__": {}, "dict": dict})
                table = {k: importlib.util.resolve_name(v, dotted) for k, v in lazy.items()}
            elif target == "__all__":
                exported = ast.literal_eval(value)
            elif target == "ROOMS":
                rooms = ast.literal_eval(value)
    for name in sorted(set(table) - set(typed)):
        out.append(f"_LAZY has {name}, which mypy does not see")
    for name in sorted(set(typed) - set(table)):
        out.append(f"mypy sees {name}, which _LAZY does not load")
    for name in sorted(set(table) & set(typed)):
        if table[name] != typed[name]:
            out.append(f"{name}: _LAZY loads it from {table[name]}, mypy reads {typed[name]}")
    if set(exported) - set(rooms) != set(table):
        differ = sorted((set(exported) - set(rooms)) ^ set(table))
        out.append(f"__all__ is not _LAZY's names: {differ}")
    return out


def test_each_index_that_loads_on_first_use_says_its_names_alike_to_python_and_mypy():
    sources = {d: (f / "__init__.py").read_text() for d, f in packages(ROOT).items()}
    lazy = {d: source for d, source in sources.items() if "_LAZY" in source}
    assert len(lazy) >= 9
    problems = [
        f"{dotted}: {p}"
        for dotted, source in lazy.items()
        for p in lazy_index_problems(source, dotted)
    ]
    assert not problems, "; ".join(problems)


def test_the_lazy_index_check_finds_each_kind_of_drift():
    index = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.a import One, Two\n"
        "    from .b import Three\n"
        '_LAZY = {"One": "pkg.a", **dict.fromkeys(("Two", "Four"), ".b"), "Three": ".b"}\n'
        '__all__ = ["One", "Two", "Three", "sub"]\n'
        'ROOMS = ("sub",)\n'
        "def __getattr__(name): ...\n"
    )
    assert lazy_index_problems(index, "pkg") == [
        "mypy sees its __getattr__",
        "_LAZY has Four, which mypy does not see",
        "Two: _LAZY loads it from pkg.b, mypy reads pkg.a",
        "__all__ is not _LAZY's names: ['Four']",
    ]
    fixed = index.replace(
        '**dict.fromkeys(("Two", "Four"), ".b")', '**dict.fromkeys(("Two",), "pkg.a")'
    ).replace("def __getattr__", "if not TYPE_CHECKING:\n    def __getattr__")
    assert lazy_index_problems(fixed, "pkg") == []
    assert lazy_index_problems(fixed.replace("One, Two", "One"), "pkg") == [
        "_LAZY has Two, which mypy does not see"
    ]


def test_the_getattr_an_index_binds_loads_names_and_rooms_and_refuses_the_rest():
    from backends.lazy import lazy_getattr

    get = lazy_getattr("ablate.study", {"StudyError": "..errors", "dumps": "json"}, ("cells",))
    from ablate.errors import StudyError
    from ablate.study import cells

    assert get("StudyError") is StudyError and get("cells") is cells
    assert get("dumps") is json.dumps
    with pytest.raises(AttributeError, match="module 'ablate.study' has no attribute 'Nope'"):
        get("Nope")


def test_a_package_that_loads_on_first_use_gives_each_name_it_exports():
    """The indexes that import their modules on first attribute access (a ``_LAZY`` table of name
    -> module, for a study checked without torch): each name of ``__all__`` is in the table and
    resolves to the object its module defines."""
    import importlib

    lazy = {}
    for dotted in packages(ROOT):
        module = importlib.import_module(dotted)
        if hasattr(module, "_LAZY"):
            lazy[dotted] = module
    assert {"backends", "backends.quant", "backends.gemm", "ablate.data", "ablate.model"} <= set(
        lazy
    )
    for dotted, module in lazy.items():
        table = module._LAZY
        missing = sorted(set(module.__all__) - set(table) - set(getattr(module, "ROOMS", ())))
        assert not missing, f"{dotted}: __all__ names what _LAZY does not: {missing}"
        for name in module.__all__:
            if name in table:
                owner = importlib.import_module(table[name], dotted)  # ".cells": relative
                assert getattr(module, name) is getattr(owner, name), (dotted, name)
