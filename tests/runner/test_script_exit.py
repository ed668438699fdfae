"""A plain script whose job parks, pauses or is refused ends with one line and its own status.

Real processes: the script runs as ``python job.py`` from its own directory, as a user
would run it, and lets the control-flow error reach the top.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import proc
import pytest

from afk_local.runner.run.script_exit import EXIT_PAUSED, EXIT_SLEEPING

SCRIPT = textwrap.dedent(
    """
    import sys
    import afk_local as afk

    @afk.durable(store="./.afk")
    def nap(ctx):
        ctx.sleep(75)
        return "woke"

    @afk.durable(store="./.afk")
    def ask(ctx):
        return ctx.pause("ok?")

    @afk.durable(store="./.afk")
    def boom(ctx):
        raise KeyError("a real bug")

    if __name__ == "__main__":
        print({"nap": nap, "ask": ask, "boom": boom}[sys.argv[1]].run(run_id=sys.argv[1]))
    """
)


def run_script(project: Path, which: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "job.py", which], cwd=project, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("which", "status", "line"),
    [
        ("nap", EXIT_SLEEPING, "RunSleeping: run 'nap' is sleeping until "),
        ("ask", EXIT_PAUSED, "RunPaused: run 'ask' is paused waiting for input: "),
    ],
)
def test_a_script_whose_job_waits_ends_with_one_line_and_its_status(
    tmp_path: Path, which: str, status: int, line: str
) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    done = run_script(tmp_path, which)
    assert done.returncode == status, done.stderr
    [said] = done.stderr.splitlines()  # one line, no traceback
    assert said.startswith(line)
    assert done.stdout == ""
    # the command the line names shows the run waiting
    shown = proc.python(
        ["-m", "afk_local", "show", which], env=dict(os.environ), timeout=120, cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert ("sleeping" if which == "nap" else "paused") in shown.stdout


def test_a_real_failure_keeps_its_traceback(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    done = run_script(tmp_path, "boom")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.splitlines()[-1] == "KeyError: 'a real bug'"
