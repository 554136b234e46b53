"""Every package's index stays true: the ``__init__`` docstring of each package of ``ablate`` and
``backends`` names each of its modules and subpackages, and names no module it does not have.

The docstring lists a module (or subpackage) where it names it as code, in double backticks, bare
or under the package's dotted name (``render`` or ``ablate.report.render`` in ``ablate.report``),
or where the name heads a row of an indented table of modules (four spaces, the name, two spaces
or more, what it holds). Its entries are those table rows and each name in double backticks that
opens a bullet (``- ``) or a clause after ``; ``, followed by a colon and what the module holds;
each entry must name a module or subpackage the package has. ``__main__`` and the other dunder
modules are not listed. The checks are functions of a folder, so the last test runs them on a
small fake package to show that each one fails.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
