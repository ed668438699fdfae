"""Agent runs killed at every durable I/O call, resumed three ways, end as the uninterrupted run.

A child runs the job with ``afk_local.testing.kill_at_io_call(k)``: it SIGKILLs itself at
its k-th durable I/O call. The run is then resumed by ``afk-local resume``, by
``afk-local watch --once`` or by the same call again (in turn, by k), and must end as the
uninterrupted run did: the same result, every effect once (or a cut-short one reported
in doubt, settled, and then not run again), every model request asked once unless a kill
cut it short. ``--torture`` kills at every call; the default suite at five
(``kill_points``).

The jobs: pydantic-ai's ``agent_job`` (three model requests, two tool calls, two of the
model's answers recorded in one attempt) and the Agents SDK's ``parallel_job`` (two tool
calls in parallel).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import proc
import pytest
from proc import SUPPORT, afk_local_cli

import afk_local as afk

SCRIPT = """
import sys
from afk_local.testing import kill_at_io_call
switch = kill_at_io_call(int(sys.argv[1]) or None)
import {module}
print("OUTPUT", {module}.{call}, flush=True)
print("CALLS", switch.calls, flush=True)
"""

JOBS = {
    "pydantic-ai": (
        "pydantic_ai",
        "pydantic_ai_jobs",
        "PAI",
        "agent_job.run('record two items', run_id='sweep')",
    ),
    "openai-agents": ("agents", "openai_agents_jobs", "OA", "parallel_job.run(run_id='sweep')"),
}
RESUMES = ("cli", "watch", "call")
WATCH = ["watch", "--once", "--interval", "0.2", "--backoff", "0.2", "--grace", "10"]


def environment(framework: str, files: Path, root: Path) -> dict[str, str]:
    prefix = JOBS[framework][2]
    files.mkdir(parents=True)
    return {
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "AFK_LOCAL_ROOT": str(root),
        f"{prefix}_MODEL_LOG": str(files / "model.log"),
        f"{prefix}_EFFECTS": str(files / "effects.txt"),
    }


def model_log(files: Path) -> list[str]:
    path = files / "model.log"
    return path.read_text().splitlines() if path.exists() else []


def effect_items(files: Path) -> list[str]:
    path = files / "effects.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def resume(how: str, script: str, env: dict[str, str]) -> tuple[int, str]:
    """Resume the run ``sweep`` one way; ``(exit code, stderr)``."""
    if how == "cli":
        done = afk_local_cli(env, "resume", "sweep")
    elif how == "watch":
        done = afk_local_cli(env, *WATCH)
    else:
        done = proc.run(script, "0", env=env)
    return done.returncode, done.stderr


def cut_short(root: Path) -> list[str]:
    """The keys of the calls the run started and has no outcome for (in doubt)."""
    effects = afk.Store(root).open("sweep").effects()
    started = {e.key for e in effects if e.kind == "intent"}
    return sorted(started - {e.key for e in effects if e.kind == "outcome"})


def settle(env: dict[str, str], keys: list[str], files: Path) -> None:
    """Record what each call a kill cut short did, read from the outside world: the
    effects file says whether ``record_slowly`` did its effect; ``explode`` (which fails
    only when told to) has none and returned ``"explode-ok"``."""
    for key in keys:
        if ".record_slowly." in key and "a" not in effect_items(files):
            how = ["--failed", "it did not happen"]
        else:
            how = ["--done", "--result", '"a-ok"' if ".record" in key else '"explode-ok"']
        settled = afk_local_cli(env, "settle", "sweep", key, *how)
        assert settled.returncode == 0, settled.stderr


@pytest.mark.parametrize("framework", JOBS)
def test_an_agent_run_killed_at_any_durable_io_call_ends_as_the_uninterrupted_run(
    tmp_path: Path, framework: str, kill_points
) -> None:
    package, module, _, call = JOBS[framework]
    pytest.importorskip(package, reason=f"{package} not installed: pip install 'afk_local[test]'")
    script = SCRIPT.format(module=module, call=call)
    files = tmp_path / "reference"
    full = proc.run(script, "0", env=environment(framework, files, tmp_path / "reference-store"))
    assert full.returncode == 0, full.stderr
    (output,) = [line for line in full.stdout.splitlines() if line.startswith("OUTPUT ")]
    total = int(full.stdout.split()[-1])
    asked, done = model_log(files), effect_items(files)

    for index, kill_at in enumerate(kill_points(total, 3)):
        files, root = tmp_path / f"k{kill_at}", tmp_path / f"store-{kill_at}"
        env = environment(framework, files, root)
        killed = proc.run(script, str(kill_at), env=env)
        assert killed.returncode == -9, (kill_at, killed.stderr)
        how = RESUMES[index % len(RESUMES)]
        if not afk.Store(root).exists("sweep"):
            continue  # killed before the run existed: nothing to resume
        code, stderr = resume(how, script, env)
        if afk.Store(root).open("sweep").meta.status != "completed":
            # only a tool call cut short, which is not idempotent, may stop a resume
            in_doubt = cut_short(root)
            assert in_doubt and all(".tool." in key for key in in_doubt), (kill_at, how, stderr)
            settle(env, in_doubt, files)
            code, stderr = resume("cli", script, env)
        assert code == 0, (kill_at, how, stderr)
        reader = afk.Store(root).open("sweep")
        assert reader.meta.status == "completed", (kill_at, how)
        assert f"OUTPUT {reader.resume_state().result}" == output, (kill_at, how)
        assert effect_items(files) == done, (kill_at, how)  # every effect once
        requests = Counter(model_log(files))
        assert set(requests) == set(asked), (kill_at, how)
        # a request is asked again only when a kill cut it short: at most one such
        assert sum(requests.values()) - len(requests) <= 1, (kill_at, how, requests)
