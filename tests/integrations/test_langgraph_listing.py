"""A LangGraph thread its saver closed is idle: listed ``paused (idle thread)``, never as a
run that cannot be resumed or that waits for a person; ``show`` and ``resume`` say that
invoking the graph continues it.

A real graph, run to its end on ``AfkLocalSaver``; the CLI runs as a person types it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TypedDict

import pytest
from advice import follow

from afk_local.cli import main


@pytest.fixture(autouse=True)
def _needs_langgraph() -> None:
    """The tests need langgraph: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "langgraph.graph", reason="needs langgraph (pip install 'afk_local[langgraph]')"
    )


class Count(TypedDict):
    n: int
    answer: str


def add_one(state: Count) -> dict[str, int]:
    return {"n": state["n"] + 1}


def ask(state: Count) -> dict[str, str]:
    from langgraph.types import interrupt  # noqa: PLC0415

    return {"answer": str(interrupt("go on?"))}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_finished_thread_is_idle_not_paused_for_someone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415

    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    monkeypatch.setattr(sys, "path", list(sys.path))
    root = str(tmp_path / ".afk")
    builder = StateGraph(Count)
    builder.add_node("add_one", add_one)
    builder.add_edge(START, "add_one")
    builder.add_edge("add_one", END)
    asking = StateGraph(Count)
    asking.add_node("ask", ask)
    asking.add_edge(START, "ask")
    asking.add_edge("ask", END)
    with AfkLocalSaver.from_path(root) as saver:
        done = builder.compile(checkpointer=saver).invoke(
            {"n": 1, "answer": ""}, {"configurable": {"thread_id": "chat-42"}}, durability="sync"
        )
        waits = asking.compile(checkpointer=saver).invoke(
            {"n": 0, "answer": ""}, {"configurable": {"thread_id": "ask-7"}}, durability="sync"
        )
    assert done == {"n": 2, "answer": ""} and "__interrupt__" in waits
    finished, asked = thread_run_id("chat-42"), thread_run_id("ask-7")

    code, listing, _ = cli(capsys, "--root", root, "runs")
    assert code == 0
    header, *lines = listing.splitlines()
    status = slice(header.index("STATUS"), header.index("OWNER"))
    rows = {line.split()[0]: line[status].strip() for line in lines}
    # no "cannot be resumed" line after the table
    assert rows == {finished: "paused (idle thread)", asked: "paused (idle thread)"}, listing
    listed = json.loads(cli(capsys, "--root", root, "runs", "--json")[1])
    assert {(r["idle"], r["cannot_resume"]) for r in listed} == {(True, None)}

    shown = json.loads(cli(capsys, "--root", root, "show", finished, "--json")[1])
    assert shown["next"] == (
        "an idle thread: the code that keeps it continues it when it next writes: "
        "invoke the graph with thread_id='chat-42'"
    )
    code, out, err = cli(capsys, "--root", root, "resume", finished)
    assert (code, out) == (2, "")  # never "answer with: afk-local resume ... --input JSON"
    assert err == (
        f"afk-local: run '{finished}' cannot be resumed: it is an idle thread (a LangGraph "
        "thread or a RunSession conversation): the code that keeps it continues it: invoke "
        "the graph with thread_id='chat-42'\n"
    )

    # an idle thread is removed on purpose only (its history goes with it)
    code, _, err = cli(capsys, "--root", root, "rm", finished)
    assert code == 2 and "is an idle thread" in err
    results = follow(lambda *argv: cli(capsys, *argv), err)
    assert [code for code, _ in results] == [0], results
    assert cli(capsys, "--root", root, "show", finished)[0] == 2  # gone
