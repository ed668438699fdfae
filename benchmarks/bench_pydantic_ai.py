"""What DurableAgent costs per model request and per tool call (issue 32).

    python benchmarks/bench_pydantic_ai.py [--tools 20] [--runs 10] [--rounds 3] [--dir DIR]

One agent run is ``--tools`` rounds of (model request asking for one tool call, the tool
call) and a last model request: 2 x tools + 1 calls, all local (a ``FunctionModel`` and
a tool that adds two numbers), so the numbers are the wrapper's cost, not a model's.
Side by side, interleaved over ``--rounds``, each a fresh run per agent run:

- plain pydantic-ai (``agent.run_sync``), the baseline;
- ``DurableAgent`` inside an ``@afk.durable`` job, ``durability="sync"`` (each model
  request and tool call an intent and an outcome, fsynced);
- pydantic-ai's ``DBOSDurability`` capability (what replaced ``DBOSAgent``, which this
  pydantic-ai deprecates) inside a ``@DBOS.workflow`` on SQLite (``pip install
  afk_local[bench]``), skipped when dbos is not installed. DBOS makes each *model
  request* a step; a plain function tool runs in workflow code, not as a step (it is
  journaled only if you make it a ``@DBOS.step`` yourself), so DBOS records about half
  as many calls as DurableAgent here.

"per call" is (variant - plain) / (2 x tools + 1), all calls counted for both wrappers.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import seconds_per_run, table  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

import afk_local as afk  # noqa: E402
from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: E402


def make_agent(tools: int, name: str, *capabilities: Any) -> Agent[None, str]:
    """An agent that calls ``add`` ``tools`` times, one call per model response."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done < tools:
            return ModelResponse(parts=[ToolCallPart("add", {"a": done, "b": 1})])
        return ModelResponse(parts=[TextPart(f"added {done} times")])

    agent = Agent(FunctionModel(model), name=name, capabilities=list(capabilities))

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-pai-", dir=args.dir))
    calls = 2 * args.tools + 1

    plain = make_agent(args.tools, "plain")
    durable_agent = DurableAgent(make_agent(args.tools, "durable"))

    @afk.durable(store=afk.Store(base / "afk"), durability="sync")
    def job(ctx: afk.RunContext) -> str:
        return durable_agent.run_sync(ctx, "go").output

    variants: dict[str, Callable[[int], object]] = {
        "pydantic-ai (plain)": lambda i: plain.run_sync("go").output,
        "DurableAgent (afk_local, sync)": lambda i: job.run(run_id=f"run-{i}"),
    }
    try:
        from dbos import DBOS  # noqa: PLC0415 - optional (bench extra)
        from pydantic_ai.durable_exec.dbos import DBOSDurability  # noqa: PLC0415
    except ImportError:
        print("dbos not installed: DBOS skipped (pip install 'afk_local[bench]')")
    else:
        logging.getLogger("dbos").setLevel(logging.WARNING)
        dbos_agent = make_agent(args.tools, "dbos", DBOSDurability())

        @DBOS.workflow()
        def dbos_run(i: int) -> str:
            return dbos_agent.run_sync("go").output

        DBOS(
            config={
                "name": "afk-bench-pai",
                "system_database_url": f"sqlite:///{base / 'dbos.sqlite'}",
                "run_admin_server": False,
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        variants["DBOSDurability (DBOS on SQLite)"] = dbos_run

    for fn in variants.values():
        fn(-1)  # warm up: imports, first files, the DBOS schema
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, fn in variants.items():
            seconds[name].append(seconds_per_run(fn, args.runs, r * args.runs))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    baseline = median["pydantic-ai (plain)"]
    rows = [
        [
            name,
            f"{m * 1e3:.1f}",
            f"{(m - baseline) / calls * 1e3:.2f}" if m is not baseline else "-",
            f"{m / baseline:.1f}x",
        ]
        for name, m in median.items()
    ]
    print(
        f"one agent run = {args.tools} tool calls + {args.tools + 1} model requests "
        f"({calls} calls); median of {args.rounds} rounds x {args.runs} runs"
    )
    print(table(["variant", "ms per agent run", "ms added per call", "vs plain"], rows))


if __name__ == "__main__":
    main()
