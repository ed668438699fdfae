"""The README's tour runs as written (with a stand-in for sending email)."""

from __future__ import annotations

import re

from proc import REPO

import afk_local as afk

README = REPO / "README.md"


def test_readme_tour_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python block"
    sent: list[str] = []
    namespace = {
        "send_email": lambda customer: sent.append(customer),
        "customers": ["ada", "grace", "alan"],
    }
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert sent == ["ada", "grace", "alan"]
    assert afk.Store("./.afk").open("invoices-nov").meta.status is afk.RunStatus.COMPLETED
    assert afk.StateCheckpoint("./progress").get_result() == {"i": 100}
    # Running it again returns the stored result without sending anything.
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert sent == ["ada", "grace", "alan"]
