"""The page's live updates: which runs changed (watchfiles on ``runs/``), pushed as events.

:class:`RunChanges` is tested in process on real files (one shared watch, changed
runs named, temporaries ignored, :meth:`close` ends every listener). The event
stream is tested on a real ``afk-local ui`` process over HTTP: it needs the token,
pushes the runs table's new rows and a run's change, and a server told to stop
(SIGTERM) with a stream open ends that stream cleanly and exits.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
from pathlib import Path

import cli_jobs
import pytest
import ui_server
from ui_server import served

import afk_local as afk

pytest.importorskip("starlette", reason="afk_local[ui] is not installed (starlette)")
pytest.importorskip("uvicorn", reason="afk_local[ui] is not installed (uvicorn)")

from afk_local.ui.events import RunChanges  # after the skips: needs the ui extra
from afk_local.ui.sse import sse_event  # after the skips: needs the ui extra

WAIT_S = 30
"""The most a test waits for an event before failing (never a timing claim)."""


def test_one_watch_names_the_changed_runs_to_every_listener(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / ".tmp-new").mkdir()

    async def scenario() -> tuple[set[str], set[str], bool]:
        changes = RunChanges(runs, debounce_ms=50)
        first, second = changes.listen(), changes.listen()
        # Each listener's first item says the watch is in place: from then on no change
        # is missed (so no sleep: a change made at once must be seen).
        assert await asyncio.wait_for(anext(first), WAIT_S) is None
        assert await asyncio.wait_for(anext(second), WAIT_S) is None
        got_first = asyncio.ensure_future(anext(first))
        got_second = asyncio.ensure_future(anext(second))
        (runs / ".tmp-new" / "x").write_text("temporary, never a run")
        (runs / "a" / "run.meta").write_text("changed")
        seen_first: set[str] = set(await asyncio.wait_for(got_first, WAIT_S) or ())
        seen_second: set[str] = set(await asyncio.wait_for(got_second, WAIT_S) or ())
        ended = asyncio.ensure_future(anext(first))
        changes.close()
        try:
            await asyncio.wait_for(ended, WAIT_S)
            closed_ends_it = False
        except StopAsyncIteration:
            closed_ends_it = True
        await second.aclose()
        return seen_first, seen_second, closed_ends_it

    seen_first, seen_second, closed_ends_it = asyncio.run(scenario())
    assert seen_first == {"a"} and seen_second == {"a"}
    assert closed_ends_it


def test_a_closed_source_ends_a_new_listener_at_once(tmp_path: Path) -> None:
    async def scenario() -> list[object]:
        changes = RunChanges(tmp_path / "runs")
        changes.close()
        return [x async for x in changes.listen()]

    assert asyncio.run(scenario()) == []


def test_an_event_with_several_lines_keeps_them() -> None:
    assert sse_event("rows", "<tr>\n</tr>") == b"event: rows\ndata: <tr>\ndata: </tr>\n\n"


def _open_stream(server, query: str = "", *, token: bool = True) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_S)
    headers = {"Cookie": f"{server.cookie_name}={server.token}"} if token else {}
    conn.request("GET", "/events?" + query, headers=headers)
    return conn.getresponse()


def _read_event(answer: http.client.HTTPResponse, kind: str) -> str:
    """The data of the next event named ``kind`` (comments and other events skipped)."""
    current, data = "", []
    while True:
        line = answer.readline()
        if not line:
            raise AssertionError(f"the stream ended before a {kind!r} event")
        text = line.decode().rstrip("\n")
        if text.startswith("event: "):
            current = text.removeprefix("event: ")
        elif text.startswith("data: "):
            data.append(text.removeprefix("data: "))
        elif text == "":
            if current == kind:
                return "\n".join(data)
            current, data = "", []


def test_the_stream_needs_the_token_and_names_the_runs_that_changed(tmp_path: Path) -> None:
    """One stream serves every page of a browser: it says which runs changed, and each
    page fetches only what it shows of them."""
    store = afk.Store(tmp_path / "store")
    cli_jobs.count_job.with_store(store).run(2, str(tmp_path / "out.txt"), run_id="done")
    with pytest.raises(RuntimeError):
        ui_server.failing_job.with_store(store).run("boom", run_id="broken")
    with served(store.root) as server:
        refused = _open_stream(server, token=False)
        assert refused.status == 403
        stream = _open_stream(server)
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        # The first line comes once the server's watch is in place: a change from now on
        # is never missed (it used to come at once, and a cancel on a fast disk landed
        # before the watch existed: the test then waited for ever).
        assert stream.readline() == b": still here\n"
        afk.cancel("broken", store=store, reason="from the test")
        assert json.loads(_read_event(stream, "changed")) == ["broken"]


def test_stopping_the_server_ends_an_open_stream_cleanly(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    cli_jobs.count_job.with_store(store).run(1, str(tmp_path / "out.txt"), run_id="done")
    with served(store.root) as server:
        stream = _open_stream(server)
        assert stream.readline() == b": still here\n"
        server.process.send_signal(signal.SIGTERM)
        rest = stream.read()  # the chunked answer ends properly: IncompleteRead if cut
        assert b"event:" not in rest
        # uvicorn re-raises the SIGTERM it handled once it has shut down: -15, not -9
        assert server.process.wait(timeout=WAIT_S) in (0, -signal.SIGTERM)
