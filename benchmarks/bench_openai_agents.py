"""What DurableRunner costs per model call and per tool call (issue 32).

    python benchmarks/bench_openai_agents.py [--tools 20] [--runs 10] [--rounds 3] [--dir DIR]

All local: a scripted ``agents.Model`` and a function tool that adds two numbers, so the
numbers are the wrappers' cost, not a model's. Three jobs, each a fresh durable run:

- ``answer``: one agent run of one model call, no tool (a run's fixed cost + 1 call);
- ``answers``: ``--tools`` agent runs of one model call each, one after the other in
  the same job (fixed + tools x (runner setup + model call));
- ``sequential``: one agent run of ``--tools`` rounds of (model response asking for one
  tool call, the call), then the answer (fixed + (tools + 1) model calls + tools tool
  calls).

From each variant's time added over the plain SDK: per model call
``(answers - answer) / (tools - 1)`` (it includes what one more runner call adds: the
agent's clone, ``run_sync``'s event loop), per tool call
``(sequential - answer) / tools - per model call``; both are small differences of
larger times, so a loaded machine makes them noisy (negative, even). Side by side, interleaved over
``--rounds``:

- the plain SDK (``Runner.run_sync``), the baseline;
- ``DurableRunner.run_sync`` inside an ``@afk.durable`` job, ``durability="sync"`` (each
  model call and tool call an intent and an outcome, fsynced);
- ``DBOSRunner.run_sync`` (``dbos-openai-agents``) inside a ``@DBOS.workflow`` on SQLite
  (``pip install afk_local[bench]``), skipped when it is not installed. DBOS makes each
  *model call* a step; a function tool runs in workflow code, not as a step, unless you
  make it a ``@DBOS.step`` yourself, so its per-tool-call figure is not journaling.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from agents import Agent, Model, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.usage import Usage  # noqa: E402
from common import seconds_per_run, table  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import afk_local as afk  # noqa: E402
from afk_local.integrations.openai_agents import DurableRunner  # noqa: E402

WORKLOADS = ("answer", "answers", "sequential")


class Scripted(Model):
    """A model that asks for ``add`` as the workload says, then answers."""

    def __init__(self, workload: str, tools: int) -> None:
        self.workload = workload
        self.tools = tools

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        items = input if isinstance(input, list) else []
        done = sum(1 for i in items if i.get("type") == "function_call_output")
        if self.workload == "sequential" and done < self.tools:
            output: list[Any] = [call(done)]
        else:
            text = ResponseOutputText(type="output_text", text=f"added {done}", annotations=[])
            output = [
                ResponseOutputMessage(
                    type="message", id="m", role="assistant", status="completed", content=[text]
                )
            ]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def call(n: int) -> ResponseFunctionToolCall:
    arguments = json.dumps({"a": n, "b": 1})
    return ResponseFunctionToolCall(
        type="function_call", name="add", arguments=arguments, call_id=f"c{n}", id=f"fc{n}"
    )


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    set_tracing_disabled(True)
    turns = args.tools + 2  # the sequential run takes tools + 1 turns
    base = Path(tempfile.mkdtemp(prefix="bench-oa-", dir=args.dir))
    agents = {w: Agent(name=w, model=Scripted(w, args.tools), tools=[add]) for w in WORKLOADS}

    agent_runs = {"answer": 1, "answers": args.tools, "sequential": 1}

    @afk.durable(store=afk.Store(base / "afk"), durability="sync")
    def job(ctx: afk.RunContext, workload: str) -> str:
        for _ in range(agent_runs[workload]):
            result = DurableRunner.run_sync(ctx, agents[workload], "go", max_turns=turns)
        return str(result.final_output)

    def plain(workload: str) -> Callable[[int], object]:
        def run(i: int) -> str:
            for _ in range(agent_runs[workload]):
                result = Runner.run_sync(agents[workload], "go", max_turns=turns)
            return str(result.final_output)

        return run

    def durable(workload: str) -> Callable[[int], object]:
        return lambda i: job.run(workload, run_id=f"{workload}-{i}")

    makers: dict[str, Callable[[str], Callable[[int], object]]] = {
        "Agents SDK (plain)": plain,
        "DurableRunner (afk_local, sync)": durable,
    }
    try:
        from dbos import DBOS  # noqa: PLC0415 - optional (bench extra)
        from dbos_openai_agents import DBOSRunner  # noqa: PLC0415
    except ImportError:
        print("dbos-openai-agents not installed: DBOS skipped (pip install 'afk_local[bench]')")
    else:
        logging.getLogger("dbos").setLevel(logging.WARNING)

        @DBOS.workflow()
        def dbos_run(workload: str) -> str:
            for _ in range(agent_runs[workload]):
                result = DBOSRunner.run_sync(agents[workload], "go", max_turns=turns)
            return str(result.final_output)

        DBOS(
            config={
                "name": "afk-bench-oa",
                "system_database_url": f"sqlite:///{base / 'dbos.sqlite'}",
                "run_admin_server": False,
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        makers["DBOSRunner (DBOS on SQLite)"] = lambda w: lambda i: dbos_run(w)

    variants = {(name, w): make(w) for name, make in makers.items() for w in WORKLOADS}
    for fn in variants.values():
        fn(-1)  # warm up: imports, first files, the DBOS schema
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
    for r in range(args.rounds):
        for key, fn in variants.items():
            seconds[key].append(seconds_per_run(fn, args.runs, r * args.runs))
    median = {key: statistics.median(values) for key, values in seconds.items()}

    rows = []
    for name in makers:
        added = {w: median[name, w] - median["Agents SDK (plain)", w] for w in WORKLOADS}
        per_model = (added["answers"] - added["answer"]) / (args.tools - 1)
        per_tool = (added["sequential"] - added["answer"]) / args.tools - per_model
        rows.append(
            [
                name,
                *(f"{median[name, w] * 1e3:.1f}" for w in WORKLOADS),
                f"{median[name, 'sequential'] / median['Agents SDK (plain)', 'sequential']:.1f}x",
                "-" if name == "Agents SDK (plain)" else f"{per_model * 1e3:.2f}",
                "-" if name == "Agents SDK (plain)" else f"{per_tool * 1e3:.2f}",
            ]
        )
    print(
        f"ms per job: answer = 1 model call; answers = {args.tools} agent runs of 1 model "
        f"call; sequential = {args.tools + 1} model calls + {args.tools} tool calls; "
        f"median of {args.rounds} rounds x {args.runs} runs"
    )
    header = ["variant", *WORKLOADS, "sequential vs plain", "ms per model call"]
    print(table([*header, "ms per tool call"], rows))


if __name__ == "__main__":
    main()
