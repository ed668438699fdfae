"""Jobs swept by ``afk_local.testing.kill_sweep`` in tests/testing/test_kill_sweep.py.

Each side effect writes a line to the sweep's effect log (``record_effect``), so a
repeated effect is seen; children import these by entrypoint (``sweep_jobs:NAME``).
"""

from __future__ import annotations

import operator
import os
from typing import Annotated, Any, TypedDict

import afk_local as afk
from afk_local.testing import record_effect


def charge(order: int) -> str:
    """A payment without an idempotency key: a kill during it leaves it in doubt."""
    record_effect(f"charge {order}")
    return f"receipt {order}"


def _charges(ctx: afk.RunContext, n: int) -> list[str]:
    receipts: list[str] = ctx.state.setdefault("receipts", [])
    for order in ctx.iterate(range(n), progress=False):
        receipts.append(ctx.step("charge", charge, order))
    return list(receipts)


def _make(mode: str) -> afk.DurableFunction[list[str]]:
    def job(ctx: afk.RunContext, n: int) -> list[str]:
        return _charges(ctx, n)

    job.__name__ = job.__qualname__ = f"charges_{mode}"
    return afk.durable(durability=mode)(job)


charges_sync = _make("sync")
charges_async = _make("async")
charges_exit = _make("exit")


@afk.durable
async def charges_coroutine(ctx: afk.RunContext, n: int) -> list[str]:
    """The async-def twin of the charges jobs (``ctx.astep``)."""
    receipts: list[str] = ctx.state.setdefault("receipts", [])
    for order in ctx.iterate(range(n), progress=False):
        receipts.append(await ctx.astep("charge", charge, order))
    return list(receipts)


def state_loop(n: int, *, run_id: str) -> int:
    """A plain loop made resumable by a StateCheckpoint in ``$AFK_LOCAL_ROOT``."""
    ckpt = afk.StateCheckpoint(os.environ["AFK_LOCAL_ROOT"])
    if ckpt.is_complete:
        return int(ckpt.get_result())
    state = ckpt.load() or {"i": 0, "total": 0}
    for i in range(state["i"], n):
        state["total"] += i * i
        state["i"] = i + 1
        ckpt.save(state)
    ckpt.mark_complete(state["total"])
    return int(state["total"])


def flaky_charge(order: int, failures: int) -> str:
    """Fails its first ``failures`` calls (counted in the effect log), then charges."""
    path = os.environ.get("AFK_SWEEP_LOG", "")
    tried = sum(1 for line in _lines(path) if line.startswith(f"try {order}"))
    record_effect(f"try {order} #{tried + 1}")
    if tried < failures:
        raise ConnectionError(f"try {tried + 1} of order {order} failed")
    return f"receipt {order}"


def asked(step: int) -> None:
    """Note that the model was asked its ``step``-th question, the first time only.

    A kill between the model's answer and the journal's record of it loses the answer,
    and the resumed run asks again (a model call reads; docs/agents.md): like a service
    that drops a repeated request, the question is noted once. What must not repeat,
    the tool's effect, is noted every time (``agent_sweep_jobs``, ``mcp_jobs``).
    """
    line = f"model asked {step}"
    if line not in _lines(os.environ.get("AFK_SWEEP_LOG", "")):
        record_effect(line)


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


@afk.durable
def retried_charge(ctx: afk.RunContext, failures: int) -> str:
    """One step failing ``failures`` times, under Retry(attempts=3) with short backoffs."""
    policy = afk.Retry(attempts=3, initial=0.01, on=(ConnectionError,))
    receipt: str = ctx.step("charge", flaky_charge, 1, failures, retry=policy)
    return receipt


@afk.durable
def sleepy_charges(ctx: afk.RunContext, seconds: float) -> list[str]:
    """A charge, a durable sleep that parks the run, another charge."""
    first = ctx.step("charge", charge, 1)
    ctx.sleep(seconds, park_after=1.0)
    return [first, ctx.step("charge", charge, 2)]


@afk.durable
def limited_charges(ctx: afk.RunContext, n: int) -> list[str]:
    """Charges under a shared ``Limit`` (its slots are files in the store)."""
    api = afk.Limit("payments", concurrent=1, per_minute=600)
    return [ctx.step("charge", charge, order, limit=api) for order in range(n)]


@afk.durable
def forgetful(ctx: afk.RunContext, n: int) -> int:
    """WRONG on purpose: charges outside any step, so a resume charges again."""
    for order in ctx.iterate(range(n), progress=False):
        charge(order)
    return n


def _scripted_model(steps: int) -> Any:
    """Asks for one ``charge`` per step, then answers; each question is an effect line."""

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> afk.LLMResponse:
        step = sum(m["role"] == "assistant" for m in messages) + 1
        record_effect(f"model asked {step}")
        if step > steps:
            return afk.LLMResponse(text=f"charged {steps} orders", finish_reason="stop")
        call = afk.ToolCall(id=f"c{step}", name="charge", arguments={"order": step})
        return afk.LLMResponse(text=None, tool_calls=[call], finish_reason="tool_calls")

    return model


@afk.agent_factory
def build_agent(context: dict[str, Any]) -> afk.Agent:
    """The swept agent (also how ``afk-local resume`` rebuilds it)."""
    return afk.Agent(
        "cashier",
        "Charge the orders.",
        _scripted_model(int(context["steps"])),
        {"charge": charge},
        model="scripted",
        max_steps=int(context["steps"]) + 1,
        llm_retries=0,
        entrypoint="sweep_jobs:build_agent",
    )


def agent_run(steps: int, *, run_id: str) -> str | None:
    """An AgentRunner run in ``$AFK_LOCAL_ROOT``: what a user's script would call."""
    context = {"steps": steps}
    result = afk.AgentRunner().run(build_agent(context), "go", run_id=run_id, context=context)
    return result.final_text


def service_effect(line: str) -> None:
    """An outside service that drops a repeated request (same line): recorded once."""
    if line not in _lines(os.environ.get("AFK_SWEEP_LOG", "")):
        record_effect(line)


class GraphState(TypedDict):
    """The swept graph's state: a counter and a log its reducer appends to."""

    count: int
    log: Annotated[list[str], operator.add]


def graph_run(steps: int, *, run_id: str) -> dict[str, Any]:
    """A LangGraph graph of ``steps`` effect nodes on AfkLocalSaver; thread ``run_id``.

    LangGraph repeats a node whose writes were not saved at the kill, so the node's
    effect goes to a service that drops repeats (:func:`service_effect`).
    """
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415

    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    def effect(state: GraphState) -> dict[str, Any]:
        n = state["count"] + 1
        service_effect(f"node {n}")
        return {"count": n, "log": [f"effect {n}"]}

    builder = StateGraph(GraphState)
    builder.add_node("effect", effect)
    builder.add_edge(START, "effect")
    builder.add_conditional_edges("effect", lambda s: END if s["count"] >= steps else "effect")
    with AfkLocalSaver.from_path(os.environ["AFK_LOCAL_ROOT"]) as saver:
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": run_id}}
        start = None if graph.get_state(config).values else {"count": 0, "log": []}
        graph.invoke(start, config, durability="sync")
        return dict(graph.get_state(config).values)


@afk.durable
def charge_item(ctx: afk.RunContext, item: int) -> str:
    """One fan-out item: a journaled charge."""
    receipt: str = ctx.step("charge", charge, item)
    return receipt


def fan_out(n: int, *, run_id: str) -> list[str]:
    """``map_durable`` over ``n`` items on an in-process Dask cluster (threads)."""
    from distributed import Client, LocalCluster  # noqa: PLC0415

    from afk_local.integrations.dask import map_durable  # noqa: PLC0415

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        return map_durable(
            charge_item,
            range(n),
            store=os.environ["AFK_LOCAL_ROOT"],
            client=client,
            run_id=lambda item: f"{run_id}-{item}",
            progress=False,
        )


HOUR_1001 = 1001 * 3600.0
"""The slot :func:`scheduled_tick` starts (1970-02-11T17:00:00Z)."""


@afk.durable
def slot_charge(ctx: afk.RunContext) -> str:
    """A scheduled job: one charge for its slot."""
    slot = ctx.scheduled_slot
    receipt: str = ctx.step("charge", charge, 0 if slot is None else int(slot.timestamp()))
    return receipt


class _Host:
    def __init__(self, store: afk.Store) -> None:
        self.store = store

    def emit(self, kind: str, run_id: str | None = None, message: str = "", /) -> None:
        pass


def scheduled_tick(*, run_id: str) -> str:
    """Add an hourly schedule, sweep it once at 17:00:20 on 1970-02-11 and run its slot.

    ``run_id`` is the slot's run (``tick--19700211T170000Z``): what a watcher makes and
    resumes, here in one process so a kill can land anywhere in between.
    """
    from afk_local.watcher.schedules import (  # noqa: PLC0415
        Schedule,
        Scheduler,
        list_schedules,
        write_schedule,
    )

    store = afk.Store(os.environ["AFK_LOCAL_ROOT"])
    if not list_schedules(store):
        tick = Schedule(
            name="tick", entrypoint="sweep_jobs:slot_charge", every_s=3600, created_ms=3600_000
        )
        write_schedule(store, tick)
    Scheduler(_Host(store)).start_due_runs(now=HOUR_1001 + 20)
    result: str = afk.resume(run_id, store=store)
    return result
