"""The README's tour runs as written: its Python block saved as a script, then its shell block.

Real processes: ``python tour.py`` twice (the second run returns the stored results and
does nothing again), and each ``afk-local`` line of the shell block, in that directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from proc import REPO

import afk_local as afk

README = REPO / "README.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), re.S)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AFK_LOCAL_ROOT")}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    tour = blocks("python")[0]
    (tmp_path / "tour.py").write_text(tour)

    first = run(["tour.py"], tmp_path)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[:4] == ["emailing ada", "emailing grace", "emailing alan", "sent: 3"]
    assert lines[4] == "loop result: {'i': 100}"
    assert "invoices-nov completed 3" in lines
    assert afk.Store(tmp_path / ".afk").read_meta("invoices-nov").status is afk.RunStatus.COMPLETED

    again = run(["tour.py"], tmp_path)  # finished: stored results, no email, no loop
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:2] == ["sent: 3", "loop result: {'i': 100}"]
    assert "emailing" not in again.stdout

    shell = [
        line.split("#", 1)[0].split()
        for line in blocks("bash")[2].splitlines()
        if line.startswith("afk-local")
    ]
    assert [words[1] for words in shell] == ["runs", "log", "verify", "watch"]
    for words in shell:
        done = run(["-m", "afk_local", *words[1:]], tmp_path)
        assert done.returncode == 0, (words, done.stdout, done.stderr)
    # and the command the comment mentions
    assert run(["-m", "afk_local", "inspect", "invoices-nov"], tmp_path).returncode == 0
