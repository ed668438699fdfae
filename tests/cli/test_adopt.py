"""A copied or moved store is noticed before anything runs, and ``afk-local adopt`` re-homes it.

Real processes: a script job is SIGKILLed partway in project ``a``; the whole project
(script and store) is copied with ``cp -a`` to ``b``. Resuming from ``b`` — by
``afk-local resume`` or by the watcher — is refused in one line, and nothing of ``a``
changes (no file is written, no effect runs there). After ``afk-local adopt`` the
resume completes in ``b``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import test_script_jobs
from proc import REPO
from test_script_jobs import N, afk_local, items_done, make_project, start_and_kill

import afk_local as afk


@pytest.fixture(autouse=True)
def this_afk_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """The children import the afk_local under test, wherever the installed one points."""
    plain = test_script_jobs.no_pythonpath

    def env() -> dict[str, str]:
        return {**plain(), "PYTHONPATH": str(REPO)}

    monkeypatch.setattr(test_script_jobs, "no_pythonpath", env)


RESUME_IN_PYTHON = "import sys, afk_local as afk; afk.resume('script-job', store=sys.argv[1])"


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and mtime (symlinks: their target)."""
    found: dict[str, tuple[bytes, int]] = {}
    for path in sorted(directory.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            found[str(path)] = (str(path.readlink()).encode(), st.st_mtime_ns)
        elif path.is_file():
            found[str(path)] = (path.read_bytes(), st.st_mtime_ns)
        else:
            found[str(path)] = (b"<dir>", 0)
    return found


def copy_project(a: Path, b: Path) -> Path:
    b.mkdir()
    (b / "elsewhere").mkdir()
    subprocess.run(["cp", "-a", str(a / "project"), str(b / "project")], check=True)
    return b / "project"


def test_a_copied_store_is_refused_leaves_the_original_untouched_and_adopt_rehomes_it(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    original = make_project(a)
    start_and_kill(original, acks=4)
    done_in_a = items_done(original)
    copy = copy_project(a, b)
    before = snapshot(a)

    # listing says the store moved before anyone tries to resume
    moved = (
        f"afk-local: warning: {copy / '.afk'}: this store was created at {original / '.afk'} "
        f"and is now here (copied or moved); no run resumes from it until `afk-local --root "
        f"{copy / '.afk'} adopt` (read anyway; nothing is executed)"
    )
    assert moved in afk_local(b, "runs").stderr.splitlines()
    shown = afk_local(b, "show", "script-job", "--json")
    assert moved in shown.stderr.splitlines()
    assert json.loads(shown.stdout)["store_moved_from"] == str(original / ".afk")

    refused = afk_local(b, "resume", "script-job")
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.splitlines()  # one line
    assert f"created at {original / '.afk'}" in line
    assert f"now at {copy / '.afk'} (copied or moved)" in line
    assert f"afk-local --root {copy / '.afk'} adopt" in line
    assert refused.stdout == ""

    watched = afk_local(b, "watch", "--once")  # the watcher refuses it too
    assert "copied or moved" in watched.stdout + watched.stderr, (watched.stdout, watched.stderr)

    in_python = subprocess.run(
        [sys.executable, "-c", RESUME_IN_PYTHON, str(copy / ".afk")],
        cwd=b / "elsewhere",
        capture_output=True,
        text=True,
        env=test_script_jobs.no_pythonpath(),
        timeout=120,
    )  # fmt: skip
    assert in_python.returncode == 1
    assert "StoreMovedError" in in_python.stderr
    assert snapshot(a) == before  # nothing of the original changed: no file, no effect
    assert afk.Store(copy / ".afk").read_meta("script-job").status is afk.RunStatus.RUNNING

    adopted = afk_local(b, "adopt", "--json")
    assert adopted.returncode == 0, adopted.stderr
    assert json.loads(adopted.stdout) == {
        "root": str(copy / ".afk"),
        "moved_from": str(original / ".afk"),
        "rehomed": ["script-job"],
        "skipped": {},
    }
    assert "copied or moved" not in afk_local(b, "runs").stderr
    shown = afk_local(b, "show", "script-job", "--json")
    assert json.loads(shown.stdout)["store_moved_from"] is None
    resumed = afk_local(b, "resume", "script-job", "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)["result"]
    assert result["cwd"] == str(copy)  # the job ran in the copy
    assert result["count"] == N
    assert items_done(copy) == list(range(N))  # the copy's outside world: each once
    assert items_done(original) == done_in_a
    assert snapshot(a) == before

    again = afk_local(b, "adopt")
    assert again.stdout == f"store {copy / '.afk'} is at home already; nothing to adopt\n"
