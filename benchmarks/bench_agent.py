"""Storage growth of an agent run: bytes on disk against full JSON snapshots per phase.

A scripted agent runs N steps (one LLM answer and two tool calls each, tool
results of ~400 B of text, so the conversation grows like a real one). The
baseline is what a framework that writes the whole runtime snapshot as JSON at
every phase would store; the second baseline writes JSON only at the
``runtime_state`` rows. Run::

    python benchmarks/bench_agent.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import afk_local as afk

_WORDS = [
    "agent",
    "reads",
    "file",
    "then",
    "calls",
    "tool",
    "search",
    "answer",
    "while",
    "user",
    "waits",
    "reply",
    "about",
    "invoices",
    "payments",
    "emails",
    "schedules",
    "report",
    "summary",
    "table",
    "figure",
    "source",
    "quote",
    "page",
    "result",
]


def _text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def make_agent(steps: int) -> afk.Agent:
    """A deterministic research agent: 2 tool calls per step, then a final answer."""

    def llm(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> afk.LLMResponse:
        n = sum(m["role"] == "assistant" for m in messages) + 1
        usage = {"prompt_tokens": 40 * n, "completion_tokens": 30, "total_tokens": 40 * n + 30}
        if n > steps:
            return afk.LLMResponse(text=_text(n, 60), finish_reason="stop", usage=usage)
        calls = [
            afk.ToolCall(id=f"call_{n}_a", name="search", arguments={"query": _text(n, 6)}),
            afk.ToolCall(id=f"call_{n}_b", name="read", arguments={"url": f"https://x/{n}"}),
        ]
        return afk.LLMResponse(
            text=_text(-n, 15), tool_calls=calls, finish_reason="tool_calls", usage=usage
        )

    def search(query: str) -> str:
        """Search the web."""
        return _text(len(query), 60)

    def read(url: str) -> str:
        """Read a page."""
        return _text(len(url) * 7, 70)

    return afk.Agent(
        "bench", "You research.", llm, {"search": search, "read": read}, max_steps=steps + 1
    )


def measure(root: Path, steps: int = 200, durability: str = "sync") -> dict[str, Any]:
    """Run the agent for ``steps`` steps under ``root``; sizes of its files and of the baselines."""
    store = afk.Store(root / "store")
    started = time.perf_counter()
    result = afk.AgentRunner(store, durability=durability).run(
        make_agent(steps), "research", run_id="growth"
    )
    seconds = time.perf_counter() - started
    assert result.state == "completed", result.error
    paths = store.paths("growth")
    ckpt_bytes = sum(f.stat().st_size for f in paths.dir.glob("*.ckpt"))
    journal_bytes = paths.journal.stat().st_size
    history = store.open("growth").history()
    current: Any = None
    json_bytes = json_rs_bytes = 0
    for record in history:
        if record.phase == "runtime_state":
            current = record.payload
            json_rs_bytes += len(json.dumps(record.payload))
        snapshot = current if current is not None else record.payload
        json_bytes += len(json.dumps(snapshot))
    disk = ckpt_bytes + journal_bytes
    return {
        "steps": steps,
        "checkpoints": len(history),
        "ckpt_bytes": ckpt_bytes,
        "journal_bytes": journal_bytes,
        "disk_bytes": disk,
        "json_bytes": json_bytes,
        "json_rs_bytes": json_rs_bytes,
        "ratio": disk / json_bytes,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, nargs="*", default=[50, 200])
    args = parser.parse_args(argv)
    print(
        f"{'steps':>6} {'ckpts':>6} {'ckpt B':>12} {'journal B':>12} {'afk total B':>12} "
        f"{'JSON/phase B':>14} {'ratio':>8} {'JSON rs-only B':>15} {'ratio':>8} {'s':>6}"
    )
    for steps in args.steps:
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(Path(tmp), steps)
        print(
            f"{row['steps']:>6} {row['checkpoints']:>6} {row['ckpt_bytes']:>12,} "
            f"{row['journal_bytes']:>12,} {row['disk_bytes']:>12,} {row['json_bytes']:>14,} "
            f"{row['ratio']:>8.2%} {row['json_rs_bytes']:>15,} "
            f"{row['disk_bytes'] / row['json_rs_bytes']:>8.2%} {row['seconds']:>6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
