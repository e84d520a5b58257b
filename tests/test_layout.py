"""The layering of tests and benchmarks: what they share lives in the package
(k2back.testing), so no test module imports another and no benchmark reaches
into tests/ through sys.path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_MODULES = {p.stem for p in (ROOT / "tests").glob("*.py")}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):  # relative: tests/ is no package
            names.add(".")
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("*.py")), ids=lambda p: p.name)
def test_no_test_module_imports_another(path):
    shared = imported_modules(path) & (TEST_MODULES | {"tests", "."})
    assert not shared, f"{path.name} imports {sorted(shared)}: move the helper into k2back.testing"


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_use_the_package_only(path):
    assert "sys.path" not in path.read_text(), f"{path.name} edits sys.path"
    assert not imported_modules(path) & (TEST_MODULES | {"tests", "."}), path.name
