"""The packages import one way: rlvr/ and slurm/ may use everything; actors/ and learner/ use
tasks/ and protocol/ and never each other; tasks/ and protocol/ use neither side. Within them, no
two modules import each other (a function-level or type-checking import counts: it is the same
knot, only tied later)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "learner", "protocol", "tasks", "rlvr", "slurm", "scripts")
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


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The project's modules `path` imports, anywhere in it: `from a.b import c` names a.b, and
    a.b.c too when c is a module."""
    found = set()
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return (found & known) - {here}


def test_no_two_modules_import_each_other():
    paths = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    known = {module_name(p) for p in paths}
    imports = {module_name(p): imported_modules(p, known) for p in paths}
    pairs = sorted({tuple(sorted((a, b))) for a, got in imports.items() for b in got
                    if a in imports.get(b, ())})
    assert pairs == []


def test_the_module_scan_sees_a_pair_tied_inside_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    a, b = tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "b.py"
    a.write_text("from pkg.b import g\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    known = {"pkg.a", "pkg.b", "pkg"}
    assert imported_modules(a, known, tmp_path) == {"pkg.b"}
    assert imported_modules(b, known, tmp_path) == {"pkg", "pkg.a"}
