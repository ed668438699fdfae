"""What a person comes to the page for, and what the page refuses, over HTTP.

A real ``afk-local ui`` process on one store: a failed run's page shows where it
failed (its stored traceback), a completed run's page its result, the runs page what
needs a person, the timeline a line per run of alike checkpoints with durations; a
symlinked run is a 4xx with the security headers, no text is taken from the address,
and a refused settlement writes nothing.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import cli_jobs
import pytest
import ui_server
from ui_server import csrf_of, said, served

import afk_local as afk
from afk_local.errors import SettleError
from afk_local.storage.format.records import LANGGRAPH_IDLE_PAUSE_KIND, PauseInfo

pytest.importorskip("starlette", reason="afk_local[ui] is not installed (starlette)")
pytest.importorskip("uvicorn", reason="afk_local[ui] is not installed (uvicorn)")

from afk_local.runner.operations.settle import settle, unsettle
from afk_local.storage.rundir.read.metrics import read_metrics
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.ui.gone import AbandonableStore, ClientGone
from afk_local.ui.views import group_timeline, innermost_frame, run_page


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("ui-pages")
    store = afk.Store(base / "store")
    cli_jobs.count_job.with_store(store).run(3, str(base / "outside.txt"), run_id="done")
    with pytest.raises(RuntimeError):
        ui_server.failing_job.with_store(store).run("the API said 500", run_id="broken")
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("ship it?", run_id="ask")
    ui_server.metric_job.with_store(store).run(30, run_id="loop")
    with store.create("thread", thread_id="thread") as run:  # as a LangGraph saver leaves one
        run.checkpoint("langgraph", {"n": 1}, step=1)
        idle = PauseInfo(kind=LANGGRAPH_IDLE_PAUSE_KIND, prompt="invoke the graph")
        run.update_meta(status=afk.RunStatus.PAUSED, pause=idle)
    os.symlink(store.paths("done").dir, store.runs_dir / "linked")
    with served(store.root) as server:
        yield {"store": store, "server": server}


def test_a_failed_run_shows_the_innermost_frame_of_its_stored_traceback(world) -> None:
    status, _, page = world["server"].get("/runs/broken")
    assert status == 200
    innermost = re.search(r'<pre class="payload innermost" id="innermost">(.*?)</pre>', page, re.S)
    assert innermost is not None
    assert "ui_server.py" in innermost.group(1) and "in failing_job" in innermost.group(1)
    assert "raise RuntimeError(why)" in innermost.group(1)
    assert 'id="traceback"' in page and "Traceback (most recent call last)" in page
    assert "<strong>Needs you:</strong> it failed" in page


def test_a_completed_run_shows_its_result(world) -> None:
    status, _, page = world["server"].get("/runs/done")
    assert status == 200
    result = re.search(r'<section aria-labelledby="result-h" id="result">.*?</section>', page, re.S)
    assert result is not None and '<pre class="payload">5</pre>' in result.group(0)  # 0+1+4


def test_the_runs_page_puts_what_needs_a_person_first(world) -> None:
    _, _, page = world["server"].get("/")
    needs = re.search(
        r'<section aria-labelledby="needs-h" id="needs-you">.*?</section>', page, re.S
    )
    assert needs is not None
    assert page.index('id="needs-you"') < page.index('id="runs"')
    rows = dict(re.findall(r'<tr data-needs="([^"]+)".*?<td class="why">([^<]*)</td>', page, re.S))
    assert rows == {"ask": "waits for an answer", "broken": "failed"}  # an idle thread: no
    assert "Needs you" not in world["server"].get("/runs/thread")[2]


def test_actions_are_offered_only_where_they_can_work(world) -> None:
    server = world["server"]
    done = server.get("/runs/done")[2]
    assert "/cancel" not in done and "/resume" not in done  # it ended: nothing to do
    broken = server.get("/runs/broken")[2]
    assert 'action="/runs/broken/resume"' in broken and 'action="/runs/broken/cancel"' in broken


def test_a_symlinked_run_is_refused_with_a_4xx_and_the_security_headers(world) -> None:
    server = world["server"]
    for path in ("/runs/linked", "/runs/linked/checkpoints/1", "/runs/linked/diff?a=1&b=2"):
        status, headers, page = server.get(path)
        assert 400 <= status < 500, (path, status)
        assert (
            headers["x-frame-options"] == "DENY"
            and "default-src 'self'" in (headers["content-security-policy"])
        )
        assert "symlink" in page
    status, headers, _ = server.post(
        "/runs/linked/cancel", {"csrf": csrf_of(server.get("/runs/broken")[2]), "confirm": "yes"}
    )
    assert 400 <= status < 500 and headers["x-frame-options"] == "DENY"


def test_no_page_shows_text_taken_from_its_address(world) -> None:
    server = world["server"]
    for query in ("problem", "notice", "said"):
        _, _, page = server.get(f"/runs/broken?{query}=Your+session+expired%3A+call+QZX-QZX")
        assert "QZX-QZX" not in page, query
        _, _, page = server.get(f"/?{query}=Your+session+expired%3A+call+QZX-QZX")
        assert "QZX-QZX" not in page, query


def test_a_refused_settlement_writes_nothing(world, tmp_path: Path) -> None:
    """Settling an effect that is not in doubt (or undoing what nobody settled) is refused
    before the run's lock is taken: not even run.meta is rewritten."""
    store = world["store"]
    meta = store.paths("done").meta
    key = store.open("done").effects()[0].key
    before = (meta.read_bytes(), meta.stat().st_mtime_ns, meta.stat().st_ino)
    with pytest.raises(SettleError, match="not in doubt"):
        settle("done", key, store=store, done=True, result=1)
    with pytest.raises(SettleError, match="not settled by hand"):
        unsettle("done", key, store=store)
    with pytest.raises(SettleError, match="has no effect"):
        settle("done", "no-such-key", store=store, done=False)
    assert (meta.read_bytes(), meta.stat().st_mtime_ns, meta.stat().st_ino) == before
    server = world["server"]
    csrf = csrf_of(server.get("/runs/broken")[2])
    form = {"csrf": csrf, "key": key, "outcome": "done", "result": "1"}
    status, headers, _ = server.post("/runs/done/settle", form)
    assert status == 303 and "not in doubt" in said(server, headers)
    assert (meta.read_bytes(), meta.stat().st_mtime_ns, meta.stat().st_ino) == before


def test_the_timeline_is_a_line_per_run_of_alike_checkpoints_with_how_long(world) -> None:
    _, _, page = world["server"].get("/runs/loop")
    timeline = re.search(r'<table id="timeline">.*?</table>', page, re.S)
    assert timeline is not None
    lines = re.findall(r"<tr class=\"ev-checkpoint\">", timeline.group(0))
    assert len(lines) == 1  # 30 runtime_state checkpoints of step 0: one line
    assert "&times;30" in timeline.group(0)
    took = re.search(r'<td class="num nowrap took">([^<]+)</td>', timeline.group(0))
    assert took is not None and re.fullmatch(r"\d+ ms|\d+\.\d s|\S+", took.group(1))


def test_a_checkpoint_page_asks_for_the_other_seq_instead_of_listing_them_all(world) -> None:
    _, _, page = world["server"].get("/runs/loop/checkpoints/5")
    assert "<select" not in page and "<option" not in page
    assert '<input type="number" name="b"' in page


def test_rows_of_named_runs_are_only_those_rows(world) -> None:
    _, _, rows = world["server"].get("/runs/rows?ids=done,broken,nope,..")
    assert re.findall(r'<tr data-run="([^"]+)"', rows) == ["done", "broken"]


def test_innermost_frame_and_grouping_rules() -> None:
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/a.py", line 3, in outer\n    inner()\n'
        '  File "/b.py", line 9, in inner\n    raise KeyError(1)\n'
        "    ^^^^^^^^^^^^^^^^^\nKeyError: 1\n"
    )
    assert innermost_frame(traceback) == 'File "/b.py", line 9, in inner\n    raise KeyError(1)'
    assert innermost_frame("RuntimeError: no frames") is None
    assert group_timeline([]) == []


def test_metrics_can_be_read_from_the_newest_checkpoints_only(world) -> None:
    reader = world["store"].open("loop")
    every = read_metrics(reader)
    newest = read_metrics(reader, newest=5)
    assert len(every) == 30
    assert 0 < len(newest) < len(every)
    assert [p.seq for p in newest] == [p.seq for p in every][-len(newest) :]


def test_a_run_page_lists_the_run_s_checkpoints_once(world, monkeypatch) -> None:
    # A 50,000-checkpoint run's listing took about a third of its page, taken twice.
    listed = []
    every = RunReader.checkpoint_files

    def counted(self: RunReader) -> list:
        listed.append(self.run_id)
        return every(self)

    monkeypatch.setattr(RunReader, "checkpoint_files", counted)
    page = run_page(world["store"], "loop")
    assert listed == ["loop"] and page.metrics.names() == ["loss"]


def test_a_page_whose_client_went_stops_at_its_next_read_of_the_store(world) -> None:
    gone = threading.Event()
    store = AbandonableStore(world["store"], gone)
    assert store.read_meta("done").run_id == "done"
    gone.set()
    with pytest.raises(ClientGone):
        store.read_meta("done")
    assert store.root == world["store"].root  # plain attributes pass through
