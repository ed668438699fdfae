"""A real ``afk-local ui`` server process for the ui tests, and the jobs they watch.

:func:`served` starts ``python -m afk_local ui --port 0`` on a store, reads the URL
it prints (port and token) and always stops it (SIGTERM, then SIGKILL). The jobs
are importable as ``ui_server:...`` by the children that run them.
"""

from __future__ import annotations

import html
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import proc
from proc import REPO, SUPPORT

import afk_local as afk
from afk_local.runner.run.durable_function import durable

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    ),
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class Served:
    """A running server: the URL it printed, split up."""

    url: str
    base: str
    token: str
    port: int
    process: subprocess.Popen[str]
    host: str = "127.0.0.1"
    """The loopback address the server chose for this launch."""

    @property
    def cookie_name(self) -> str:
        """The name of the cookie that carries the token."""
        return f"afk_local_ui_{self.port}"

    def get(self, path: str, *, token: bool = True, headers: dict[str, str] | None = None):
        """GET ``path`` (with ``?token=`` unless not ``token``): (status, headers, body)."""
        return request(self, "GET", path, token=token, headers=headers)

    def post(
        self,
        path: str,
        form: dict[str, str],
        *,
        token: bool = True,
        headers: dict[str, str] | None = None,
    ):
        """POST ``form`` (urlencoded) to ``path``; redirects are not followed."""
        return request(self, "POST", path, form=form, token=token, headers=headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def request(
    served: Served,
    method: str,
    path: str,
    *,
    form: dict[str, str] | None = None,
    token: bool = True,
    headers: dict[str, str] | None = None,
):
    """One HTTP request to ``served``: (status, headers, body text); never raises on 4xx/5xx.

    With ``token`` the request carries the token as the page's cookie (what a browser
    sends once the first URL traded it for one)."""
    url = served.base + path
    headers = dict(headers or {})
    if token:
        cookie = f"{served.cookie_name}={served.token}"
        headers["Cookie"] = f"{headers['Cookie']}; {cookie}" if "Cookie" in headers else cookie
    data = urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=60) as answer:
            return answer.status, answer.headers, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


@contextmanager
def served(root: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``afk-local --root ROOT ui --port 0 FLAGS`` running; stopped on exit, whatever happens."""
    command = [sys.executable, "-m", "afk_local", "--root", str(root), "ui", "--port", "0", *flags]
    with served_by(command, env=env) as server:
        yield server


@contextmanager
def served_by(command: list[str], *, env: dict[str, str] | None = None) -> Iterator[Served]:
    """A server process started by ``command``, which prints ``open: URL`` as ``afk-local
    ui`` does; stopped on exit, whatever happens."""
    process = proc.start(command, env=env or ENV)
    try:
        url = _printed_url(process)
        parts = urlsplit(url)
        token = parts.query.removeprefix("token=")
        assert parts.port is not None and parts.hostname is not None
        base = f"{parts.scheme}://{parts.netloc}"
        yield Served(url, base, token, parts.port, process, parts.hostname)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _printed_url(process: subprocess.Popen[str]) -> str:
    """The URL the server printed (read on a thread: a pipe read has no timeout)."""
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if not line:
            stderr = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"afk-local ui exited: {''.join(seen)}{stderr}")
        seen.append(line)
        found = re.search(r"open: (http://\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError(f"afk-local ui printed no URL in 60 s: {''.join(seen)}")


def other_address() -> str | None:
    """An address of this machine that is not loopback (None if it has none)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def wait_for_run(store: afk.Store, run_id: str) -> None:
    """Return once a child process has created ``run_id`` (fail after 60 s)."""
    deadline = time.monotonic() + 60
    while not store.exists(run_id):
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} was not created in 60 s")
        time.sleep(0.05)


def said(server: Served, headers) -> str:
    """What an action's redirect shows: the notice or problem on the page it names.

    The address names what was said by an id only (``?said=ID``): no page shows text
    taken from its address."""
    location = headers["location"]
    assert "?said=" in location and "notice" not in location, location
    status, _, page = server.get(location)
    assert status == 200, (location, status)
    shown = r'<p class="(?:notice|problem)" role="(?:status|alert)">(.*?)</p>'
    found = re.search(shown, page, re.S)
    assert found, f"{location} shows nothing said"
    return html.unescape(found.group(1))


def csrf_of(html: str) -> str:
    """The CSRF value in a page's forms."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no form"
    return found.group(1)


@durable
def gated_job(ctx: afk.RunContext, n: int, gates: str) -> int:
    """``n`` items; item ``i`` waits for the file ``gates/go<i>``: the test says when."""
    for item in ctx.iterate(range(n)):
        gate = Path(gates) / f"go{item}"
        while not gate.exists():
            time.sleep(0.02)
    return n


CRASH_IN_STEP = """
import sys
import cli_jobs
import afk_local as afk
cli_jobs.charge_job.with_store(afk.Store(sys.argv[1])).run(sys.argv[2], 5, run_id=sys.argv[3])
"""
"""Run ``charge_job`` as RUN (argv: root, outside file, run id); with
``CLI_JOBS_DIE_IN_STEP=1`` it is SIGKILLed inside the charge, leaving it in doubt."""

GATED = """
import sys
import afk_local as afk
import ui_server
ui_server.gated_job.with_store(afk.Store(sys.argv[1])).run(
    int(sys.argv[2]), sys.argv[3], run_id=sys.argv[4], tags={"kind": "gated"}
)
"""


@durable
def failing_job(ctx: afk.RunContext, why: str) -> None:
    """Fails at once: a failed run to list."""
    raise RuntimeError(why)


@durable
def metric_job(ctx: afk.RunContext, n: int) -> int:
    """Records a ``loss`` metric per step: a run with a chart."""
    for item in ctx.iterate(range(n)):
        ctx.metric("loss", 1.0 / (item + 1))
    return n


@durable
def wait_job(ctx: afk.RunContext, n: int) -> int:
    """Pauses for an answer at item 1, sleeps a moment at item 2 and an hour at item 3
    (the run parks, ``sleeping``): a timeline with attempts, a pause and sleeps."""
    for item in ctx.iterate(range(n), progress=False):
        if item == 1:
            ctx.pause({"question": "go on?"})
        elif item == 2:
            ctx.sleep(0.01)
        elif item == 3:
            ctx.sleep(3600)
    return n


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'
"""Markup a hostile store puts wherever it can: the page must show it as text."""


def _echo(value: str) -> str:
    return value


@durable
def hostile_job(ctx: afk.RunContext, text: str, big: str) -> None:
    """Puts ``text`` in every place a run can hold a string (state, a step's name and
    result, a metric's name, a pause's kind and prompt) and ``big`` in its state."""
    ctx.state[text] = text
    ctx.state["big"] = big
    ctx.step(text, _echo, text)
    ctx.metric(text, 1.0)
    ctx.checkpoint()
    ctx.pause({"question": text, "big": big}, kind=text)


@durable
def wide_job(ctx: afk.RunContext, metrics: int, keys: int) -> None:
    """``metrics`` metrics of one point each, and a state whose ``keys`` keys all change
    between its two checkpoints: more charts and diff paths than a page shows."""
    for i in range(metrics):
        ctx.metric(f"m{i:03d}", float(i))
    ctx.state.update({f"k{i:04d}": 0 for i in range(keys)})
    ctx.checkpoint()
    ctx.state.update({f"k{i:04d}": 1 for i in range(keys)})
    ctx.checkpoint()


@durable
def steps_job(ctx: afk.RunContext, n: int) -> None:
    """``n`` journaled steps."""
    for i in range(n):
        ctx.step(f"s{i}", _echo, str(i))


@durable
def items_job(ctx: afk.RunContext, n: int, steps_from: int) -> int:
    """``n`` loop items; only the items from ``steps_from`` on journal a step each, so
    the first checkpoints have items done and no journaled step."""
    for item in ctx.iterate(range(n), progress=False):
        if item >= steps_from:
            ctx.step("echo", _echo, str(item))
    return n
