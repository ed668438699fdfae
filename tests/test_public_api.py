"""The public API is one list, and the docs use only what it holds.

``afk_local._PUBLIC`` (module -> names) is the one list: ``__all__``, ``dir()`` and
the lazy ``__getattr__`` come from it, and the ``TYPE_CHECKING`` imports that type
checkers read are held to it here. Every ``afk.NAME`` in README.md, docs/ and
examples/ must be a public name, every module path the docs still name must
resolve, and the paths earlier docs named keep working for one release.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from typing import Any

import pytest
from proc import REPO, run

import afk_local

pytestmark = pytest.mark.fresh_interpreter  # what a cold import of afk_local loads

DOC_FILES = sorted(
    [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").glob("*.py")]
)

# Paths the docs named before the top-level names existed, and the name each became.
OLD_DOC_PATHS = {
    "afk_local.runner.operations.settle.settle": "settle",
    "afk_local.runner.operations.restart.restart_run": "restart_run",
    "afk_local.runner.observe.observe.add_observer": "add_observer",
    "afk_local.agent.resume.resume_run": "resume_run",
    "afk_local.agent.rebuild.resume_agent": "resume_agent",
    "afk_local.agent.Tool": "Tool",
    "afk_local.agent.tool": "tool",
    "afk_local.watcher.watcher.Watcher": "Watcher",
    "afk_local.watcher.requests.submit_request": "submit_request",
    "afk_local.storage.trust.trust_run": "trust_run",
    "afk_local.storage.trust.require_trusted_run": "require_trusted_run",
    "afk_local.storage.rundir.read.reader.CheckpointNotFoundError": "CheckpointNotFoundError",
    "afk_local.storage.migrate.register": None,  # the shim: format.migrate's old path
}


def _resolve(path: str) -> Any:
    """The object a dotted path names: its longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # a dependency is missing, not the module the path names
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(path)


def _otel_names() -> set[str]:
    """``afk.run_id``, ``afk.attempt``...: span and attribute names, not Python names."""
    source = (REPO / "afk_local" / "integrations" / "otel.py").read_text()
    return {m.split(".")[0] for m in re.findall(r'"afk\.([a-z_.]+)"', source)}


def _entry_point_groups() -> set[str]:
    """``afk_local.mirrors`` and the like: entry-point groups (pyproject), not modules."""
    text = (REPO / "pyproject.toml").read_text()
    return set(re.findall(r'^\[project\.entry-points\."([^"]+)"\]', text, re.M))


def test_all_is_the_sorted_list_of_exports() -> None:
    declared = [name for names in afk_local._PUBLIC.values() for name in names]
    assert len(declared) == len(set(declared)), "a name is listed under two modules"
    assert afk_local.__all__ == sorted([*afk_local._EXPORTS, "__version__"])
    assert set(afk_local._EXPORTS) == set(declared)


def test_type_checking_imports_are_the_exports() -> None:
    tree = ast.parse((REPO / "afk_local" / "__init__.py").read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING"
    )
    reexported = {
        (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name  # ``import X as X``: an explicit re-export
    }
    assert reexported == {(m, n) for m, names in afk_local._PUBLIC.items() for n in names}


def test_namespace_holds_only_the_public_api() -> None:
    """No helper the package imports for itself (``Path``, ``Callable``, ``importlib``)
    leaks out as ``afk_local.Path``: a fresh ``import afk_local`` binds only public
    names, sub-packages and private (underscored) names."""
    child = run(
        "import afk_local\nprint(sorted(n for n in vars(afk_local) if not n.startswith('_')))\n",
        env={"PYTHONPATH": str(REPO)},
    )
    assert child.returncode == 0, child.stderr
    leaked = set(ast.literal_eval(child.stdout.strip())) - set(afk_local.__all__)
    assert leaked <= set(afk_local._SUBPACKAGES), leaked
    assert not hasattr(afk_local, "Path")
    assert not hasattr(afk_local, "Callable")


@pytest.mark.parametrize("name", afk_local.__all__)
def test_every_public_name_resolves_and_is_listed_by_dir(name: str) -> None:
    value = getattr(afk_local, name)
    assert name in dir(afk_local)
    if name != "__version__":
        module = importlib.import_module(afk_local._EXPORTS[name])
        assert value is getattr(module, name)


def test_every_public_name_has_a_docstring() -> None:
    for name in afk_local.__all__:
        value = getattr(afk_local, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), name


def test_import_stays_lazy() -> None:
    """A cold ``import afk_local`` loads no runner, agent or watcher (the CLI's start-up)."""
    child = run(
        "import sys, afk_local\n"
        "print(sorted(m for m in sys.modules if m.startswith(('afk_local.runner', "
        "'afk_local.agent', 'afk_local.watcher', 'afk_local.storage.trust'))))\n",
        env={"PYTHONPATH": str(REPO)},
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"


def test_every_afk_name_in_the_docs_is_public() -> None:
    ignored = _otel_names()
    missing = {
        f"{path.relative_to(REPO)}: afk.{name}"
        for path in DOC_FILES
        for name in re.findall(r"(?<![\w.])afk\.([A-Za-z_]+)", path.read_text())
        if name not in afk_local.__all__ and name not in ignored
    }
    assert missing == set()


def test_api_doc_lists_every_public_name() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    shown = set(re.findall(r"(?<![\w.])afk\.([A-Za-z_]+)", text))
    assert set(afk_local.__all__) - {"__version__"} - shown == set()


def test_every_module_path_in_the_docs_resolves() -> None:
    groups = _entry_point_groups()
    assert "afk_local.mirrors" in groups
    paths = {
        match
        for path in DOC_FILES
        for match in re.findall(r"afk_local(?:\.[A-Za-z_][A-Za-z0-9_]*)+", path.read_text())
        if match not in groups
    }
    assert paths  # the integrations' modules, at least
    for path in sorted(paths):
        _resolve(path)


@pytest.mark.parametrize("path", sorted(OLD_DOC_PATHS))
def test_old_doc_paths_keep_working(path: str) -> None:
    value = _resolve(path)
    name = OLD_DOC_PATHS[path]
    if name is not None:
        assert value is getattr(afk_local, name)


def test_migrate_shim_is_format_migrate() -> None:
    from afk_local.storage import migrate  # noqa: PLC0415
    from afk_local.storage.format import migrate as format_migrate  # noqa: PLC0415

    assert migrate.register is format_migrate.register
    assert migrate.upgrade is format_migrate.upgrade


def test_docs_name_no_deep_path_for_a_public_name() -> None:
    """A public name is shown as ``afk.NAME``, never by the module it happens to live in.

    ``afk_local.errors`` is a home of its own (every error class, also in tracebacks),
    and docs/api.md names the old paths on purpose.
    """
    deep = {
        f"{path.relative_to(REPO)}: {match}"
        for path in DOC_FILES
        if path.name != "api.md"
        for match in re.findall(r"afk_local(?:\.[a-z_]+)+\.([A-Za-z_]+)", path.read_text())
        if match in afk_local.__all__ and f"afk_local.errors.{match}" not in path.read_text()
    }
    assert deep == set()


@pytest.mark.parametrize(
    "entry",
    [
        "import afk_local",
        "import afk_local as afk; afk.Store",
        "import afk_local.integrations.langgraph",
        "from afk_local.cli import main",
    ],
)
def test_entry_points_load_no_lock_library_until_a_lock_is_taken(entry: str) -> None:
    """filelock (50-100 ms to import) loads where ``owner.lock`` is taken, so importing
    the package, the store, the LangGraph saver or the CLI does not pay for it."""
    child = run(
        f"import sys\n{entry}\nprint('filelock' in sys.modules, 'afk_local.runner' in sys.modules)",
        env={"PYTHONPATH": str(REPO)},
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["False", "False"]


_LANGGRAPH = importlib.util.find_spec("langgraph") is not None


@pytest.mark.parametrize(
    ("prelude", "entry", "modules"),
    [
        pytest.param(
            "",
            "import afk_local",
            [
                "afk_local",
                "afk_local._moved",  # old module paths of a moved room, kept for a release
                "afk_local.storage",
                "afk_local.storage.rundir",
                "afk_local.storage.rundir.effects",
            ],
            id="afk_local",
        ),
        pytest.param(
            "import langgraph.checkpoint.base",
            "from afk_local.integrations.langgraph import AfkLocalSaver",
            [
                "afk_local",
                "afk_local._moved",
                "afk_local.integrations",
                "afk_local.integrations.langgraph",
                "afk_local.integrations.langgraph.saver",
                "afk_local.storage",
                "afk_local.storage.rundir",
                "afk_local.storage.rundir.effects",
            ],
            id="langgraph-saver",
            marks=pytest.mark.skipif(not _LANGGRAPH, reason="needs the [langgraph] extra"),
        ),
    ],
)
def test_entry_points_import_only_what_a_call_needs(
    prelude: str, entry: str, modules: list[str]
) -> None:
    """Importing the package or the LangGraph saver loads no storage engine, no msgspec,
    no zstandard, no lock library (and the package not even pathlib): the first call
    that needs them loads them. (Before,
    the saver pulled in the store, the listing, the meta index and most of storage:
    ~10x the import of LangGraph's own SqliteSaver.)"""
    child = run(
        f"import sys\n{prelude}\nbefore = set(sys.modules)\n{entry}\n"
        "new = set(sys.modules) - before\n"
        "print(sorted(m for m in new if m.startswith('afk_local')))\n"
        "libraries = ('msgspec', 'zstandard', 'filelock', 'watchfiles', 'pathlib')\n"
        "print(sorted(m for m in libraries if m in new))",
        env={"PYTHONPATH": str(REPO)},
    )
    assert child.returncode == 0, child.stderr
    afk_modules, libraries = child.stdout.splitlines()
    assert afk_modules == repr(modules)
    assert libraries == "[]"


@pytest.mark.skipif(not _LANGGRAPH, reason="needs the [langgraph] extra")
def test_the_savers_lazy_names_are_the_owning_modules() -> None:
    import afk_local.integrations.langgraph as package  # noqa: PLC0415
    from afk_local.integrations.langgraph import index, threads, writes  # noqa: PLC0415

    assert package.INDEX_NAME == index.INDEX_NAME
    assert package.PHASE == index.PHASE
    assert package.RUN_PREFIX == threads.RUN_PREFIX
    assert package.INTEGRATION == threads.INTEGRATION
    assert package.thread_run_id is threads.thread_run_id
    assert package.WRITES_NAME == writes.WRITES_NAME
    with pytest.raises(AttributeError):
        _ = package.no_such_name
