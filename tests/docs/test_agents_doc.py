"""docs/agents.md shows each framework's example exactly as examples/ has it (a test runs them)."""

from __future__ import annotations

import re

from proc import REPO


def test_the_agents_page_shows_the_examples_that_run() -> None:
    page = (REPO / "docs" / "agents.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    examples = ["pydantic_ai_agent.py", "openai_agents_agent.py"]
    assert blocks == [(REPO / "examples" / name).read_text() for name in examples]
