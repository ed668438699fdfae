"""Rooms a newcomer can hold in their head: no package holds more than 14 modules side by
side, and no class runs past 350 lines (docs/architecture.md, "Rooms and their size").

A package that grows past 14 modules is split into sub-packages by concern; a class that
grows past 350 lines is split along its jobs, the facade delegating to the parts.
"""

from __future__ import annotations

import ast
from pathlib import Path

from proc import REPO

MAX_MODULES = 14
MAX_CLASS_LINES = 350

ALLOWED_LARGE = {
    # Implements LangGraph's BaseCheckpointSaver protocol method by method; it stays whole.
    "AfkLocalSaver",
}


def crowded_packages(root: Path) -> dict[str, int]:
    """Every package under ``root`` that directly holds more than MAX_MODULES modules
    (``__init__.py`` is the package itself and does not count)."""
    crowded = {}
    for init in sorted(root.rglob("__init__.py")):
        package = init.parent
        modules = [p for p in package.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES:
            crowded[str(package.relative_to(root.parent))] = len(modules)
    return crowded


def large_classes(root: Path) -> dict[str, int]:
    """Every class under ``root`` longer than MAX_CLASS_LINES lines, decorators included."""
    large = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = (node.end_lineno or node.lineno) - start + 1
                if length > MAX_CLASS_LINES:
                    large[f"{path.relative_to(root.parent)}:{node.name}"] = length
    return large


def test_no_package_holds_more_than_14_modules() -> None:
    assert crowded_packages(REPO / "afk_local") == {}


def test_no_class_over_350_lines_but_the_saver() -> None:
    allowed = ALLOWED_LARGE
    large = large_classes(REPO / "afk_local")
    assert {k: v for k, v in large.items() if k.rpartition(":")[2] not in allowed} == {}


def test_the_checks_see_a_crowded_package_and_a_large_class(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for i in range(MAX_MODULES + 1):
        (package / f"m{i}.py").write_text("")
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (package / "m0.py").write_text(f"class Big:\n{body}\n\n\nclass Small:\n    pass\n")
    assert crowded_packages(package) == {"pkg": MAX_MODULES + 1}
    assert large_classes(package) == {"pkg/m0.py:Big": MAX_CLASS_LINES + 1}
