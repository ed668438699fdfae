"""Children for the Agents SDK crash tests: start one, SIGKILL it at a line, read its files.

The children run the jobs of ``openai_agents_jobs`` with ``OA_MODEL_LOG`` and
``OA_EFFECTS`` pointing into the test's directory; :func:`kill_at` stops one where it
printed a marker (the child stalls at ``OA_STALL_AT``).
"""

from __future__ import annotations

import os
from pathlib import Path

import proc
from proc import SUPPORT

START = """
import sys
import openai_agents_jobs
output = openai_agents_jobs.agent_job.run("record two items", run_id=sys.argv[1])
print("OUTPUT " + output, flush=True)
"""

EXPECTED_OUTPUT = "recorded a-ok, b-ok"
"""What ``agent_job`` returns when it runs uninterrupted (test_openai_agents.py checks it)."""

FAST_WATCH = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]
"""``afk-local watch --once`` options that resume an interrupted run at once."""


def env_for(root: Path, files: Path, **extra: str) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "AFK_LOCAL_ROOT": str(root),
        "OA_MODEL_LOG": str(files / "model.log"),
        "OA_EFFECTS": str(files / "effects.txt"),
        **extra,
    }


def kill_at(env: dict[str, str], marker: str, *args: str, script: str = START) -> list[str]:
    """Start the job; SIGKILL the child once it printed ``marker`` (it stalls there)."""
    return proc.kill_at_line(proc.spawn(script, *args, env={**env, "OA_STALL_AT": marker}), marker)


def model_requests(files: Path) -> list[str]:
    """What the models were asked, over every process: ``label item-count`` per request."""
    return (files / "model.log").read_text().splitlines()


def effects(files: Path) -> list[str]:
    return [line.split()[0] for line in (files / "effects.txt").read_text().splitlines()]
