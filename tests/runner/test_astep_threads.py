"""``ctx.astep`` of coroutines that use the loop's default executor themselves does not hang.

The step's journal work runs in a thread that waits for the coroutine; the coroutine
runs on the job's loop and may itself need a thread of that loop's default executor
(``asyncio.to_thread``; the OpenAI Agents SDK runs a sync function tool that way). With
the step threads taken from that same executor, as many steps in flight as it has
threads waited for coroutines that waited for those very threads: a deadlock, met by an
agent asking for ten tool calls at once on a 2-core machine. The job runs in a child
with a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

JOB = """
import asyncio, concurrent.futures, sys
import afk_local as afk

@afk.durable(store=afk.Store(sys.argv[1]))
async def job(ctx: afk.RunContext) -> list[int]:
    # a small default executor, as on a machine with few cores
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(2))

    async def square(i: int) -> int:
        return await asyncio.to_thread(lambda: i * i)  # needs a default-executor thread

    calls = (ctx.astep(f"square-{i}", square, i) for i in range(8))
    return list(await asyncio.gather(*calls))

print(asyncio.run(job.arun(run_id="gathered")))
"""


def test_gathered_coroutine_steps_that_use_the_default_executor_finish(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(JOB), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,  # a deadlock raises TimeoutExpired (the child is killed)
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([i * i for i in range(8)])
