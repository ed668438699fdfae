"""A LangGraph graph killed with SIGKILL mid-run, then resumed from afk_local files.

Run it as it is (needs ``pip install 'afk_local[langgraph]'``, no network)::

    python examples/langgraph_resume.py

It starts a worker process that runs a small deterministic graph (eight steps,
each summarising one chapter) with ``AfkLocalSaver`` and ``durability="sync"``,
kills that process with SIGKILL after step 3, resumes the same thread here, and
checks the result against an uninterrupted run. The store is ``$AFK_LOCAL_ROOT``
if set, else a temporary directory.
"""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from afk_local.integrations.langgraph import AfkLocalSaver

CHAPTERS = [
    "the storm reaches the harbour",
    "a lighthouse keeper counts ships",
    "one ship does not come back",
    "the village searches the coast",
    "a bottle washes up with a letter",
    "the letter names an island",
    "two boats sail at dawn",
    "the crew is found alive",
]


OUTPUT = {"quiet": False}  # the reference run does not print its steps


class Book(TypedDict):
    done: int
    summaries: Annotated[list[str], operator.add]


def summarise(state: Book) -> dict[str, Any]:
    """One step: 'summarise' the next chapter (deterministic, a little slow)."""
    chapter = CHAPTERS[state["done"]]
    time.sleep(0.05)  # stands in for a model call
    words = chapter.split()
    summary = f"{state['done'] + 1}: {words[1]} {words[-1]} ({len(words)} words)"
    if not OUTPUT["quiet"]:
        print(f"step {state['done'] + 1} done: {summary}", flush=True)
    return {"done": state["done"] + 1, "summaries": [summary]}


def build(checkpointer: Any) -> Any:
    """The graph: summarise chapters one per step until all are done."""
    graph = StateGraph(Book)
    graph.add_node("summarise", summarise)
    graph.add_edge(START, "summarise")
    graph.add_conditional_edges(
        "summarise", lambda s: END if s["done"] == len(CHAPTERS) else "summarise"
    )
    return graph.compile(checkpointer=checkpointer)


def worker(root: str, thread_id: str) -> None:
    """The process that gets killed: runs the graph from the start."""
    config = {"configurable": {"thread_id": thread_id}}
    with AfkLocalSaver.from_path(root) as saver:
        build(saver).invoke({"done": 0, "summaries": []}, config, durability="sync")


def main() -> None:
    """Start a worker, kill it after step 3, resume the thread here, compare."""
    root = os.environ.get("AFK_LOCAL_ROOT") or tempfile.mkdtemp(prefix="afk-langgraph-")
    thread_id = f"book-{os.getpid()}"
    child = subprocess.Popen(
        [sys.executable, __file__, "--worker", root, thread_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        print(f"  worker: {line.rstrip()}")
        if line.startswith("step 3 done"):
            child.send_signal(signal.SIGKILL)
            break
    child.wait()
    print(f"killed the worker with SIGKILL (exit code {child.returncode})")

    config = {"configurable": {"thread_id": thread_id}}
    with AfkLocalSaver.from_path(root) as saver:
        graph = build(saver)
        before = graph.get_state(config).values.get("done", 0)
        print(f"resumed thread {thread_id!r} from the checkpoint after step {before}")
        result = graph.invoke(None, config, durability="sync")

    OUTPUT["quiet"] = True
    reference = build(InMemorySaver()).invoke(
        {"done": 0, "summaries": []}, {"configurable": {"thread_id": "reference"}}
    )
    print("summaries:")
    for summary in result["summaries"]:
        print(f"  {summary}")
    print(f"matches an uninterrupted run: {result == reference}")
    print(f"files: {root}/runs/ (inspect with `afk-local runs --root {root}`)")
    if result != reference:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
