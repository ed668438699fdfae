"""Store roots read alike in Python and on the command line: ``~`` expanded, blanks refused.

Real processes with ``HOME`` and ``AFK_LOCAL_ROOT`` set as a user's shell would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SAVE = "import afk_local as afk; afk.StateCheckpoint(afk.Store().root).save({'i': 1})"


def child(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "AFK_LOCAL_ROOT"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env={**full, **env}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_a_tilde_root_is_the_home_directory_in_python_and_the_cli(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"HOME": str(home), "AFK_LOCAL_ROOT": "~/x"}
    script = "import afk_local as afk; afk.Store('~/.afk').create('r1').close(); " + (
        "afk.Store().create('r2').close()"
    )
    made = child(["-c", script], work, env)
    assert made.returncode == 0, made.stderr
    assert not (work / "~").exists()  # no literal ./~ directory
    assert (home / ".afk" / "runs" / "r1").is_dir() and (home / "x" / "runs" / "r2").is_dir()
    listed = child(["-m", "afk_local", "runs"], work, env)  # AFK_LOCAL_ROOT='~/x'
    assert listed.returncode == 0, listed.stderr
    assert "r2" in listed.stdout
    listed = child(["-m", "afk_local", "--root", "~/.afk", "runs"], work, env)
    assert listed.returncode == 0, listed.stderr
    assert "r1" in listed.stdout


@pytest.mark.parametrize("root", [" ", "\n", "  \t", "a\nb"])
def test_a_blank_root_is_refused_alike_in_python_and_the_cli(tmp_path: Path, root: str) -> None:
    env = {"HOME": str(tmp_path), "AFK_LOCAL_ROOT": root}
    made = child(["-c", SAVE], tmp_path, env)
    assert made.returncode == 1
    assert made.stderr.splitlines()[-1].startswith("afk_local.errors.InvalidStoreRootError: ")
    for args in (["runs"], ["--root", root, "runs"]):
        cli = child(["-m", "afk_local", *args], tmp_path, {"HOME": str(tmp_path)} | (
            {} if "--root" in args else {"AFK_LOCAL_ROOT": root}
        ))  # fmt: skip
        assert cli.returncode == 2
        [line] = cli.stderr.splitlines()
        assert line.startswith("afk-local: invalid store root ")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was created
