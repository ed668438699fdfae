"""Parallel tool calls, one failing: no hang, and each sibling's outcome journaled as it ends.

Both agent integrations, in real child processes (tests/support/pydantic_ai_jobs.py and
openai_agents_jobs.py): the model asks for ``record_slowly`` (an effect, then a moment's
wait) and ``explode`` at once; ``explode`` fails once the effect happened, in the first
attempt only (its ``*_EXPLODE`` variable). The first attempt must end by itself (a bound
per child, not a timing claim), with ``record_slowly``'s outcome journaled; a resume
must not run its effect again. Killed inside ``record_slowly``, the resume must stop on
it in doubt, again without hanging.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import proc
import pytest
from proc import SUPPORT, afk_local_cli

import afk_local as afk

FRAMEWORKS = {
    "pydantic-ai": ("pydantic_ai", "pydantic_ai_jobs", "PAI", "pydantic-ai.tool"),
    "openai-agents": ("agents", "openai_agents_jobs", "OA", "openai-agents.tool"),
}
RECORD_STEP = {
    "pydantic-ai": "pydantic-ai.tool.record_slowly.call-record#1",
    "openai-agents": "openai-agents.tool.record_slowly.par-record#1",
}
EXPLODE_STEP = {
    "pydantic-ai": "pydantic-ai.tool.explode.call-explode#1",
    "openai-agents": "openai-agents.tool.explode.par-explode#1",
}
BOUND = 120  # seconds a child may take before the test calls it hung


def setup(framework: str, tmp_path: Path) -> tuple[str, dict[str, str], Path]:
    package, module, prefix, _ = FRAMEWORKS[framework]
    pytest.importorskip(package, reason=f"{package} not installed: pip install 'afk_local[test]'")
    files = tmp_path / "files"
    files.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "AFK_LOCAL_ROOT": str(tmp_path / "store"),
        f"{prefix}_MODEL_LOG": str(files / "model.log"),
        f"{prefix}_EFFECTS": str(files / "effects.txt"),
    }
    start = f"import {module}\nprint('OUTPUT', {module}.parallel_job.run(run_id='par'))\n"
    return start, env, files


def effects(files: Path) -> list[str]:
    return (files / "effects.txt").read_text().split()


def outcome_of(tmp_path: Path, key: str) -> str | None:
    states = [e for e in afk.Store(tmp_path / "store").open("par").effects() if e.key == key]
    outcomes = [e.status for e in states if e.kind == "outcome"]
    return outcomes[-1] if outcomes else None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_failing_sibling_neither_hangs_nor_hides_a_finished_effect(
    tmp_path: Path, framework: str
) -> None:
    start, env, files = setup(framework, tmp_path)
    prefix = FRAMEWORKS[framework][2]
    try:
        first = proc.run(start, env={**env, f"{prefix}_EXPLODE": "1"}, timeout=BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job's process did not end within {BOUND} s after the tool failed")
    assert first.returncode == 1, first.stderr
    assert "explode failed while record_slowly was in flight" in first.stderr
    assert effects(files) == ["a"]
    # the sibling finished its effect: journaled as it ended, not in doubt, not an error
    assert outcome_of(tmp_path, RECORD_STEP[framework]) == "ok"

    done = afk_local_cli(env, "resume", "par")
    assert done.returncode == 0, done.stderr
    assert effects(files) == ["a"]  # replayed, not run again
    reader = afk.Store(tmp_path / "store").open("par")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == "a-ok explode-ok"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_sibling_in_doubt_on_resume_stops_the_resume_without_a_hang(
    tmp_path: Path, framework: str
) -> None:
    start, env, files = setup(framework, tmp_path)
    prefix = FRAMEWORKS[framework][2]
    child = proc.spawn(start, env={**env, f"{prefix}_STALL_AT": "TOOL a", f"{prefix}_EXPLODE": "1"})
    proc.kill_at_line(child, "TOOL a")  # record_slowly's effect done, its outcome not
    assert effects(files) == ["a"]

    resumed = afk_local_cli(env, "resume", "par")  # bounded: afk_local_cli times out
    assert resumed.returncode == 1, resumed.stderr
    assert "may or may not have happened" in resumed.stderr
    assert effects(files) == ["a"]

    # both calls were cut short: record_slowly did its effect, explode did nothing
    record, explode = RECORD_STEP[framework], EXPLODE_STEP[framework]
    for settle in (["--done", "--result", '"a-ok"'], ["--failed", "it did not happen"]):
        step = record if settle[0] == "--done" else explode
        settled = afk_local_cli(env, "settle", "par", step, *settle)
        assert settled.returncode == 0, settled.stderr
    done = afk_local_cli(env, "resume", "par")
    assert done.returncode == 0, done.stderr
    assert effects(files) == ["a"]
    assert afk.Store(tmp_path / "store").open("par").resume_state().result == "a-ok explode-ok"
