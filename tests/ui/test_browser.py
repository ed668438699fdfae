"""``afk-local ui`` in a real headless Chromium (Playwright, the system's browser).

One browser for the module, one server on one store: the page lists the runs,
filters them, follows a run that progresses without a reload, is usable with the
keyboard, and settles an effect a SIGKILL left in doubt, after which the resumed
run replays the answer given on the page. With ``AFK_LOCAL_UI_SCREENSHOTS=DIR``
the tests also save the screenshots docs/ui.md shows.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit

import cli_jobs
import proc
import pytest
import ui_server
from proc import SUPPORT
from ui_server import CRASH_IN_STEP, ENV, other_address, served, wait_for_run

import afk_local as afk

pytest.importorskip("starlette", reason="afk_local[ui] is not installed (starlette)")
pytest.importorskip("uvicorn", reason="afk_local[ui] is not installed (uvicorn)")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the test-all extra)"
)

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
WAIT_MS = 15_000
"""How long a test waits for the page to show something (the page polls every second)."""
sync_api.expect.set_options(timeout=WAIT_MS)


def _chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    if executable is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium; .ci/run does)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A store with finished, failed, tagged, in-doubt and progressing runs, and its server."""
    base = tmp_path_factory.mktemp("ui-browser")
    root, outside, gates = base / "store", base / "outside.txt", base / "gates"
    gates.mkdir()
    store = afk.Store(root)
    for i, model in enumerate(("small", "large")):
        cli_jobs.count_job.with_store(store).run(
            3, str(base / "count.txt"), run_id=f"train-{model}", tags={"model": model}
        )
    with pytest.raises(RuntimeError):
        ui_server.failing_job.with_store(store).run("the API said 500", run_id="nightly")
    ui_server.metric_job.with_store(store).run(20, run_id="fit")
    os.symlink(store.paths("train-small").dir, root / "runs" / "linked")  # refused: a 4xx
    crash = proc.run(
        CRASH_IN_STEP,
        str(root),
        str(outside),
        "pay",
        env={"PYTHONPATH": str(SUPPORT), "CLI_JOBS_DIE_IN_STEP": "1"},
    )
    assert crash.returncode == -9, crash.stderr  # killed inside the charge: in doubt
    followed = {name: base / f"gates-{name}" for name in ("followed", "polled", "nojs")}
    for folder in followed.values():
        folder.mkdir()
    gated = [proc.spawn(ui_server.GATED, str(root), "3", str(gates), "gated", env=ENV)]
    gated += [
        proc.spawn(ui_server.GATED, str(root), "2", str(folder), name, env=ENV)
        for name, folder in followed.items()
    ]
    try:
        with served(root) as server:
            yield {
                "store": store,
                "server": server,
                "gates": gates,
                "run_gates": followed["followed"],
                "followed": followed,
                "outside": outside,
            }
    finally:
        for folder in (gates, *followed.values()):
            for i in range(3):
                (folder / f"go{i}").touch()
        for process in gated:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def page(browser, world):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    tab.goto(world["server"].url)
    yield tab
    context.close()


def _shot(page, name: str) -> None:
    folder = os.environ.get("AFK_LOCAL_UI_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def _row(page, run_id: str):
    return page.locator(f'#runs-body tr[data-run="{run_id}"]')


def test_the_runs_page_lists_the_store_runs(page) -> None:
    expect = sync_api.expect
    for run_id in ("train-small", "train-large", "nightly", "fit", "pay", "gated"):
        expect(_row(page, run_id)).to_have_count(1)
    expect(_row(page, "nightly").locator(".status")).to_have_text("failed")
    expect(_row(page, "train-small")).to_contain_text("model=small")
    expect(_row(page, "pay").locator(".status")).to_contain_text("interrupted")
    _shot(page, "ui-runs.png")


def test_filters_choose_runs(page) -> None:
    expect = sync_api.expect
    page.select_option("select[name=status]", "failed")
    page.click("button[type=submit]")
    expect(_row(page, "nightly")).to_have_count(1)
    expect(page.locator("#runs-body tr")).to_have_count(1)
    page.fill("input[name=tag]", "model=large")
    page.select_option("select[name=status]", "")
    page.click("button[type=submit]")
    expect(page.locator("#runs-body tr")).to_have_count(1)
    expect(_row(page, "train-large")).to_have_count(1)


def _paths(page) -> list[str]:
    """Every path the page requests from now on (appended as it asks)."""
    seen: list[str] = []
    page.on("request", lambda request: seen.append(urlsplit(request.url).path))
    return seen


def test_a_run_that_progresses_updates_without_a_reload_or_polling(page, world) -> None:
    expect = sync_api.expect
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.goto(world["server"].base + "/")  # the token is in the cookie now
    progress = _row(page, "gated").locator(".progress-text")
    expect(progress).not_to_contain_text("1/3")
    page.evaluate("window.sameDocument = true")
    (world["gates"] / "go0").touch()
    expect(progress).to_contain_text("1/3")
    (world["gates"] / "go1").touch()
    expect(progress).to_contain_text("2/3")
    assert page.evaluate("window.sameDocument === true")  # no navigation happened
    rows = [urlsplit(url).query for url in asked if urlsplit(url).path == "/runs/rows"]
    # Its row alone, when it changed; and the whole page's rows once per load of the page
    # (the fixture's and this test's), when it starts listening: what changed before.
    assert "ids=gated" in rows and rows.count("") <= 2
    assert set(rows) <= {"ids=gated", ""}
    assert {urlsplit(url).path for url in asked} <= {
        "/",
        "/static/ui.css",
        "/static/ui.js",
        "/static/events.js",
        "/events",
        "/runs/rows",
    }


def test_without_event_source_the_runs_page_polls(browser, world) -> None:
    context = browser.new_context()
    try:
        context.add_init_script("delete window.EventSource;")
        tab = context.new_page()
        tab.goto(world["server"].url)
        with tab.expect_request(lambda r: urlsplit(r.url).path == "/runs/rows"):
            pass
        sync_api.expect(_row(tab, "nightly")).to_have_count(1)
    finally:
        context.close()


def test_a_run_page_follows_its_run_without_a_reload(page, world) -> None:
    expect = sync_api.expect
    page.goto(world["server"].base + "/runs/followed")
    asked = _paths(page)  # from now on (the runs page before it had its own requests)
    facts = page.locator("#live-facts")
    expect(facts).not_to_contain_text("1/2")
    page.evaluate("window.sameDocument = true")
    (world["run_gates"] / "go0").touch()
    expect(facts).to_contain_text("1/2")
    (world["run_gates"] / "go1").touch()
    expect(page.locator("#run-status")).to_have_text("completed")
    assert page.evaluate("window.sameDocument === true")
    events, fetches = page.evaluate("[window.afkRunEvents, window.afkRunFetches]")
    assert 1 <= fetches <= events  # one fetch per change it was told of, no polling
    assert "/runs/rows" not in asked


def test_the_runs_table_is_usable_with_the_keyboard(page) -> None:
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('run-link')"):
            break
    else:
        pytest.fail("Tab never reached a run")
    first = page.evaluate("document.activeElement.textContent")
    page.keyboard.press("ArrowDown")
    second = page.evaluate("document.activeElement.textContent")
    assert second != first
    page.keyboard.press("ArrowUp")
    assert page.evaluate("document.activeElement.textContent") == first
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/runs/{second}")
    sync_api.expect(page.locator("h1")).to_contain_text(second)


def test_settling_an_in_doubt_effect_from_the_page_is_replayed_by_the_resume(page, world) -> None:
    expect = sync_api.expect
    store: afk.Store = world["store"]
    page.click('#runs-body a.run-link:text-is("pay")')
    expect(page.locator("#effects .doubt")).to_have_text("IN DOUBT")
    expect(page.locator("#needs")).to_contain_text("1 effect(s) in doubt")  # not just "running"
    _shot(page, "ui-in-doubt.png")
    form = page.locator("form.settle")
    form.get_by_label("It happened").check()
    form.get_by_label("Its result (JSON)").fill('"receipt-from-the-bank"')
    form.get_by_role("button", name="Settle").click()
    expect(page.locator(".notice")).to_contain_text("settled as done")
    expect(page.locator("#effects .doubt")).to_have_count(0)
    page.get_by_role("button", name="Undo the settlement").click()  # a wrong answer
    expect(page.locator(".notice")).to_contain_text("in doubt again")
    expect(page.locator("#effects .doubt")).to_have_text("IN DOUBT")
    expect(page.locator("form.undo")).to_have_count(0)
    form = page.locator("form.settle")
    form.get_by_label("It happened").check()
    form.get_by_label("Its result (JSON)").fill('"receipt-from-the-bank"')
    form.get_by_role("button", name="Settle").click()
    expect(page.locator(".notice")).to_contain_text("settled as done")
    last = store.open("pay").effects()[-1]
    assert (last.kind, last.status, last.result) == ("outcome", "ok", "receipt-from-the-bank")
    assert last.settled_attempt >= 1
    resumed = proc.python(
        ["-m", "afk_local", "--root", str(store.root), "resume", "pay", "--json"],
        env=ENV,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"] == {"receipt": "receipt-from-the-bank"}
    assert world["outside"].read_text().count("charged 5") == 1  # never charged again
    page.reload()
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("form.undo")).to_have_count(0)  # a resume used it: it stands


def test_a_run_page_shows_metric_charts(page) -> None:
    page.click('#runs-body a.run-link:text-is("fit")')
    sync_api.expect(page.locator("figure.chart svg")).to_have_count(1)
    sync_api.expect(page.locator("figcaption")).to_contain_text("loss: 20 points")
    _shot(page, "ui-run.png")


def test_a_narrow_window_scrolls_the_table_not_the_page(browser, world) -> None:
    context = browser.new_context(viewport={"width": 360, "height": 700})
    try:
        tab = context.new_page()
        tab.goto(world["server"].url)
        sync_api.expect(_row(tab, "nightly")).to_have_count(1)
        assert tab.evaluate("document.documentElement.scrollWidth") <= 360
        tab.goto(world["server"].base + "/runs/pay")
        assert tab.evaluate("document.documentElement.scrollWidth") <= 360
        _shot(tab, "ui-narrow.png")
    finally:
        context.close()


def test_answering_a_pause_from_the_page_resumes_the_run(browser, tmp_path: Path) -> None:
    """A run waiting for input, answered through the page's form in the browser; a running
    watcher (here one sweep of it) continues the run with that answer."""
    expect = sync_api.expect
    store = afk.Store(tmp_path / "store")
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("ship it?", run_id="ask")
    with served(store.root) as server:
        context = browser.new_context(viewport={"width": 1100, "height": 800})
        try:
            tab = context.new_page()
            tab.set_default_timeout(WAIT_MS)
            tab.goto(server.url)
            tab.click('#runs-body a.run-link:text-is("ask")')
            expect(tab.locator("#pause-h")).to_contain_text("Waiting for")
            tab.get_by_label("Answer (JSON)").fill('{"ok": true}')
            tab.get_by_role("button", name="Send answer").click()
            expect(tab.locator(".notice")).to_be_visible()
        finally:
            context.close()
    assert len(list(store.requests_dir.glob("*.json"))) == 1  # the request the watcher takes
    watch = proc.python(
        [
            "-m",
            "afk_local",
            "watch",
            "--root",
            str(store.root),
            "--once",
            "--interval",
            "0.2",
            "--backoff",
            "0.2",
            "--grace",
            "10",
        ],
        env=ENV,
        timeout=120,
    )
    assert watch.returncode == 0, watch.stderr
    assert store.read_meta("ask").status is afk.RunStatus.COMPLETED
    assert store.open("ask").resume_state().result == {
        "question": "ship it?",
        "answer": {"ok": True},
    }


def test_without_event_source_a_run_page_polls_its_run(browser, world) -> None:
    expect = sync_api.expect
    wait_for_run(world["store"], "polled")
    context = browser.new_context()
    try:
        context.add_init_script("delete window.EventSource;")
        tab = context.new_page()
        tab.set_default_timeout(WAIT_MS)
        asked = _paths(tab)
        tab.goto(world["server"].url)
        tab.goto(world["server"].base + "/runs/polled")
        facts = tab.locator("#live-facts")
        expect(facts).not_to_contain_text("1/2")
        tab.evaluate("window.sameDocument = true")
        (world["followed"]["polled"] / "go0").touch()
        expect(facts).to_contain_text("1/2")
        (world["followed"]["polled"] / "go1").touch()
        expect(tab.locator("#run-status")).to_have_text("completed")
        assert tab.evaluate("window.sameDocument === true")  # swapped in, never reloaded
        assert "/events" not in asked
        assert asked.count("/runs/polled") >= 2  # the page, then its polls
    finally:
        context.close()


def test_without_javascript_lists_read_and_a_running_run_page_reloads(browser, world) -> None:
    """JavaScript off: the runs table and its filters work as plain HTML, and the page of
    a run that runs reloads itself (a <noscript> refresh) until the run ends."""
    expect = sync_api.expect
    wait_for_run(world["store"], "nojs")
    context = browser.new_context(java_script_enabled=False)
    try:
        tab = context.new_page()
        tab.set_default_timeout(WAIT_MS)
        tab.goto(world["server"].url)
        expect(_row(tab, "nightly")).to_have_count(1)
        tab.select_option("select[name=status]", "failed")
        tab.click("form.filters button[type=submit]")
        expect(tab.locator("#runs-body tr")).to_have_count(1)
        tab.goto(world["server"].base + "/runs/nojs")
        reload = tab.locator('meta[http-equiv="refresh"]')
        expect(reload).to_have_count(1)
        facts = tab.locator("#live-facts")
        expect(facts).not_to_contain_text("1/2")
        (world["followed"]["nojs"] / "go0").touch()
        expect(facts).to_contain_text("1/2")
        (world["followed"]["nojs"] / "go1").touch()
        expect(tab.locator("#run-status")).to_have_text("completed")
        expect(reload).to_have_count(0)  # an ended run's page stays put
        tab.goto(world["server"].base + "/runs/nightly")  # failed: waits for a person
        expect(tab.locator("#run-status")).to_have_text("failed")
        expect(reload).to_have_count(0)
    finally:
        context.close()


def test_forking_from_the_page_with_a_changed_value(page, world) -> None:
    """The fork form on a checkpoint's page sets a value in the fork's state; the new run's
    page shows the edited checkpoint and a resume continues from the value given."""
    expect = sync_api.expect
    store: afk.Store = world["store"]
    source = store.open("train-small")
    at = next(
        c for c in source.history() if c.phase == "runtime_state" and c.payload["state"]["total"]
    )
    page.goto(world["server"].base + "/runs/train-small")
    form = page.locator("form.fork")
    form.get_by_label("From checkpoint").fill(str(at.seq))
    form.get_by_label("Set values").fill("state.total=ten")
    form.get_by_role("button", name="Fork").click()
    expect(page.locator(".problem")).to_contain_text("the value of state.total is not JSON")
    page.goto(f"{world['server'].base}/runs/train-small/checkpoints/{at.seq}")
    form = page.locator("form.fork")
    form.get_by_label("New run id").fill("train-what-if")
    form.get_by_label("Set values").fill("state.total=1000")
    form.get_by_role("button", name="Fork").click()
    expect(page.locator("h1")).to_contain_text("train-what-if")
    expect(page.locator(".notice")).to_contain_text("state.total set")
    page.click(f'#timeline a[href$="/checkpoints/{at.seq + 1}"]')
    expect(page.locator("#payload")).to_contain_text('"total": 1000')
    resumed = proc.python(
        ["-m", "afk_local", "--root", str(store.root), "resume", "train-what-if", "--json"],
        env=ENV,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    remaining = source.resume_state().result - at.payload["state"]["total"]
    assert json.loads(resumed.stdout)["result"] == 1000 + remaining
    page.goto(world["server"].base + "/runs/train-what-if")
    expect(page.locator("#run-status")).to_have_text("completed")


def test_a_page_without_the_token_is_refused_in_the_browser(browser, world) -> None:
    context = browser.new_context()
    try:
        tab = context.new_page()
        for url in ("/", "/runs/nightly", "/?token=not-the-token"):
            answer = tab.goto(world["server"].base + url)
            assert answer is not None and answer.status == 403, url
            sync_api.expect(tab.locator("body")).to_contain_text("no valid token")
    finally:
        context.close()


def test_the_browser_cannot_reach_the_server_on_another_interface(browser, world) -> None:
    address = other_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    context = browser.new_context()
    try:
        tab = context.new_page()
        with pytest.raises(sync_api.Error, match="ERR_CONNECTION_REFUSED"):
            tab.goto(f"http://{address}:{world['server'].port}/?token={world['server'].token}")
        answer = context.new_page().goto(world["server"].url)  # the tab shows an error page
        assert answer is not None and answer.status == 200
    finally:
        context.close()


def test_read_only_refuses_every_action_in_the_browser(browser, tmp_path: Path) -> None:
    """Under --read-only the page has no forms, and a POST the page's own script makes
    (same origin, with the token's cookie) is refused for every action."""
    expect = sync_api.expect
    store = afk.Store(tmp_path / "store")
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("ship it?", run_id="ask")
    with served(store.root, "--read-only") as server:
        context = browser.new_context()
        try:
            tab = context.new_page()
            tab.set_default_timeout(WAIT_MS)
            tab.goto(server.url)
            expect(tab.locator(".badge")).to_have_text("read-only")
            tab.click('#runs-body a.run-link:text-is("ask")')
            expect(tab.locator("#pause-h")).to_contain_text("Waiting for")
            expect(tab.locator("form[method=post]")).to_have_count(0)
            for action in ("answer", "resume", "cancel", "settle", "unsettle", "restart", "fork"):
                status, text = tab.evaluate(
                    """async (action) => {
                        const answer = await fetch(`/runs/ask/${action}`, {
                            method: "POST",
                            body: new URLSearchParams({answer: "true", pause_seq: "1", seq: "1"}),
                        });
                        return [answer.status, await answer.text()];
                    }""",
                    action,
                )
                assert status == 403 and "read-only" in text, action
        finally:
            context.close()
    assert store.read_meta("ask").status is afk.RunStatus.PAUSED
    assert store.run_ids() == ["ask"]
    assert not store.requests_dir.exists() or not list(store.requests_dir.iterdir())


def test_a_run_page_is_usable_with_the_keyboard(page, world) -> None:
    """Keys only, from the skip link to an action: fork the run with a value set."""
    page.goto(world["server"].base + "/runs/fit")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.classList.contains('skip')")
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.name === 'set'"):
            break
    else:
        pytest.fail("Tab never reached the fork form")
    page.keyboard.type("state.by_keyboard=true")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Fork"
    page.keyboard.press("Enter")
    sync_api.expect(page.locator(".notice")).to_contain_text("state.by_keyboard set")
    forked = page.url.split("/runs/")[1].split("?")[0]
    state = world["store"].open(forked).latest().payload["state"]
    assert state["by_keyboard"] is True


def test_a_page_on_another_port_of_127_0_0_1_receives_no_ui_credential(browser, world) -> None:
    """Browsers send a host's cookies to all its ports: a server of the page's own
    address keeps the token from a local web server the user visits next."""
    seen: list[str] = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Cookie") or "")  # the page and its favicon
            body = b"<!doctype html><title>another local server</title>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(world["server"].url)  # the page's cookie is set
        sync_api.expect(_row(tab, "nightly")).to_have_count(1)
        tab.goto(f"http://127.0.0.1:{other.server_address[1]}/")
        tab.goto(f"http://localhost:{other.server_address[1]}/")
        assert len(seen) >= 2
        assert all(world["server"].token not in cookie for cookie in seen), seen
        assert all("afk_local_ui" not in cookie for cookie in seen), seen
    finally:
        context.close()
        other.shutdown()
        other.server_close()


def test_the_token_leaves_the_address_bar_after_the_first_load(browser, world) -> None:
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(world["server"].url + "&status=failed")
        sync_api.expect(_row(tab, "nightly")).to_have_count(1)
        assert "token" not in tab.url and world["server"].token not in tab.url
        assert urlsplit(tab.url).query == "status=failed"  # the rest of the address kept
        tab.go_back()
        assert world["server"].token not in tab.url  # nor in the history
    finally:
        context.close()


def test_a_symlinked_run_answers_4xx_in_the_browser(page, world) -> None:
    answer = page.goto(world["server"].base + "/runs/linked")
    assert answer is not None and 400 <= answer.status < 500
    assert answer.headers["x-frame-options"] == "DENY"
    sync_api.expect(page.locator("main")).to_contain_text("symlink")


def test_a_failed_run_shows_its_innermost_frame_and_a_completed_run_its_result(page, world) -> None:
    expect = sync_api.expect
    page.goto(world["server"].base + "/runs/nightly")
    innermost = page.locator("#innermost")
    expect(innermost).to_be_visible()
    expect(innermost).to_contain_text("in failing_job")
    expect(innermost).to_contain_text("raise RuntimeError(why)")
    _shot(page, "ui-failed.png")
    page.emulate_media(color_scheme="dark")  # the system's dark mode: the page follows
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(22, 24, 28)"
    _shot(page, "ui-dark.png")
    page.emulate_media(color_scheme="light")
    page.goto(world["server"].base + "/runs/train-small")
    expect(page.locator("#result pre")).to_have_text("5")  # 0 + 1 + 4
    page.goto(world["server"].base + "/")
    expect(page.locator("#needs-you")).to_contain_text("nightly")
    expect(_row(page, "nightly").locator("td.nowrap").first).to_have_css("white-space", "nowrap")


def test_eight_tabs_load_and_each_follows_its_run(browser, tmp_path: Path) -> None:
    """Browsers open six connections to a host at most: one event stream per tab left
    the seventh tab loading forever. The tabs share one stream."""
    expect = sync_api.expect
    store = afk.Store(tmp_path / "store")
    runs = [f"tab{i}" for i in range(8)]
    for run_id in runs:
        with pytest.raises(afk.RunPaused):
            cli_jobs.ask_job.with_store(store).run(run_id, run_id=run_id)
    with served(store.root) as server:
        context = browser.new_context()
        try:
            first = context.new_page()
            first.goto(server.url)
            tabs = []
            for run_id in runs:
                tab = context.new_page()
                tab.set_default_timeout(WAIT_MS)
                tab.goto(f"{server.base}/runs/{run_id}")
                expect(tab.locator("#run-status")).to_have_text("paused")
                tab.evaluate("window.sameDocument = true")
                tabs.append(tab)
            for run_id in runs:
                afk.cancel(run_id, store=store, reason="from the test")
            for tab in tabs:
                expect(tab.locator("#run-status")).to_have_text("cancelled")
                assert tab.evaluate("window.sameDocument === true")  # followed, not reloaded
        finally:
            context.close()
