"""A crafted run.meta naming any callable as an agent's "factory" (docs/security.md).

Before the fix a rebuild called whatever the entrypoint resolved to with the run's
``context``: ``subprocess:run`` turned the context's keys into a command line. Only an
``Agent`` or an ``@afk.agent_factory`` function is ever used now.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from attacks import afk, agent_meta_params, one_line_error, plant_meta

import afk_local as afk_api
from afk_local.agent.rebuild import load_agent
from afk_local.errors import EntrypointError


def test_afk_local_resume_never_calls_a_crafted_agent_factory(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    entry, params, extra = agent_meta_params(marker)
    plant_meta(tmp_path, "evil", entrypoint=entry, params=params, extra=extra)
    res = afk(tmp_path, "resume", "evil")
    assert res.returncode == 2 and not marker.exists()
    line = one_line_error(res)
    assert "subprocess:run" in line and "not an Agent or an @afk.agent_factory" in line


@pytest.mark.parametrize(
    ("entrypoint", "kind"),
    [
        ("attack_jobs:plain_function", "agent"),  # a plain function: never called
        ("subprocess:run", None),  # a durable job's entrypoint naming any callable
        ("os:system", None),
    ],
)
def test_only_registered_objects_are_resolved(tmp_path: Path, entrypoint: str, kind) -> None:
    plant_meta(
        tmp_path,
        "r",
        entrypoint=entrypoint,
        params={"args": [["false"]], "kwargs": {}, "context": {}},
        extra={"kind": kind} if kind else {},
    )
    store = afk_api.Store(tmp_path)
    with pytest.raises(EntrypointError, match="afk-local calls nothing else"):
        afk_api.resume("r", store=store)
    if kind:
        with pytest.raises(EntrypointError, match="agent_factory"):
            load_agent(store.read_meta("r"))
