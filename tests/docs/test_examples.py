"""Every example in examples/ runs to completion (and batch_resume also after a SIGKILL)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import proc
import pytest
from proc import REPO

EXAMPLES_DIR = REPO / "examples"

# script -> the command lines to run in order (same store); the last must print `expect`.
# Adding an example is one line here.
EXAMPLES: dict[str, tuple[list[list[str]], str]] = {
    "batch_resume.py": ([["--items", "60", "--delay", "0"]], "'sum': 70210"),
    "notebook_loop.py": ([[], []], "already done: {'final_loss': 0.05, 'epochs': 20}"),
    "human_approval.py": ([[], ["--answer", "yes"]], "'sent': True"),
    "agent_resume.py": ([["--delay", "0"]], "completed: Researched 6 topics"),
    "fanout_dask.py": ([["--images", "6", "--workers", "1"]], "uploads: 6"),
    "pydantic_ai_agent.py": ([[], []], "Done: invoice sent to ada for 42 EUR"),
    "openai_agents_agent.py": ([[], []], "Done: invoice sent to ada for 42 EUR"),
    "kill_sweep_check.py": ([["--sample", "3"]], "kill points tried: 0 wrong endings"),
    "code_change.py": (
        [["--code", "v1", "--die-after", "2"], ["--code", "v2"], ["--code", "v2-patched"]],
        "ledger: ['charge a 10', 'charge b 10', 'fee c', 'charge c 10', 'fee d', 'charge d 10']",
    ),
}
# script -> the module an optional extra brings (the example is skipped without it)
NEEDS = {
    "fanout_dask.py": "distributed",
    "pydantic_ai_agent.py": "pydantic_ai",
    "openai_agents_agent.py": "agents",
}


def run_example(script: str, args: list[str], root: Path, timeout: float = 120):
    env = {"AFK_LOCAL_ROOT": str(root), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # run as __main__ from its own directory, the way a user starts it
    # from a scratch working directory, so files an example writes land there
    path = str(EXAMPLES_DIR / script)
    boot = (
        f"import os, runpy, sys; os.chdir({str(root.parent)!r}); "
        f"sys.argv = [{path!r}] + sys.argv[1:]; runpy.run_path({path!r}, run_name='__main__')"
    )
    return proc.run(boot, *args, env=env, timeout=timeout)


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs_to_completion(script, tmp_path):
    if script in NEEDS and importlib.util.find_spec(NEEDS[script]) is None:
        pytest.skip(f"{script} needs {NEEDS[script]} (an optional extra)")
    commands, expect = EXAMPLES[script]
    for args in commands:
        done = run_example(script, args, tmp_path / "store")
        assert done.returncode == 0, done.stderr
    assert expect in done.stdout, done.stdout
    assert "starting at epoch" not in done.stdout  # a finished loop is not run again


def test_batch_resume_after_kill(tmp_path):
    root = tmp_path / "store"
    out = tmp_path / "results.txt"
    args = ["--items", "200", "--delay", "0.002", "--verbose", "--out", str(out)]
    boot = (
        f"import runpy, sys; sys.argv = ['batch_resume.py'] + sys.argv[1:]; "
        f"runpy.run_path({str(EXAMPLES_DIR / 'batch_resume.py')!r}, run_name='__main__')"
    )
    env = {"AFK_LOCAL_ROOT": str(root), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = proc.spawn(boot, *args, env=env)
    killed = proc.kill_after(child, acks=80)
    assert killed.returncode == -9 and len(killed.lines) >= 80
    done = proc.run(boot, *args, env=env)
    assert done.returncode == 0, done.stderr
    assert f"'sum': {sum(i * i for i in range(200))}" in done.stdout
    items = [int(line.split()[0]) for line in out.read_text().splitlines()]
    assert sorted(items) == list(range(200))  # every side effect exactly once
    resumed = [int(x.split()[1]) for x in done.stdout.splitlines() if x.startswith("done")]
    assert resumed and resumed[0] > 0  # it did not start over
