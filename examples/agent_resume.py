"""A research agent you can kill at any moment and resume: nothing is done twice.

The "LLM" is scripted (no network, no key): for each of ``--topics`` topics it
asks for three tools — ``search``, ``read_page``, ``save_note`` — then writes
a summary. ``save_note`` appends to a notes file: a real side effect. Kill the
process (Ctrl-C, ``kill -9``, close the lid) and run the same command again:

    python examples/agent_resume.py --topics 8          # kill it midway...
    python examples/agent_resume.py --topics 8          # ...and it continues

Or let the watcher finish it, as it would after a crash at the next login. The
run records ``agent_resume:build_agent`` (``Agent(entrypoint=...)``) and the
options it was built with (the run's ``context``), so a fresh process rebuilds
the same agent; the watcher only needs ``examples/`` on its ``PYTHONPATH``:

    python examples/agent_resume.py --topics 8 & sleep 2; kill -9 $!
    PYTHONPATH=examples afk-local watch --once          # or: afk-local resume agent-demo

Every finished tool call is replayed from the run's effect journal, a model
answer that was already received is not asked for again, and the notes file
ends with exactly one line per topic. Set ``AFK_LOCAL_ROOT`` to choose where
runs live (default ``./.afk``); ``afk-local show agent-demo`` shows the run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import afk_local as afk
from afk_local.agent import tool

TOPICS = [
    "write-ahead logs",
    "fsync semantics",
    "zstd dictionaries",
    "crash consistency",
    "idempotency keys",
    "delta encoding",
    "file locks",
    "atomic rename",
    "checksums",
    "torn writes",
]


def scripted_llm(topics: int) -> Any:
    """A deterministic stand-in for a model: three tool calls per topic, then a summary."""

    def llm(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> afk.LLMResponse:
        step = sum(m["role"] == "assistant" for m in messages) + 1
        usage = {"prompt_tokens": 50 * step, "completion_tokens": 20}
        if step > topics:
            notes = [
                m["content"] for m in messages if m["role"] == "tool" and "saved" in m["content"]
            ]
            return afk.LLMResponse(
                text=f"Researched {topics} topics; {len(notes)} notes saved.",
                finish_reason="stop",
                usage=usage,
                model="scripted",
            )
        topic = TOPICS[(step - 1) % len(TOPICS)]
        calls = [
            afk.ToolCall(id=f"t{step}-search", name="search", arguments={"query": topic}),
            afk.ToolCall(
                id=f"t{step}-read",
                name="read_page",
                arguments={"url": f"https://example.org/{step}"},
            ),
            afk.ToolCall(id=f"t{step}-note", name="save_note", arguments={"topic": topic}),
        ]
        return afk.LLMResponse(
            tool_calls=calls, finish_reason="tool_calls", usage=usage, model="scripted"
        )

    return llm


@afk.agent_factory
def build_agent(context: dict[str, Any]) -> afk.Agent:
    """The agent for ``context`` (topics, notes, delay): also how another process rebuilds it."""
    topics, notes, delay = int(context["topics"]), Path(context["notes"]), float(context["delay"])

    # Reads are safe to repeat: idempotent=True lets a call cut short by a kill be retried.
    @tool(idempotent=True)
    def search(query: str) -> str:
        """Search the web."""
        time.sleep(delay)
        print(f"tool search {query}", flush=True)
        return f"3 results for {query}"

    @tool(idempotent=True)
    def read_page(url: str) -> str:
        """Read a web page."""
        time.sleep(delay)
        print(f"tool read_page {url}", flush=True)
        return f"contents of {url}"

    @tool(idempotent=True)
    def save_note(topic: str, idempotency_key: str) -> str:
        """Append a note to the notes file (a side effect that must happen once).

        A kill can land after the write but before the journal recorded it; the
        call is then *in doubt*. Marked idempotent, it is retried with the same
        idempotency key, which it uses to skip a note already written — the
        pattern for any outside service that accepts such a key.
        """
        time.sleep(delay)
        done = notes.read_text(encoding="utf-8") if notes.exists() else ""
        if idempotency_key not in done:
            with open(notes, "a", encoding="utf-8") as fh:
                fh.write(f"note about {topic} [{idempotency_key}]\n")
        print(f"tool save_note {topic}", flush=True)
        return f"saved note on {topic}"

    return afk.Agent(
        "researcher",
        "You research topics and save notes.",
        scripted_llm(topics),
        {
            "search": search,
            "read_page": read_page,
            "save_note": save_note,
        },
        model="scripted",
        max_steps=topics + 1,
        parallel_tools=False,  # in order, so the printed lines read like a story
        entrypoint="agent_resume:build_agent",  # where `afk-local resume`/the watcher find it
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=6)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds per tool call")
    parser.add_argument("--notes", default="notes.txt", help="the side-effect file")
    parser.add_argument("--run-id", default="agent-demo")
    args = parser.parse_args()
    # Everything the agent is built from goes into the run's context: a resume in
    # another process calls build_agent(context) with the same values.
    context = {"topics": args.topics, "notes": str(Path(args.notes).resolve()), "delay": args.delay}
    runner = afk.AgentRunner()  # $AFK_LOCAL_ROOT, else ./.afk
    result = runner.run(
        build_agent(context), "Research storage durability.", run_id=args.run_id, context=context
    )
    print(f"{result.state}: {result.final_text}")
    print(f"replayed {result.replayed_effect_count} journaled calls; usage {result.usage}")


if __name__ == "__main__":
    main()
