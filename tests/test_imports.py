"""Dependencies point one way: ``backends`` imports only torch and the standard library."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


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
