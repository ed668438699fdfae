"""The old module paths of the runner, the CLI and the run directory keep importing for
one release (afk_local/_moved.py), with a DeprecationWarning, as the same module objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from afk_local._moved import MOVED


def test_every_old_path_names_a_module_that_exists() -> None:
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None, new


# Old paths are spelled in two parts so that rewriting old imports to new ones (a
# sed over the tree) leaves this test alone.
OLD_CONTEXT = "afk_local.runner." + "run_context"
OLD_WRITER = "afk_local.storage.rundir import " + "writer"
OLD_READ = "afk_local.cli." + "read"


def test_every_old_path_is_a_moved_module() -> None:
    assert len(MOVED) == 53
    assert MOVED[OLD_CONTEXT] == "afk_local.runner.run.run_context"


def test_an_old_path_imports_the_module_at_its_new_path() -> None:
    script = (
        "import warnings, sys\n"
        "warnings.simplefilter('error')\n"
        "import afk_local\n"
        "try:\n"
        f"    import {OLD_CONTEXT}\n"
        "except DeprecationWarning as w:\n"
        "    print('warned', w)\n"
        "warnings.simplefilter('ignore')\n"
        f"import {OLD_CONTEXT} as old\n"
        f"from {OLD_WRITER} as old_writer\n"
        f"from {OLD_READ} import cmd_show\n"
        "import afk_local.runner.run.run_context as new\n"
        "import afk_local.storage.rundir.write.writer as new_writer\n"
        "import afk_local.cli.commands.read as new_read\n"
        "print(old is new, old_writer is new_writer, cmd_show is new_read.cmd_show)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith(f"warned {OLD_CONTEXT} moved to")
    assert out[1] == "True True True"


@pytest.mark.parametrize("name", ["afk_local.runner.nothing_here", "afk_local.cli.nothing_here"])
def test_a_name_that_never_existed_still_fails(name: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)
