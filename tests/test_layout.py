"""The packages import one way: rlvr/ and slurm/ may use everything; actors/ and learner/ use
tasks/ and protocol/ and never each other; tasks/ and protocol/ use neither side."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "actors": {"learner", "rlvr", "slurm"},
    "learner": {"actors", "rlvr", "slurm"},
    "tasks": {"actors", "learner", "rlvr", "slurm", "protocol"},
    "protocol": {"actors", "learner", "rlvr", "slurm", "tasks"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level package of every import in `path`, function-level imports included."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_the_layout_allows(package):
    offenders = {str(p.relative_to(ROOT)): sorted(imported_packages(p) & FORBIDDEN[package])
                 for p in sorted((ROOT / package).rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_scan_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from learner.update import policy_update\n")
    assert imported_packages(module) == {"learner"}
