"""The package's import graph: layers only downward (import-linter), no cycle anywhere.

import-linter checks the contracts in pyproject.toml (layers, the journal's view of
storage, integrations kept out of the core). The cycle test below is stricter than
its per-package ``acyclic_siblings`` contract: it walks every module of the package,
counting imports inside functions and under ``TYPE_CHECKING`` alike.
"""

from __future__ import annotations

import os

import grimp
import pytest
from importlinter.cli import lint_imports
from proc import REPO


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_any_two_modules() -> None:
    graph = grimp.build_graph("afk_local", cache_dir=None)
    assert _cycles(graph) == []


def _package_graph(graph: grimp.ImportGraph) -> grimp.ImportGraph:
    """The graph of packages: an import between two modules is an import between the
    packages that hold them (a module of the root package counts as its own node)."""
    packages = {m for m in graph.modules if graph.find_children(m)}

    def package_of(module: str) -> str:
        return module if module in packages else module.rpartition(".")[0] or module

    squashed = grimp.ImportGraph()
    for module in graph.modules:
        squashed.add_module(package_of(module))
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = package_of(module), package_of(imported)
            # a package and the packages inside it are one tree, not a cycle
            if a != b and not a.startswith(b + ".") and not b.startswith(a + "."):
                squashed.add_import(importer=a, imported=b)
    return squashed


def test_no_import_cycle_between_any_two_packages() -> None:
    """storage and journal, storage.rundir and storage.views...: no two packages
    import each other, directly or through others (issue 26: the journal needs only
    storage's format and I/O seam)."""
    graph = grimp.build_graph("afk_local", cache_dir=None)
    assert _cycles(_package_graph(graph)) == []


def test_the_package_graph_sees_a_package_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.x", "p.x.a", "p.y", "p.y.b"):
        graph.add_module(module)
    graph.add_import(importer="p.x.a", imported="p.y.b")
    graph.add_import(importer="p.y.b", imported="p.x")
    assert _cycles(_package_graph(graph)) == [["p.x", "p.y"]]


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_import_linter_contracts_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert lint_imports(no_cache=True, no_logo=True) == 0, "run `lint-imports` to see which"
    # Its CLI configures logging with dictConfig, which disables the loggers made before
    # it (afk_local's among them) for the rest of the process: conftest turns them on again.


def test_at_most_four_top_level_modules() -> None:
    names = {
        n
        for n in os.listdir(REPO / "afk_local")
        if n.endswith(".py") and n not in {"__init__.py", "__main__.py"}
    }
    assert len(names) <= 4, names
