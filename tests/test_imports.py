"""Dependencies point one way, and each heavy library stays in the one package that owns it.

- ``backends`` imports only torch and the standard library;
- the trainer never imports tracking or cluster libraries;
- Ray only in the executor package (``ablate/executor/``), MLflow only under ``ablate/tracking/``,
  Optuna only under ``ablate/tune/``, pandas and matplotlib only under ``ablate/report/``, click
  only in the CLI;
- no import cycle among the modules of ``ablate`` and ``backends``, counting every import: at module
  level, inside functions, and under ``if TYPE_CHECKING:`` (a cycle that only the type checker
  walks is still two modules that cannot be read apart; it is also how the package indexes that
  load their modules on first use name what they load: ``tests/test_indexes.py``);
- the MLflow tag vocabulary (``"ablate.<name>"``) is spelled only in ``ablate/tracking/vocab.py``;
- no source file of ``ablate`` or ``backends`` is longer than one sitting (``MAX_LINES``): a new
  concept goes into a new module;
- no module imports another module's underscore names, nor reads them through the module
  (``from m import _x``, ``m._x``): what two modules share is public in one of them;
- ``ablate/``'s root holds at most ``MAX_ROOT_MODULES`` modules: the rest live in the rooms;
- what ``ablate.slurm`` runs on every node of a job (``on_node``, ``supervise``) imports only its
  light neighbours: it starts in milliseconds, and neither Ray nor MLflow is imported by
  ``ablate.slurm`` at all (they run there as programs);
- ``docs/architecture.md`` tells these layers true: it names each module at the root of
  ``backends`` (``backends/env.py`` or ``backends.env``), and each ``ablate`` package's row says
  which ``backends`` modules it may import (``backends``, or the module or a package above it),
  ``backends.lazy`` aside (every package index uses it, as the page says).

Every check reads the source with ``ast``: a deferred import inside a function counts the same.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ablate", "backends")
MAX_LINES = 550
MAX_ROOT_MODULES = 6
LONG_FOR_NOW: set[str] = set()  # a temporary exception (a file being split on its own branch)


def _imports(path: Path) -> set[str]:
    """Top-level names of every absolute import in the file (module and function level)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of the tree except those under ``if TYPE_CHECKING:`` (what importing runs)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _targets(
    name: str, path: Path, modules: dict[str, Path], *, type_checking: bool = True
) -> set[str]:
    """The project modules that module ``name`` (at ``path``) imports, one step deep: every import
    anywhere in it, or (``type_checking=False``) only those that importing it executes."""
    package = name if _is_package(path) else name.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found = [mod]
            # `from pkg import sub` imports the submodule pkg.sub
            found += [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
        for mod in found:
            if mod.split(".")[0] not in PACKAGES:
                continue
            while mod and mod not in modules:  # `import a.b.c` where c is a name
                mod = mod.rpartition(".")[0]
            if not mod or name.startswith(mod + "."):  # its own package: being initialized
                continue
            out.add(mod)
            # importing a.b.c first runs the __init__ of a and a.b: an edge, unless the importer
            # is itself inside that package (which is then already being initialized)
            parts = mod.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if not (name == parent or name.startswith(parent + ".")):
                    out.add(parent)
    out.discard(name)
    return out


def import_graph(*, type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports; ``type_checking=False``: only at run time."""
    modules = _modules()
    return {
        name: _targets(name, path, modules, type_checking=type_checking)
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            return cycle
    return None


def test_backends_imports_only_torch_and_stdlib():
    allowed = set(sys.stdlib_module_names) | {"torch", "backends", "__future__"}
    optional = {"torchao"}  # the benchmark compares against it when installed
    for path in (ROOT / "backends").rglob("*.py"):
        extra = _imports(path) - allowed - (optional if path.name == "bench.py" else set())
        assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}"


def test_trainer_never_imports_tracking_or_cluster_libraries():
    forbidden = {"ray", "mlflow", "optuna", "pandas", "matplotlib", "click"}
    for path in (ROOT / "ablate" / "train").rglob("*.py"):
        bad = _imports(path) & forbidden
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


# library -> the files (or folders) of ablate/ allowed to import it
OWNERS = {
    "ray": ["ablate/executor/"],
    "mlflow": ["ablate/tracking/"],
    "optuna": ["ablate/tune/"],
    "pandas": ["ablate/report/"],
    "matplotlib": ["ablate/report/"],
    "click": ["ablate/cli/"],
}


def test_each_heavy_library_is_imported_only_by_the_package_that_owns_it():
    for path in (ROOT / "ablate").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        for lib in _imports(path) & set(OWNERS):
            assert any(rel.startswith(o) for o in OWNERS[lib]), (
                f"{rel} imports {lib}; only {', '.join(OWNERS[lib])} may"
            )


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert (
        "ablate.driver.runner" in graph and "backends.gemm.registry" in graph
    )  # the walk found the code
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    # the finder itself must be able to fail: a deferred import closes a cycle
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_counts_imports_under_type_checking_and_in_functions(tmp_path):
    # two modules tied only by a TYPE_CHECKING import one way and a deferred import the other way
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ablate.fake_b import Thing\n"
    )
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from ablate.fake_a import Other\n")
    modules = {"ablate.fake_a": a, "ablate.fake_b": b}
    graph = {name: _targets(name, path, modules) for name, path in modules.items()}
    assert graph == {"ablate.fake_a": {"ablate.fake_b"}, "ablate.fake_b": {"ablate.fake_a"}}
    assert find_cycle(graph) == ["ablate.fake_a", "ablate.fake_b", "ablate.fake_a"]
    assert _targets("ablate.fake_a", a, modules, type_checking=False) == set()


def test_loading_a_study_imports_neither_the_training_loop_nor_the_report_nor_tune():
    graph = import_graph(type_checking=False)  # what loading a study runs
    seen: set[str] = set()
    todo = [m for m in graph if m.startswith("ablate.study")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    bad = sorted(
        m for m in seen if m.startswith(("ablate.report", "ablate.tune", "ablate.train.loop"))
    )
    assert not bad, f"validating a study imports {bad}"


def test_tag_names_are_spelled_only_in_the_tracking_vocabulary():
    vocab = ROOT / "ablate" / "tracking" / "vocab.py"
    modules = set(_modules())
    tag = re.compile(r"ablate\.[a-z_][a-z0-9_.]*")
    for path in (ROOT / "ablate").rglob("*.py"):
        if path == vocab:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and tag.fullmatch(node.value)
                # a name under one of the project's modules ("ablate.report.x") is not a tag
                and ".".join(node.value.split(".")[:2]) not in modules
            ):
                rel = path.relative_to(ROOT)
                raise AssertionError(f"{rel}:{node.lineno} spells the tag {node.value!r}")


def _long_files(root: Path, exempt: set[str]) -> list[str]:
    """Source files (Python, C) under the packages longer than ``MAX_LINES``, with their length."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.suffix in (".py", ".c", ".h") and rel not in exempt:
                n = len(path.read_text().splitlines())
                if n > MAX_LINES:
                    out.append(f"{rel} ({n} lines)")
    return out


def test_no_source_file_is_longer_than_one_sitting():
    long = _long_files(ROOT, LONG_FOR_NOW)
    assert not long, f"split by concept, over {MAX_LINES} lines: {', '.join(long)}"
    for rel in LONG_FOR_NOW:  # an exception that no longer needs to be one is removed
        assert len((ROOT / rel).read_text().splitlines()) > MAX_LINES, f"{rel}: drop it"


def test_the_length_check_finds_a_long_file(tmp_path):
    (tmp_path / "ablate").mkdir()
    (tmp_path / "backends" / "quant" / "csrc").mkdir(parents=True)
    (tmp_path / "ablate" / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "ablate" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "backends" / "quant" / "csrc" / "k.c").write_text("int x;\n" * (MAX_LINES + 9))
    found = _long_files(tmp_path, set())
    assert found == [
        f"ablate/long.py ({MAX_LINES + 1} lines)",
        f"backends/quant/csrc/k.c ({MAX_LINES + 9} lines)",
    ]
    assert _long_files(tmp_path, {"ablate/long.py", "backends/quant/csrc/k.c"}) == []


def _private_uses(path: Path, modules: set[str]) -> list[str]:
    """``from m import _x`` and ``m._x`` in ``path``, for project modules ``m`` (dunders aside)."""
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # local name -> the project module it is
    out = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if private(a.name):
                    out.append(f"{path.name}:{node.lineno} imports {full}")
                elif full in modules:
                    bound[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES and a.asname:
                    bound[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and private(node.attr)
        ):
            out.append(f"{path.name}:{node.lineno} reads {bound[node.value.id]}.{node.attr}")
    return out


def test_no_module_uses_another_modules_private_names():
    modules = set(_modules())
    found = [u for path in _modules().values() for u in _private_uses(path, modules)]
    assert not found, "make them public where they are shared: " + "; ".join(found)


def test_the_private_name_check_finds_both_forms(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from ablate.train.loop import _build, train\n"
        "from ablate.report import plots\n"
        "plots._legend(None)\nplots.__name__\n"
    )
    found = _private_uses(f, {"ablate.report.plots", "ablate.train.loop"})
    assert found == [
        "m.py:1 imports ablate.train.loop._build",
        "m.py:3 reads ablate.report.plots._legend",
    ]


def test_the_root_of_ablate_holds_a_handful_of_modules():
    root = sorted(p.name for p in (ROOT / "ablate").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, f"ablate/ holds {root}: move them into their rooms"


# what runs on each node of a SLURM job: the modules its import may load
SLURM_NODE_ENTRY = ("ablate.slurm.on_node", "ablate.slurm.supervise")
SLURM_NODE_LIGHT = {
    "ablate",
    "ablate.errors",
    "ablate.slurm",
    "ablate.slurm.allocation",
    "ablate.slurm.ports",
    "ablate.slurm.supervise",
    "ablate.slurm.on_node",
}


def test_what_runs_on_each_slurm_node_imports_only_light_modules():
    graph = import_graph(type_checking=False)
    seen: set[str] = set()
    todo = list(SLURM_NODE_ENTRY)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert seen <= SLURM_NODE_LIGHT, (
        f"a node's supervisor imports {sorted(seen - SLURM_NODE_LIGHT)}"
    )
    for path in (ROOT / "ablate" / "slurm").rglob("*.py"):
        libs = _imports(path) & {"ray", "mlflow", "torch"}
        heavy = {"ray", "mlflow"} | ({"torch"} if _module_name(path) in SLURM_NODE_LIGHT else set())
        assert not libs & heavy, f"{path.relative_to(ROOT)} imports {sorted(libs & heavy)}"


ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(ablate/[a-z_/]+(?:\.py)?)` \|.*\| ([^|]*) \|$", re.MULTILINE)


def _backends_imports(path: Path) -> set[str]:
    """The ``backends`` modules ``path`` (a module, or a folder of them) imports, at any level."""
    out: set[str] = set()
    for f in [path] if path.suffix == ".py" else sorted(path.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return {m for m in out if m.split(".")[0] == "backends" and m != "backends.lazy"}


def architecture_problems(text: str, root: Path) -> list[str]:
    """What ``text`` (the architecture page) leaves untrue about the modules under ``root``."""
    problems = []
    for f in sorted((root / "backends").glob("*.py")):
        if f.stem != "__init__" and not re.search(rf"`backends(/{f.stem}\.py|\.{f.stem})`", text):
            problems.append(f"backends/{f.name} is not named")
    rows = ROW.findall(text)
    assert rows, "no table row of an ablate package found"
    for name, may in rows:
        listed = re.findall(r"`(backends[a-z_.]*)`", may)
        for mod in sorted(_backends_imports(root / name)):
            if "everything above" not in may and not any(
                mod == m or mod.startswith(m + ".") for m in listed
            ):
                problems.append(f"{name} imports {mod}, which its row does not list")
    return problems


def test_the_architecture_page_names_what_each_package_imports_of_backends():
    assert architecture_problems(ARCHITECTURE.read_text(), ROOT) == []


def test_the_architecture_check_finds_an_unnamed_module_and_an_unlisted_import(tmp_path):
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "env.py").write_text("")
    (tmp_path / "ablate" / "data").mkdir(parents=True)
    (tmp_path / "ablate" / "data" / "corpus.py").write_text("from backends.env import x\n")
    row = "| `ablate/data/` | the data | torch, numpy |\n"
    assert architecture_problems(row, tmp_path) == [
        "backends/env.py is not named",
        "ablate/data/ imports backends.env, which its row does not list",
    ]
    fixed = "`backends/env.py`\n\n" + row.replace("torch,", "`backends.env`, torch,")
    assert architecture_problems(fixed, tmp_path) == []
