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

import proc
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
    assert watched.returncode == 1  # and says so to a cron job
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

    adopted = afk_local(b, "adopt", "--project-moved", "--json")
    assert adopted.returncode == 0, adopted.stderr
    assert json.loads(adopted.stdout) == {
        "root": str(copy / ".afk"),
        "moved_from": str(original / ".afk"),
        "project_moved": True,
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


def run_script(project: Path) -> subprocess.CompletedProcess[str]:
    """``python my_job.py`` in ``project``: the README's "run it again"."""
    return subprocess.run(
        [sys.executable, "my_job.py", str(test_script_jobs.N), "0.05"],
        cwd=project,
        capture_output=True,
        text=True,
        env=test_script_jobs.no_pythonpath(),
        timeout=120,
    )


def test_a_copied_project_run_again_by_its_script_refuses_in_one_line_until_adopted(
    tmp_path: Path,
) -> None:
    """``cp -a proj proj-copy``, then the script in both: the copy repeats nothing."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    original = make_project(a)
    start_and_kill(original, acks=4)
    done_before = items_done(original)
    copy = copy_project(a, b)

    refused = run_script(copy)
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()  # one line, no traceback
    assert line.startswith("StoreMovedError: run 'script-job': refused: ")
    assert f"afk-local --root {copy / '.afk'} adopt" in line
    assert items_done(copy) == done_before  # no effect ran in the copy

    finished = run_script(original)  # the original is not disturbed
    assert finished.returncode == 0, finished.stderr
    assert items_done(original) == list(range(N))

    adopted = afk_local(b, "adopt", "--project-moved")
    assert adopted.returncode == 0, adopted.stderr
    again = run_script(copy)  # now the copy is a run of its own, by the user's choice
    assert again.returncode == 0, again.stderr
    assert items_done(copy) == list(range(N))


def test_a_state_checkpoint_copied_elsewhere_refuses_to_continue_until_adopted(
    tmp_path: Path,
) -> None:
    ckpt = afk.StateCheckpoint(tmp_path / "a")
    ckpt.save({"i": 1})
    ckpt.close()
    subprocess.run(["cp", "-a", str(tmp_path / "a"), str(tmp_path / "b")], check=True)
    copy = afk.StateCheckpoint(tmp_path / "b")
    assert copy.load() == {"i": 1}  # reading a copy is fine
    with pytest.raises(afk.StoreMovedError, match="adopt"):
        copy.save({"i": 2})
    adopted = afk_local_at(tmp_path / "b", "adopt")
    assert adopted.returncode == 0, adopted.stderr
    copy.save({"i": 2})
    copy.close()
    assert afk.StateCheckpoint(tmp_path / "b").load() == {"i": 2}


def afk_local_at(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return proc.python(
        ["-m", "afk_local", "--root", str(root), *args],
        env=test_script_jobs.no_pythonpath(),
        timeout=120,
    )


def test_a_store_moved_without_its_project_keeps_the_recorded_script(tmp_path: Path) -> None:
    """``mv proj/.afk elsewhere``: adopt keeps the script where it still is, and it resumes."""
    original = make_project(tmp_path)
    start_and_kill(original, acks=4)
    moved = tmp_path / "elsewhere" / ".afk"
    (original / ".afk").rename(moved)

    adopted = afk_local_at(moved, "adopt", "--json")  # no terminal, no flag: it stayed
    assert adopted.returncode == 0, adopted.stderr
    report = json.loads(adopted.stdout)
    assert report["project_moved"] is False and report["rehomed"] == []
    resumed = afk_local_at(moved, "resume", "script-job", "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)["result"]
    assert result["cwd"] == str(original)  # the script ran where it is
    assert items_done(original) == list(range(N))


def test_adopt_asks_whether_the_project_moved_and_can_be_told_later(tmp_path: Path) -> None:
    original = make_project(tmp_path / "a" if (tmp_path / "a").mkdir() is None else tmp_path)
    start_and_kill(original, acks=2)
    copy = copy_project(tmp_path / "a", tmp_path / "b")
    stayed = afk_local(tmp_path / "b", "adopt", "--project-stayed")
    assert stayed.returncode == 0, stayed.stderr
    advice = stayed.stdout.splitlines()[-1]
    command = advice.split("if the scripts moved too: ")[1]
    assert command == f"afk-local --root {copy / '.afk'} adopt --project-moved"
    program, *words = command.split()  # afk-local, as this interpreter runs it
    assert program == "afk-local"
    told = proc.python(["-m", "afk_local", *words], env=test_script_jobs.no_pythonpath())
    assert told.returncode == 0, told.stderr
    assert "1 run(s) now continue from here: script-job" in told.stdout
    resumed = afk_local(tmp_path / "b", "resume", "script-job", "--json")
    assert json.loads(resumed.stdout)["result"]["cwd"] == str(copy)
