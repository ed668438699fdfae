"""``afk-local ui`` as a real server process on loopback, spoken to over HTTP (urllib).

Who may use it (token, Host header, CSRF, read-only, loopback only), what the runs
page lists, and what its actions do to the store on disk. The browser tests
(test_browser.py) drive the same server through Chromium.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import cli_jobs
import proc
import pytest
import ui_server
from proc import SUPPORT
from ui_server import ENV, csrf_of, other_address, said, served

import afk_local as afk
from afk_local.testing import skipping_clock
from afk_local.ui.access import Access

pytest.importorskip("starlette", reason="afk_local[ui] is not installed (starlette)")
pytest.importorskip("uvicorn", reason="afk_local[ui] is not installed (uvicorn)")


FAST = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]


def make_store(root: Path) -> afk.Store:
    """Five runs: three completed (tagged), one failed, one paused waiting for an answer."""
    store = afk.Store(root)
    outside = root.parent / "outside.txt"
    for i, model in enumerate(("small", "small", "large")):
        cli_jobs.count_job.with_store(store).run(
            2, str(outside), run_id=f"count-{i}", tags={"model": model}
        )
    with pytest.raises(RuntimeError):
        ui_server.failing_job.with_store(store).run("boom", run_id="broken")
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("ship it?", run_id="ask")
    return store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> afk.Store:
    return make_store(tmp_path_factory.mktemp("ui") / "store")


@pytest.fixture(scope="module")
def server(store: afk.Store):
    with served(store.root) as s:
        yield s


def test_a_request_without_the_token_gets_403(server) -> None:
    for path in ("/", "/runs/count-0", "/store", "/runs/rows", "/static/ui.js"):
        status, _, body = server.get(path, token=False)
        assert status == 403, path
        assert "token" in body
    status, _, _ = server.get("/?token=not-the-token", token=False)
    assert status == 403


def test_the_token_once_then_a_redirect_without_it_setting_an_http_only_strict_cookie(
    server,
) -> None:
    """The first URL trades the token for a cookie and leaves the address bar at once."""
    status, headers, _ = server.get(f"/?status=failed&token={server.token}", token=False)
    assert status == 303
    assert headers["location"] == "/?status=failed"  # the token gone, the rest kept
    assert headers["cache-control"] == "no-store"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert headers["referrer-policy"] == "same-origin"
    pair = cookie.split(";")[0]
    status, _, body = server.get("/runs/count-0", token=False, headers={"Cookie": pair})
    assert status == 200 and "count-0" in body
    wrong = pair.split("=")[0] + "=nope"
    status, _, _ = server.get("/", token=False, headers={"Cookie": wrong})
    assert status == 403


def test_the_server_has_a_loopback_address_of_its_own(server, store) -> None:
    """Browsers send a cookie to every port of its host: a host of its own keeps the
    token from every other local server (127.0.0.1's, another launch's)."""
    assert server.host.startswith("127.") and server.host != "127.0.0.1"
    with served(store.root) as other:
        assert other.host != server.host


def test_the_host_header_must_name_the_loopback_server(server) -> None:
    """A DNS-rebound name reaching loopback is refused, token or not, and so are the
    names whose cookies other local servers share (localhost, 127.0.0.1)."""
    for host in (
        "evil.example",
        f"evil.example:{server.port}",
        f"{server.host}:{server.port + 1}",
        f"localhost:{server.port}",
        f"127.0.0.1:{server.port}",
    ):
        status, headers, _ = server.get("/", headers={"Host": host})
        assert status == 403, host
        assert headers["x-frame-options"] == "DENY"  # a refusal has the security headers
    status, _, _ = server.get("/", headers={"Host": f"{server.host}:{server.port}"})
    assert status == 200


def test_the_server_is_not_reachable_on_another_interface(server) -> None:
    address = other_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    with pytest.raises(OSError):
        socket.create_connection((address, server.port), timeout=5).close()
    socket.create_connection((server.host, server.port), timeout=5).close()


def test_filters_and_pages_list_what_the_store_listing_admits(server) -> None:
    _, _, body = server.get("/?status=failed")
    assert "broken" in body and "count-0" not in body
    _, _, body = server.get("/?tag=model%3Dsmall")
    assert "count-0" in body and "count-1" in body and "count-2" not in body
    _, _, body = server.get("/?name=count-*")
    assert "count-2" in body and "broken" not in body and "ask" not in body
    _, _, body = server.get("/?since=banana")
    assert "--since takes an age" in body
    seen = []
    for page in (1, 2, 3):
        _, _, rows = server.get(f"/runs/rows?per=2&page={page}")
        seen += [line.split('"')[1] for line in rows.splitlines() if "data-run=" in line]
    assert sorted(seen) == ["ask", "broken", "count-0", "count-1", "count-2"]


def test_unknown_and_invalid_runs_are_404(server) -> None:
    assert server.get("/runs/nope")[0] == 404
    assert server.get("/runs/.hidden")[0] == 404


def test_an_action_needs_the_csrf_value_and_a_same_origin(server, store) -> None:
    status, _, _ = server.post("/runs/broken/cancel", {"reason": "x"})
    assert status == 403
    csrf = csrf_of(server.get("/runs/broken")[2])
    status, _, _ = server.post(
        "/runs/broken/cancel",
        {"csrf": csrf, "reason": "x"},
        headers={"Origin": "http://evil.example"},
    )
    assert status == 403
    status, _, _ = server.post("/runs/broken/cancel", {"csrf": csrf}, token=False)
    assert status == 403
    assert store.read_meta("broken").status is afk.RunStatus.FAILED


def test_read_only_refuses_every_action(store) -> None:
    with served(store.root, "--read-only") as ro:
        _, _, page = ro.get("/runs/ask")
        assert 'method="post"' not in page and "read-only" in page
        csrf = Access(token=ro.token, port=ro.port).csrf  # what its forms would carry
        for action, form in (
            ("answer", {"answer": "true", "pause_seq": "1"}),
            ("resume", {}),
            ("cancel", {"reason": "no"}),
            ("settle", {"key": "k", "outcome": "failed"}),
            ("unsettle", {"key": "k"}),
            ("restart", {}),
            ("fork", {"seq": "1", "set": "state.x=1"}),
        ):
            status, _, body = ro.post(f"/runs/ask/{action}", {"csrf": csrf, **form})
            assert status == 403, action
            assert "read-only" in body
    assert store.read_meta("ask").status is afk.RunStatus.PAUSED
    assert sorted(store.run_ids()) == ["ask", "broken", "count-0", "count-1", "count-2"]
    assert not store.requests_dir.exists() or not list(store.requests_dir.iterdir())


def test_a_port_in_use_is_one_line_and_exit_2(store) -> None:
    taken_port = socket.socket()
    try:
        taken_port.bind(("", 0))  # every address of the machine: loopback's too
        taken_port.listen(1)
        port = taken_port.getsockname()[1]
        taken = proc.python(
            ["-m", "afk_local", "--root", str(store.root), "ui", "--port", str(port)],
            env=ENV,
            timeout=60,
        )
    finally:
        taken_port.close()
    assert taken.returncode == 2
    assert taken.stderr.startswith(f"afk-local: cannot serve on port {port} of loopback: ")


def test_answering_a_pause_from_the_page_resumes_the_run_through_the_watcher(
    tmp_path: Path,
) -> None:
    store = afk.Store(tmp_path / "store")
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("ship it?", run_id="ask")
    with served(store.root) as s:
        page = s.get("/runs/ask")[2]
        assert "ship it?" in page
        pause_seq = store.read_meta("ask").pause.seq
        form = {"csrf": csrf_of(page), "answer": '{"ok": true}', "pause_seq": str(pause_seq)}
        status, headers, _ = s.post("/runs/ask/answer", form)
        assert status == 303 and "answer handed to the watcher" in said(s, headers)
        status, _, _ = s.post("/runs/ask/answer", {**form, "answer": "not json"})
        assert status == 303  # refused with the reason on the run page, nothing written
    assert len(list(store.requests_dir.glob("*.json"))) == 1
    watch = proc.python(
        ["-m", "afk_local", "watch", "--root", str(store.root), "--once", *FAST],
        env=ENV,
        timeout=120,
    )
    assert watch.returncode == 0, watch.stderr
    assert store.read_meta("ask").status is afk.RunStatus.COMPLETED
    result = store.open("ask").resume_state().result
    assert result == {"question": "ship it?", "answer": {"ok": True}}


def test_cancel_from_the_page_cancels_the_run_on_disk(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    with pytest.raises(RuntimeError):
        ui_server.failing_job.with_store(store).run("boom", run_id="broken")
    with served(store.root) as s:
        page = s.get("/runs/broken")[2]
        csrf = csrf_of(page)
        assert 'name="confirm" value="yes" required' in page  # it destroys: confirmed
        meta_before = (store.root / "runs" / "broken" / "run.meta").read_bytes()
        status, headers, _ = s.post("/runs/broken/cancel", {"csrf": csrf, "reason": "enough"})
        assert status == 303 and "tick 'for good'" in said(s, headers)
        assert (store.root / "runs" / "broken" / "run.meta").read_bytes() == meta_before
        form = {"csrf": csrf, "reason": "enough", "confirm": "yes"}
        status, headers, _ = s.post("/runs/broken/cancel", form)
        assert status == 303, headers
        assert store.read_meta("broken").status is afk.RunStatus.CANCELLED
        status, headers, _ = s.post("/runs/broken/cancel", form)
        assert status == 303  # already cancelled: nothing changes, said on the page
        _, _, page = s.get("/runs/broken")
        assert "cancelled" in page and 'action="/runs/broken/cancel"' not in page


def store_figures(server, query: str = "") -> str:
    """The store page once its figures are read (they are read off the request)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, _, page = server.get("/store" + query)
        assert status == 200
        if "Figures read" in page and ("verify=1" not in query or "verified:" in page):
            return page
        time.sleep(0.1)
    raise AssertionError("the store's figures were not read in 120 s")


def test_the_store_page_shows_disk_use_gc_and_verify(server) -> None:
    page = store_figures(server, "?verify=1")
    assert "count-0" in page and "would free" in page
    assert "5 run(s) verified: every file ok" in page


def test_the_run_page_draws_metrics_shows_and_diffs_checkpoints(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    ui_server.metric_job.with_store(store).run(4, run_id="fit")
    with served(store.root) as s:
        _, _, page = s.get("/runs/fit")
        assert "<svg" in page and "loss: 4 points" in page
        status, _, ckpt = s.get("/runs/fit/checkpoints/1")
        assert status == 200 and "Payload" in ckpt
        assert s.get("/runs/fit/checkpoints/999")[0] == 404
        seqs = [f.seq for f in store.open("fit").checkpoint_files()]
        a, b = seqs[1], seqs[-1]
        status, _, diff = s.get(f"/runs/fit/diff?a={a}&b={b}")
        assert status == 200 and 'class="changed"' in diff and "progress.done" in diff
        assert "identical" in s.get(f"/runs/fit/diff?a={a}&b={a}")[2]
        assert s.get("/runs/fit/diff?a=1")[0] == 400
        assert s.get(f"/runs/fit/diff?a={a}&b=999")[0] == 404


def test_each_checkpoint_of_a_loop_says_how_many_items_were_done_not_step_0(
    tmp_path: Path,
) -> None:
    # Five items; only the last two journal a ctx.step: the first checkpoints have no step.
    store = afk.Store(tmp_path / "store")
    ui_server.items_job.with_store(store).run(5, 3, run_id="loop")
    phases = [(c.seq, c.phase) for c in store.open("loop").history()]
    assert [p for _, p in phases] == ["runtime_state"] * 5 + ["run_terminal"]
    expected = [
        "1 of 5 items done",
        "2 of 5 items done",
        "3 of 5 items done",
        "4 of 5 items done, step 1",
        "5 of 5 items done, step 2",
        "5 of 5 items done, step 2",
    ]
    with served(store.root) as s:
        _, _, page = s.get("/runs/loop")
        checkpoint_pages = [s.get(f"/runs/loop/checkpoints/{seq}")[2] for seq, _ in phases]
    shown = dict(
        re.findall(
            r'/checkpoints/(\d+)">[^<]*</a>[^<]*'
            r'<span class="muted">\(checkpoints? [^<]*(?:<a [^>]*>\d+</a>)?\)</span></td>'
            r'\s*<td class="num nowrap took">[^<]*</td>\s*<td>([^<]*)</td>',
            page,
        )
    )
    # The three checkpoints of step 0 are one line of the timeline, from the first to the last.
    first = phases[0][0]
    assert shown[str(first)] == f"{expected[0]} to {expected[2]}"
    assert "&times;3" in page and f"(checkpoints {first}&ndash;<a href" in page
    assert [shown[str(seq)] for seq, _ in phases[3:]] == expected[3:]
    last = phases[-1][0]
    assert f'id="position">{last} (6 kept): 5 of 5 items done, step 2</dd>' in page
    wheres = [re.search(r'id="position">([^<]*)</dd>', c) for c in checkpoint_pages]
    assert [w.group(1) if w else None for w in wheres] == expected
    timeline = re.search(r'<table id="timeline">.*?</table>', page, re.S)
    assert timeline is not None and "step 0" not in timeline.group(0)


def test_a_checkpoint_without_a_progress_map_keeps_the_step_its_writer_gave_and_none_yet(
    tmp_path: Path,
) -> None:
    store = afk.Store(tmp_path / "store")
    with store.create("plain") as writer:
        writer.checkpoint("epoch", {"loss": 0.5}, step=0)
        writer.checkpoint("epoch", {"loss": 0.25}, step=7)
    store.create("empty").close()
    with served(store.root) as s:
        _, _, first = s.get("/runs/plain/checkpoints/1")
        _, _, second = s.get("/runs/plain/checkpoints/2")
        _, _, empty = s.get("/runs/empty")
    assert 'id="position">step 0</dd>' in first
    assert 'id="position">step 7</dd>' in second
    assert 'id="position">none yet</dd>' in empty  # a run with no checkpoint yet


def test_tags_are_shown_escaped(tmp_path: Path) -> None:
    """A tag value is data: it is shown escaped, never as markup."""
    store = afk.Store(tmp_path / "store")
    outside = tmp_path / "o.txt"
    cli_jobs.count_job.with_store(store).run(
        1, str(outside), run_id="x", tags={"note": "<script>alert(1)</script>"}
    )
    with served(store.root) as s:
        _, _, page = s.get("/")
        assert "<script>alert" not in page and "&lt;script&gt;" in page
        assert 'data-run="x"' in page


def test_fork_and_restart_from_the_page_make_new_runs(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    ui_server.metric_job.with_store(store).run(3, run_id="fit")
    at = store.open("fit").checkpoint_files()[1].seq
    with served(store.root) as s:
        csrf = csrf_of(s.get(f"/runs/fit/checkpoints/{at}")[2])
        status, headers, _ = s.post("/runs/fit/fork", {"csrf": csrf, "seq": str(at)})
        assert status == 303
        forked = headers["location"].split("?")[0].removeprefix("/runs/")
        assert store.read_meta(forked).parent_run_id == "fit"
        assert store.open(forked).latest().seq == at
        status, headers, _ = s.post("/runs/fit/restart", {"csrf": csrf})
        assert status == 303
        fresh = headers["location"].split("?")[0].removeprefix("/runs/")
        meta = store.read_meta(fresh)
        assert meta.status is afk.RunStatus.CREATED
        assert (
            meta.extra["restarted_from"] == "fit" and meta.params == store.read_meta("fit").params
        )
        status, _, page = s.get(headers["location"])
        assert status == 200
        assert 'http-equiv="refresh"' in page  # created: a watcher starts it, the page follows
        assert 'http-equiv="refresh"' not in s.get(f"/runs/{fresh}?follow=0")[2]
        assert 'http-equiv="refresh"' not in s.get("/runs/fit")[2]  # completed: nothing to follow


def _in_doubt_run(store: afk.Store, outside: Path, run_id: str) -> None:
    """A run SIGKILLed inside its charge: the effect is in doubt (a real crash)."""
    env = {"PYTHONPATH": str(SUPPORT), "CLI_JOBS_DIE_IN_STEP": "1"}
    crash = proc.run(ui_server.CRASH_IN_STEP, str(store.root), str(outside), run_id, env=env)
    assert crash.returncode == -9, crash.stderr


def test_a_settlement_can_be_undone_from_the_page_until_a_resume_starts(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    outside = tmp_path / "outside.txt"
    _in_doubt_run(store, outside, "pay")
    undo_form = 'action="/runs/pay/unsettle"'
    with served(store.root) as s:
        page = s.get("/runs/pay")[2]
        assert "IN DOUBT" in page and undo_form not in page  # nothing settled yet
        key = store.open("pay").effects()[-1].key
        csrf = csrf_of(page)
        settled = {"csrf": csrf, "key": key, "outcome": "done", "result": '"r-1"'}
        assert s.post("/runs/pay/settle", settled)[0] == 303
        page = s.get("/runs/pay")[2]
        assert "IN DOUBT" not in page and undo_form in page
        status, headers, _ = s.post("/runs/pay/unsettle", {"csrf": csrf, "key": key})
        assert status == 303 and "undone" in said(s, headers)
        last = store.open("pay").effects()[-1]
        assert (last.kind, last.reopened) == ("intent", True)  # what `settle --undo` writes
        page = s.get("/runs/pay")[2]
        assert "IN DOUBT" in page and undo_form not in page
        status, headers, _ = s.post("/runs/pay/unsettle", {"csrf": csrf, "key": key})
        assert status == 303 and "in doubt already" in said(s, headers)
        assert s.post("/runs/pay/settle", settled)[0] == 303
        resumed = proc.python(
            ["-m", "afk_local", "--root", str(store.root), "resume", "pay"], env=ENV, timeout=120
        )
        assert resumed.returncode == 0, resumed.stderr
        page = s.get("/runs/pay")[2]
        assert undo_form not in page  # a resume used the settlement: it stands
        status, headers, _ = s.post("/runs/pay/unsettle", {"csrf": csrf, "key": key})
        assert status == 303 and "a resume has started" in said(s, headers)
    assert store.open("pay").effects()[-1].kind == "outcome"
    assert outside.read_text().count("charged 5") == 1  # the crashed call; never again


def test_the_run_page_shows_the_end_of_each_attempt_log_escaped(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    with pytest.raises(RuntimeError):
        ui_server.failing_job.with_store(store).run("boom", run_id="broken")
    logs = store.paths("broken").dir / "logs"
    logs.mkdir(mode=0o700)
    (logs / "attempt-1.log").write_text("# attempt 1\n<script>alert(1)</script>\n")
    big = "".join(f"line {i:06d} of a chatty attempt\n" for i in range(20_000))  # ~620 KB
    (logs / "attempt-2.log").write_text(big)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a log: never shown\n")
    (logs / "attempt-3.log").symlink_to(secret)
    (logs / "notes.txt").write_text("not an attempt log\n")
    with served(store.root) as s:
        status, _, page = s.get("/runs/broken")
    assert status == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "line 019999 of a chatty attempt" in page  # the end of the big log
    assert "line 000000 " not in page and "its end shown" in page  # bounded
    assert len(page) < len(big)
    assert "never shown" not in page and "cannot read" in page  # a link is not followed
    assert "not an attempt log" not in page
    order = [page.index(f'data-attempt="{n}"') for n in (3, 2, 1)]
    assert order == sorted(order)  # newest first


def test_fork_from_the_page_sets_values_by_the_cli_rules(tmp_path: Path) -> None:
    """The fork form's PATH=JSON lines are read as `fork --set` reads them; whatever the
    CLI refuses the page refuses with its reason, and nothing is created."""
    store = afk.Store(tmp_path / "store")
    outside = tmp_path / "outside.txt"
    cli_jobs.count_job.with_store(store).run(3, str(outside), run_id="count")
    reader = store.open("count")
    at = next(
        c for c in reader.history() if c.phase == "runtime_state" and c.payload["state"]["total"]
    )
    with served(store.root) as s:
        page = s.get("/runs/count")[2]
        assert 'action="/runs/count/fork"' in page and 'name="set"' in page
        csrf = csrf_of(page)
        base = {"csrf": csrf, "seq": str(at.seq)}
        for form, reason in (
            ({"set": "state.total"}, "PATH=JSON"),
            ({"set": "state.total=ten"}, "the value of state.total is not JSON"),
            ({"set": "state.nope.deeper=1"}, "no 'nope' in payload.state"),
            ({"set": "state.total=1", "as": "../x"}, "invalid run id"),
            ({"set": "state.total=1", "as": "count"}, "count"),
            ({"set": "state.total=1", "seq": "x"}, "which checkpoint"),
            ({"set": "state.total=1", "seq": "999"}, "999"),
        ):
            status, headers, _ = s.post("/runs/count/fork", {**base, **form})
            assert status == 303, form
            assert reason in said(s, headers), (form, said(s, headers))
        assert store.run_ids() == ["count"]  # nothing was created by a refused fork
        form = {**base, "as": "what-if", "set": 'state.total = 1000\r\n\r\nstate.note="edited"\r\n'}
        status, headers, _ = s.post("/runs/count/fork", form)
        assert status == 303 and headers["location"].startswith("/runs/what-if?said=")
        assert "state.note, state.total set" in said(s, headers)
    edited = store.open("what-if").latest()
    assert edited is not None and edited.seq == at.seq + 1
    assert edited.payload["state"] == {"total": 1000, "note": "edited"}
    assert store.read_meta("what-if").extra["updated_paths"] == ["state.note", "state.total"]
    remaining = reader.resume_state().result - at.payload["state"]["total"]
    assert afk.resume("what-if", store=store) == 1000 + remaining


def test_the_timeline_shows_attempts_pauses_answers_and_sleeps(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    with pytest.raises(afk.RunPaused):
        ui_server.wait_job.with_store(store).run(5, run_id="waits")
    with pytest.raises(afk.RunSleeping):
        afk.resume("waits", store=store, input=True)  # answered, then parked for an hour
    with served(store.root) as s:
        status, _, page = s.get("/runs/waits")
    assert status == 200
    rows = re.findall(r'<tr class="ev-(\w+)">.*?</tr>', page, re.S)
    assert rows.count("attempt") == 2
    assert rows.count("pause") == 1 and rows.count("answer") == 1
    assert rows.count("sleep") == 3  # a short sleep, the long one, and the park
    assert "attempt started (a resume)" in page and "paused: waits for input" in page
    assert "parked until" in page and 'id="wakes"' in page
    assert rows.index("pause") > rows.index("answer")  # newest first
    assert "@pause" not in re.search(r'<table id="timeline">.*?</table>', page, re.S).group(0)


def test_resume_from_the_page_hands_a_failed_run_to_the_watcher(tmp_path: Path) -> None:
    """A failed run is not retried by a watcher on its own; the page's Resume asks one to."""
    store = afk.Store(tmp_path / "store")
    charges, flag = tmp_path / "charges.txt", tmp_path / "flag"
    with pytest.raises(RuntimeError):
        cli_jobs.charges_then_failure.with_store(store).run(str(charges), str(flag), run_id="f")
    with served(store.root) as s:
        page = s.get("/runs/f")[2]
        assert 'action="/runs/f/resume"' in page
        status, headers, _ = s.post("/runs/f/resume", {"csrf": csrf_of(page)})
        assert status == 303 and "resume handed to the watcher" in said(s, headers)
    assert len(list(store.requests_dir.glob("*.json"))) == 1
    watch = proc.python(
        ["-m", "afk_local", "watch", "--root", str(store.root), "--once", *FAST],
        env=ENV,
        timeout=120,
    )
    assert watch.returncode == 0, watch.stderr
    assert store.read_meta("f").status is afk.RunStatus.COMPLETED
    assert charges.read_text().count("charge") == 4  # the retry replayed the four charges


def test_the_age_filter_keeps_the_runs_updated_within_it_and_pages_link(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    outside = tmp_path / "outside.txt"
    with skipping_clock(start=time.time() - 3 * 86400):  # a run last updated 3 days ago
        cli_jobs.count_job.with_store(store).run(1, str(outside), run_id="old")
    for i in range(2):
        cli_jobs.count_job.with_store(store).run(1, str(outside), run_id=f"new-{i}")
    with served(store.root) as s:
        _, _, page = s.get("/?since=1d")
        assert 'data-run="new-0"' in page and 'data-run="new-1"' in page
        assert 'data-run="old"' not in page
        _, _, page = s.get("/?since=4d")
        assert 'data-run="old"' in page
        _, _, first = s.get("/?per=2")
        assert first.count("data-run=") == 2 and 'rel="next" href="/?page=2&amp;per=2"' in first
        _, _, second = s.get("/?per=2&page=2")
        assert second.count("data-run=") == 1 and 'rel="prev"' in second
        assert 'rel="next"' not in second


def test_open_hands_the_url_with_its_token_to_the_web_browser(tmp_path: Path) -> None:
    """--open calls the user's browser (Python's webbrowser, here $BROWSER) with the URL."""
    store = afk.Store(tmp_path / "store")
    cli_jobs.count_job.with_store(store).run(1, str(tmp_path / "outside.txt"), run_id="one")
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {opened}.tmp && mv {opened}.tmp {opened}\n')
    browser.chmod(0o700)
    with served(store.root, "--open", env={**ENV, "BROWSER": str(browser)}) as s:
        deadline = time.monotonic() + 60
        while not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert opened.read_text() == s.url
        status, headers, _ = s.get(urlsplit(s.url).path + "?" + urlsplit(s.url).query, token=False)
        assert status == 303 and s.token in headers["set-cookie"]
        status, _, page = s.get(headers["location"])
        assert status == 200 and 'data-run="one"' in page


def test_the_store_page_says_what_gc_would_remove_and_what_verify_finds(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    ui_server.metric_job.with_store(store).run(12, run_id="long")  # more states than gc keeps
    ui_server.metric_job.with_store(store).run(2, run_id="hurt")
    damaged = sorted(store.paths("hurt").dir.glob("*.ckpt"))[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    files = sorted(store.paths("long").dir.iterdir())
    with served(store.root) as s:
        page = store_figures(s)
        checked = store_figures(s, "?verify=1")
    gc = store.gc(dry_run=True)
    deleted = next(c for c in gc.to_dict()["compacted"] if c["run_id"] == "long")["deleted_files"]
    assert deleted > 0
    assert f"long</a>: {deleted} file(s) deleted" in page
    assert 'id="verify"' not in page and "Verify every file" in page  # only on request
    hurt = re.search(
        r'<tr class="problem"><td class="id"><a href="/runs/hurt">.*?</tr>', checked, re.S
    )
    assert hurt is not None and damaged.name in hurt.group(0)
    assert "2 run(s) verified: 1 with problems" in checked
    assert 'href="/runs/long"' not in checked.split('id="verify"')[1]  # only runs with problems
    assert sorted(store.run_ids()) == ["hurt", "long"]
    assert sorted(store.paths("long").dir.iterdir()) == files  # the page's gc is a dry run


def test_a_slow_page_stops_reading_the_store_once_its_client_went(store, tmp_path: Path) -> None:
    # A real server whose every read of a run waits for the file gates/go: the page
    # `?since=1h` reads each run, so it stays inside its first read until the test says.
    gates = tmp_path / "gates"
    gates.mkdir()
    command = [sys.executable, str(SUPPORT / "ui_gated_store.py"), str(store.root), str(gates)]
    with ui_server.served_by(command) as server:
        logged = _lines_of(server.process)
        client = socket.create_connection((server.host, server.port))
        client.sendall(
            f"GET /?since=1h HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
            f"Cookie: {server.cookie_name}={server.token}\r\n\r\n".encode()
        )
        _wait_for(lambda: (gates / "read").exists(), "the page's first read of a run")
        client.close()  # the browser gave up
        _wait_for(lambda: "ui: the client of / went" in logged, "the server saw it go")
        (gates / "go").touch()
        stopped = "ui: a page's client went: its work stops before store.info"
        read = lambda: (gates / "read").read_text().split()  # noqa: E731
        _wait_for(lambda: stopped in logged or len(read()) > 1, "stop and no second read")
        assert stopped in logged
        assert len(read()) == 1  # one run read of the five: it stopped at its next read
        status, _, page = server.get("/?since=1h")  # and the server serves on
        assert status == 200 and page.count("<tr data-run=") == 5


def _lines_of(process: subprocess.Popen[str]) -> list[str]:
    """The lines ``process`` writes to its stderr, as they come (read on a thread)."""
    lines: list[str] = []

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line.strip())

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in 60 s"
        time.sleep(0.02)
