"""The routes of ``afk-local ui``: pages rendered on the server, forms that POST.

Pages (GET): ``/`` the runs, ``/runs/rows`` the runs table's rows alone (what a page
without EventSource polls; ``?ids=A,B`` only those runs' rows, what a page fetches when
they changed), ``/events`` server-sent events: the ids of the runs that changed (one
stream a browser, its tabs share it through ``static/events.js``), ``/runs/RUN`` a run,
``/runs/RUN/checkpoints/SEQ`` one checkpoint, ``/runs/RUN/diff?a=SEQ&b=SEQ`` what
changed between two, ``/store`` the store, ``/static/...``
the stylesheet and the scripts. Actions (POST): ``/runs/RUN/settle``, ``unsettle``, ``answer``,
``resume``, ``cancel``, ``restart``, ``fork`` (:mod:`~afk_local.ui.actions`); what an action
said is kept on the server (:class:`Said`) and the page it redirects to names it by a
random id, so no page shows text taken from its address. A refusal from the store (a
symlinked run, a damaged file) is a 4xx page. Everything is behind
:class:`~afk_local.ui.access.AccessGuard`.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from afk_local.errors import (
    AfkLocalError,
    CheckpointNotFoundError,
    InvalidRunIdError,
    RunNotFoundError,
    UntrustedStoreError,
)
from afk_local.storage.store import Store
from afk_local.storage.views.notebook import format_ms
from afk_local.ui.access import CSRF_FIELD, Access, AccessGuard
from afk_local.ui.actions import ACTIONS, MAX_FIELD_CHARS
from afk_local.ui.charts import line_chart
from afk_local.ui.events import EVERYTHING, RunChanges
from afk_local.ui.gone import ClientGone, while_client_waits
from afk_local.ui.sse import HEARTBEAT, SSE_HEADERS, EventStream, sse_event
from afk_local.ui.store_stats import StoreStats
from afk_local.ui.views import (
    METRIC_CHECKPOINTS,
    STATUSES,
    RunsQuery,
    checkpoint_page,
    diff_page,
    needs_you,
    rows_of,
    run_page,
    runs_by_itself,
    runs_page,
    shown_text,
)

log = logging.getLogger("afk_local")

HERE = Path(__file__).parent
MAX_FORM_BYTES = MAX_FIELD_CHARS + (64 << 10)
"""The largest form body an action reads."""
MAX_CHARTS = 30
"""Metric charts drawn on a run's page (``afk-local metrics RUN`` lists every metric)."""
NOSCRIPT_RELOAD_S = 3
"""How often a run's page reloads itself in a browser without JavaScript, while the run
runs (with JavaScript it follows the run's events instead)."""


MAX_SAID = 200
"""What the latest actions said, kept for the pages they redirect to (the oldest dropped)."""


class Said:
    """What the latest actions said, each under a random id the redirect names (``?said=ID``).

    The page shows only what this server said, never text from its address: a link
    from elsewhere cannot put words on the page.
    """

    def __init__(self) -> None:
        self._said: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, text: str, *, problem: bool = False) -> str:
        """Keep ``text`` (a refusal when ``problem``); returns its id."""
        key = secrets.token_urlsafe(9)
        with self._lock:
            self._said[key] = (text, problem)
            while len(self._said) > MAX_SAID:
                self._said.popitem(last=False)
        return key

    def get(self, key: str | None) -> tuple[str | None, str | None]:
        """(notice, problem) kept under ``key``; (None, None) for an unknown one."""
        with self._lock:
            found = self._said.get(key or "")
        if found is None:
            return None, None
        text, problem = found
        return (None, text) if problem else (text, None)


def _refused_status(exc: AfkLocalError) -> int:
    """The 4xx a store's refusal answers with."""
    if isinstance(exc, UntrustedStoreError):
        return 403
    if isinstance(exc, (RunNotFoundError, InvalidRunIdError, CheckpointNotFoundError)):
        return 404
    return 422


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["fmt_ms"] = format_ms
    env.filters["cut"] = shown_text  # what the store holds, cut to a line: {{ x | cut }}
    return env


def create_app(store: Store, access: Access) -> Starlette:
    """The ASGI app serving ``store`` to whoever shows ``access``'s token.

    ``app.state.run_changes`` is the :class:`RunChanges` feeding ``/events``: close it
    when the server stops, so that no open event stream holds the shutdown up.
    """
    templates = _templates()
    changes = RunChanges(store.runs_dir)
    said = Said()
    stats = StoreStats(store)

    def render(name: str, nav: str = "", status: int = 200, **context: Any) -> HTMLResponse:
        html = templates.get_template(name).render(
            root=str(store.root),
            read_only=access.read_only,
            csrf=access.csrf,
            nav=nav,
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def message(heading: str, text: str, status: int, back: str | None = "/") -> HTMLResponse:
        return render("message.html", status=status, heading=heading, text=text, back=back)

    def not_found(exc: Exception) -> HTMLResponse:
        return message("Not found", str(exc), 404)

    def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AfkLocalError)
        status = _refused_status(exc)
        log.info("ui: %s refused (%d): %s", request.url.path, status, exc)
        heading = {403: "Refused", 404: "Not found"}.get(status, "Cannot read this")
        return message(heading, str(exc), status)

    async def runs(request: Request) -> Response:
        query = RunsQuery.from_params(request.query_params)

        def read(store: Store) -> tuple[Any, list[Any], int]:
            page = runs_page(store, query)
            needs, needs_total = ([], 0) if query.params() else needs_you(store)
            return page, needs, needs_total

        try:
            page, needs, needs_total = await while_client_waits(request, store, read)
        except ClientGone:
            return Response(status_code=499)
        notice, _ = said.get(request.query_params.get("said"))
        return render(
            "runs.html",
            nav="runs",
            page=page,
            needs=needs,
            needs_total=needs_total,
            statuses=STATUSES,
            notice=notice,
            query_string=urlencode(query.params()),
            prev_query=urlencode(query.params(page=query.page - 1 if query.page > 2 else "")),
            next_query=urlencode(query.params(page=query.page + 1)),
        )

    async def rows(request: Request) -> Response:
        ids = request.query_params.get("ids")
        query = RunsQuery.from_params(request.query_params)

        def read(store: Store) -> Any:
            return rows_of(store, ids.split(",")) if ids is not None else runs_page(store, query)

        try:
            page = await while_client_waits(request, store, read)
        except ClientGone:
            return Response(status_code=499)
        html = templates.get_template("runs_rows.html").render(page=page)
        return HTMLResponse(html, headers={"cache-control": "no-store"})

    async def events(request: Request) -> Response:
        del request

        async def stream() -> AsyncIterator[bytes]:
            # The first item is a heartbeat once the watch is in place: the answer starts
            # then, and the page knows that no change from now on goes unseen.
            async for changed in changes.listen():
                if changed is None:
                    yield HEARTBEAT
                else:
                    named = "*" if changed is EVERYTHING or not changed else sorted(changed)
                    yield sse_event("changed", json.dumps(named))

        return EventStream(stream(), headers=SSE_HEADERS)

    async def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            p = await while_client_waits(request, store, lambda store: run_page(store, run_id))
        except ClientGone:
            return Response(status_code=499)
        except (RunNotFoundError, InvalidRunIdError) as exc:
            return not_found(exc)
        names = p.metrics.names()
        charts = [
            line_chart(shown_text(name), p.metrics.series(name)) for name in names[:MAX_CHARTS]
        ]
        follow = request.query_params.get("follow") != "0" and runs_by_itself(p)
        notice, problem = said.get(request.query_params.get("said"))
        return render(
            "run.html",
            p=p,
            charts=charts,
            more_metrics=max(0, len(names) - MAX_CHARTS),
            metrics_checkpoints=METRIC_CHECKPOINTS,
            reload_s=NOSCRIPT_RELOAD_S if follow else None,
            notice=notice,
            problem=problem,
        )

    def checkpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        seq = request.path_params["seq"]
        try:
            c = checkpoint_page(store, run_id, seq)
        except (RunNotFoundError, InvalidRunIdError) as exc:
            return not_found(exc)
        except AfkLocalError as exc:
            return message("Cannot read this checkpoint", str(exc), 404, f"/runs/{quote(run_id)}")
        return render("checkpoint.html", c=c)

    def diff(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            seq_a = int(request.query_params.get("a", ""))
            seq_b = int(request.query_params.get("b", ""))
        except ValueError:
            return message("Bad request", "a diff needs two checkpoint seqs: ?a=SEQ&b=SEQ", 400)
        try:
            d = diff_page(store, run_id, seq_a, seq_b)
        except (RunNotFoundError, InvalidRunIdError) as exc:
            return not_found(exc)
        except AfkLocalError as exc:
            return message("Cannot diff", str(exc), 404, f"/runs/{quote(run_id)}")
        return render("diff.html", d=d)

    def store_view(request: Request) -> Response:
        verify = request.query_params.get("verify") == "1"
        refresh = request.query_params.get("refresh") == "1"
        return render(
            "store.html",
            nav="store",
            stats=stats.get(verify=verify, refresh=refresh),
            verify=verify,
        )

    async def act(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        action = ACTIONS.get(request.path_params["action"])
        if action is None:
            return message("Not found", "no such action", 404)
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
            return message("Refused", "the form is missing or too large", 413)
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return message("Refused", "the form is too large", 413)
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if not access.csrf_ok(form.get(CSRF_FIELD)):
            return message("Refused", "the form's CSRF value is wrong: reload the page", 403)
        back = f"/runs/{quote(run_id, safe='')}"
        try:
            done = await run_in_threadpool(action, store, run_id, form)
        except (RunNotFoundError, InvalidRunIdError) as exc:
            return not_found(exc)
        except UntrustedStoreError:
            raise  # a 403 page, not a sentence on the run's page
        except (AfkLocalError, ValueError) as exc:
            log.info("ui: %s of run %s refused: %s", request.path_params["action"], run_id, exc)
            return RedirectResponse(f"{back}?said={said.keep(str(exc), problem=True)}", 303)
        log.info("ui: run %s: %s", run_id, done.said)
        where = f"/runs/{quote(done.run_id, safe='')}"
        return RedirectResponse(f"{where}?said={said.keep(done.said)}", 303)

    routes = [
        Route("/", runs),
        Route("/runs/rows", rows),
        Route("/events", events),
        Route("/runs/{run_id}", run),
        Route("/runs/{run_id}/checkpoints/{seq:int}", checkpoint),
        Route("/runs/{run_id}/diff", diff),
        Route("/runs/{run_id}/{action}", act, methods=["POST"]),
        Route("/store", store_view),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AccessGuard, access=access)],
        exception_handlers={AfkLocalError: refused},
    )
    app.state.run_changes = changes
    app.state.store_stats = stats
    return app


__all__ = ["create_app"]
