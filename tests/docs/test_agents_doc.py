"""docs/agents.md shows the pydantic-ai example exactly as examples/ has it (which a test runs)."""

from __future__ import annotations

import re

from proc import REPO


def test_the_pydantic_ai_page_shows_the_example_that_runs() -> None:
    page = (REPO / "docs" / "agents.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", page, re.S)
    assert block == (REPO / "examples" / "pydantic_ai_agent.py").read_text()
