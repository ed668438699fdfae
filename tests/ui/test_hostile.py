"""A hostile store on the page: whatever its files hold is shown as text, and bounded.

A run whose state, step, metric, pause, tags, job, parent and error hold markup (and a
few megabytes), written through the store's own writers and then by rewriting its
``run.meta`` as someone with the files could: every page that shows it is served by a
real ``afk-local ui`` process, escapes every byte of it and stays small.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ui_server
from ui_server import HOSTILE, served

import afk_local as afk
from afk_local.storage.format.records import ErrorInfo

pytest.importorskip("starlette", reason="afk_local[ui] is not installed (starlette)")
pytest.importorskip("uvicorn", reason="afk_local[ui] is not installed (uvicorn)")

from afk_local.ui import views  # after the skips: needs the ui extra
from afk_local.ui.app import MAX_CHARTS  # after the skips: needs the ui extra

BIG = 3_000_000
"""Characters of the huge value: ten times what a page shows of a payload."""
PAGE_LIMIT = 2 * views.MAX_SHOWN_JSON + 300_000
"""The most a page of the hostile run may weigh: two cut payloads (inputs and the
pause's prompt) and the rest."""
RAW = ("<script>alert", "<img src=x", "onerror=alert(1)>")
"""What would be markup if a page copied the store's text into its HTML."""


def _hostile_store(root: Path) -> afk.Store:
    store = afk.Store(root)
    with pytest.raises(afk.RunPaused):
        ui_server.hostile_job.with_store(store).run(HOSTILE, "x" * BIG, run_id="evil")
    with store.resume_writer("evil", new_attempt=False) as writer:
        writer.update_meta(
            entrypoint=HOSTILE * 1000,
            parent_run_id=HOSTILE,
            extra={"tags": {HOSTILE: HOSTILE, "big": "y" * BIG}},
            error=ErrorInfo(type=HOSTILE, message=HOSTILE * 50_000),
        )
    return store


def test_a_hostile_run_is_shown_escaped_and_bounded(tmp_path: Path) -> None:
    store = _hostile_store(tmp_path / "store")
    seqs = [f.seq for f in store.open("evil").checkpoint_files()]
    paths = [
        "/",
        "/runs/rows",
        "/runs/evil",
        "/store?verify=1",
        f"/runs/evil/diff?a=1&b={seqs[-1]}",
    ]
    paths += [f"/runs/evil/checkpoints/{seq}" for seq in seqs]
    with served(store.root) as s:
        for path in paths:
            status, _, page = s.get(path)
            assert status == 200, path
            for raw in RAW:
                assert raw not in page, (path, raw)
            assert len(page) < PAGE_LIMIT, (path, len(page))
        _, _, run = s.get("/runs/evil")
        _, _, runs = s.get("/")
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
    for part in ("Job", "Tags", "Forked from", "Error", "Waiting for", "Effects", "Metrics"):
        assert part in run
    assert run.count(escaped) >= 8  # job, tags, parent, error, pause, step, metric, state
    assert escaped in runs  # its tags, in the runs table
    assert "(cut; `afk-local inspect` shows all of it)" in run  # the huge prompt and inputs
    assert "yyy..." in run and "y" * (views.MAX_SHOWN_TEXT + 1) not in run


def test_many_metrics_and_diff_paths_are_cut_with_a_pointer_to_the_cli(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    keys = views.MAX_DIFF_ROWS + 5
    ui_server.wide_job.with_store(store).run(MAX_CHARTS + 2, keys, run_id="wide")
    states = [c.seq for c in store.open("wide").history() if c.phase == "runtime_state"]
    with served(store.root) as s:
        _, _, run = s.get("/runs/wide")
        _, _, diff = s.get(f"/runs/wide/diff?a={states[-2]}&b={states[-1]}")
    assert run.count('<figure class="chart">') == MAX_CHARTS
    assert "2 more metric(s) not drawn" in run and "afk-local metrics wide" in run
    assert diff.count("<tr class=") == views.MAX_DIFF_ROWS
    said = re.search(r"(\d+) paths differ; the first (\d+) are shown", diff)
    assert said is not None and int(said.group(1)) >= keys
    assert int(said.group(2)) == views.MAX_DIFF_ROWS


def test_the_effects_table_lists_those_in_doubt_first_and_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = afk.Store(tmp_path / "store")
    ui_server.steps_job.with_store(store).run(5, run_id="steps")
    monkeypatch.setattr(views, "MAX_EFFECT_ROWS", 3)
    page = views.run_page(store, "steps")
    assert [e["name"] for e in page.effects] == ["s0", "s1", "s2"]
    assert page.effects_total == 5
