"""Collecting the suite imports no agent framework, LangGraph or pandas.

Every xdist worker collects every module, so a framework imported at a module's top
cost each worker its import (openai-agents, LangGraph, pydantic-ai and pandas together:
about 9 s of CPU per worker) only for one worker to run the module's tests. The modules
that use one import it in their tests and check for it in an autouse fixture
(``pytest.importorskip``); a module wholly in the slow tier is not imported at all by
the default suite. This test collects those modules in a child and looks.
"""

from __future__ import annotations

import json
import os

import proc
import pytest
from proc import REPO

HEAVY = ("agents", "langgraph", "langchain_core", "pydantic_ai", "pandas", "numpy", "openai")
"""Packages collection must not import (each costs 0.3-3 s of CPU)."""

MODULES = (
    "tests/integrations/test_openai_agents.py",
    "tests/integrations/test_openai_agents_dropin.py",
    "tests/integrations/test_openai_agents_session.py",
    "tests/integrations/test_openai_agents_crash.py",  # wholly slow: not imported
    "tests/integrations/test_langgraph.py",
    "tests/integrations/test_langgraph_newest.py",
    "tests/integrations/test_langgraph_listing.py",
    "tests/integrations/test_pydantic_ai.py",
    "tests/integrations/test_pydantic_ai_standalone.py",
    "tests/integrations/test_pydantic_ai_replay.py",
    "tests/storage/format/test_tables.py",
    "tests/testing/test_crashsim.py",  # the explorer's registry lists the LangGraph workload
    "tests/testing/test_crashsim_langgraph.py",
)

COLLECT = """
import json, sys
import pytest
heavy = sys.argv[1].split(",")
code = pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                    *sys.argv[2:]])
loaded = sorted(name for name in sys.modules if name.split(".")[0] in heavy)
print(json.dumps({"code": int(code), "loaded": loaded}))
"""


@pytest.mark.fresh_interpreter  # pytest.main in a fork of the fork server misses its plugin
def test_collecting_the_framework_modules_imports_no_framework() -> None:
    child = proc.python(["-c", COLLECT, ",".join(HEAVY), *MODULES], env=dict(os.environ), cwd=REPO)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, child.stdout + child.stderr
    assert result["loaded"] == []
