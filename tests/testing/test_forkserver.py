"""The fork server: each child is a fresh fork of a pre-imported process that holds
nothing of afk_local's but its modules, and behaves as ``python -c`` would."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from afk_local.storage.store import Store
from afk_local.testing import run_and_kill
from afk_local.testing.forkserver import (
    fork_server_available,
    popen_python,
    run_python,
    using_fork_server,
)
from afk_local.testing.fuzz.jobs import program_sync
from afk_local.testing.fuzz.program import expected_result

pytestmark = [
    pytest.mark.skipif(not fork_server_available(), reason="needs os.fork and pidfds"),
    pytest.mark.fresh_interpreter,  # each test starts a server of its own
]

STEPS = (("step", "a", 1), ("iterate", "b", 3), ("checkpoint", "c"), ("step", "d", 2))


def test_a_child_runs_as_python_c_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = (
        "import atexit, os, sys; atexit.register(lambda: print('atexit ran')); "
        "print(sys.argv[1:], os.environ['FORK_TEST'], os.getcwd()); "
        "sys.stderr.write('to stderr'); raise SystemExit(int(sys.argv[2]))"
    )
    env = {**os.environ, "FORK_TEST": "given"}
    monkeypatch.chdir(tmp_path)
    with using_fork_server() as server:
        assert server is not None
        first = run_python(code, ["one", "7"], env=env, timeout=60)
        second = run_python("import os; print(os.getpid(), os.getppid())", [], env=env, timeout=60)
        with pytest.raises(subprocess.TimeoutExpired):
            run_python("import time; time.sleep(60)", [], env=env, timeout=0.5)
        raised = run_python("raise ValueError('boom')", [], env=env, timeout=60)
        pid, parent = map(int, second.stdout.split())
        assert parent == server.pid != pid
        assert server.children == 4
    assert first.returncode == 7
    assert first.stdout == f"['one', '7'] given {tmp_path}\natexit ran\n"
    assert first.stderr == "to stderr"
    assert raised.returncode == 1 and "ValueError: boom" in raised.stderr


def test_the_server_holds_no_store_lock_writer_or_thread(tmp_path: Path) -> None:
    """What every child starts from: imported modules, and only the pipes to its
    client open (no store file, no lock, no writer thread)."""
    store = Store(tmp_path / "store")
    with using_fork_server() as server:
        assert server is not None
        killed = run_and_kill(
            program_sync, [list(i) for i in STEPS], str(tmp_path / "ledger"),
            at=12, store=store, run_id="r0",
        )  # fmt: skip
        assert killed.killed and killed.returncode == -signal.SIGKILL
        proc = Path(f"/proc/{server.pid}")
        assert sorted(int(fd) for fd in os.listdir(proc / "fd")) == [0, 1, 2]
        assert len(os.listdir(proc / "task")) == 1
        modules = run_python(
            "import sys; print('afk_local.storage.store' in sys.modules)",
            [], env=dict(os.environ), timeout=60,
        )  # fmt: skip
        assert modules.stdout == "True\n"  # imported once, in the server
    result = program_sync.with_store(store).run(
        [list(i) for i in STEPS], str(tmp_path / "ledger"), run_id="r0"
    )
    assert result == expected_result(STEPS)


def test_outside_it_children_are_fresh_interpreters() -> None:
    done = run_python("import sys; print('afk_local' in sys.modules)", [],
                      env=dict(os.environ), timeout=60)  # fmt: skip
    assert done.stdout == "False\n"


def test_a_child_has_the_sys_path_and_directory_python_c_gives_it(tmp_path: Path) -> None:
    """A child's PYTHONPATH goes on its ``sys.path`` as a new interpreter's would (a
    module beside the test imports), not the server's; ``cwd`` is its directory; its
    code runs in the module ``__main__`` (an agent defined there is ``__main__:NAME``)."""
    (tmp_path / "beside.py").write_text("WHERE = 'beside'\n")
    code = (
        "import sys, os, beside, __main__\n"
        "def job(): pass\n"
        "print(beside.WHERE, sys.path[:2], os.getcwd(), __main__.job is job, job.__module__)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    fresh = run_python(code, [], env=env, timeout=60, cwd=tmp_path)
    with using_fork_server():
        forked = run_python(code, [], env=env, timeout=60, cwd=tmp_path)
        without = run_python("import beside", [], env=dict(os.environ), timeout=60)
    assert fresh.returncode == 0, fresh.stderr
    assert forked.stdout == fresh.stdout == f"beside ['', '{tmp_path}'] {tmp_path} True __main__\n"
    assert without.returncode == 1 and "No module named 'beside'" in without.stderr


def test_a_started_child_streams_its_lines_and_dies_by_sigkill_between_two() -> None:
    """popen_python: the child's lines arrive as it prints them (PYTHONUNBUFFERED, as
    proc.spawn sets it), two children run at once, and a SIGKILL ends one mid-loop."""
    code = (
        "import sys, time\n"
        "for i in range(int(sys.argv[1])):\n"
        "    print(i); time.sleep(0.01 if i < 3 else 60)\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with using_fork_server() as server:
        assert server is not None
        killed, other = (popen_python(code, ["100"], env=env) for _ in range(2))
        assert killed.stdout is not None and other.stdout is not None
        lines = [killed.stdout.readline() for _ in range(3)]
        others = [other.stdout.readline() for _ in range(3)]
        assert killed.poll() is None and other.poll() is None
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=60) == -signal.SIGKILL
        other.kill()
        other.communicate(timeout=60)
        done = popen_python("import sys; print('out'); sys.exit('err')", [], env=env)
        assert done.communicate(timeout=60) == ("out\n", "err\n") and done.returncode == 1
    assert lines == ["0\n", "1\n", "2\n"]
    assert others == lines and other.returncode == -signal.SIGKILL
    assert killed.pid != other.pid and server.children == 3
