"""The routes of ``afk-local ui``: pages rendered on the server, forms that POST.

Pages (GET): ``/`` the runs, ``/runs/rows`` the runs table's rows alone (what a page
without EventSource polls), ``/events`` server-sent events: the runs table's new rows
(``/events?<the runs page's query>``) or that a run changed (``/events?run=RUN``),
``/runs/RUN`` a run,
``/runs/RUN/checkpoints/SEQ`` one checkpoint, ``/runs/RUN/diff?a=SEQ&b=SEQ`` what
changed between two, ``/store`` the store, ``/static/...``
the stylesheet and the script. Actions (POST): ``/runs/RUN/settle``, ``unsettle``, ``answer``,
``resume``, ``cancel``, ``restart``, ``fork`` (:mod:`~afk_local.ui.actions`). Everything is behind
:class:`~afk_local.ui.access.AccessGuard`.
"""

from __future__ import annotations

import logging
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

from afk_local.errors import AfkLocalError, InvalidRunIdError, RunNotFoundError
from afk_local.storage.store import Store
from afk_local.storage.views.notebook import format_ms
from afk_local.ui.access import CSRF_FIELD, Access, AccessGuard
from afk_local.ui.actions import ACTIONS, MAX_FIELD_CHARS
from afk_local.ui.charts import line_chart
from afk_local.ui.events import RunChanges
from afk_local.ui.sse import HEARTBEAT, SSE_HEADERS, EventStream, sse_event
from afk_local.ui.views import (
    STATUSES,
    RunsQuery,
    checkpoint_page,
    diff_page,
    run_page,
    runs_by_itself,
    runs_page,
    shown_text,
    store_page,
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

    def runs(request: Request) -> Response:
        query = RunsQuery.from_params(request.query_params)
        page = runs_page(store, query)
        notice = request.query_params.get("notice")
        return render(
            "runs.html",
            nav="runs",
            page=page,
            statuses=STATUSES,
            notice=notice,
            query_string=urlencode(query.params()),
            prev_query=urlencode(query.params(page=query.page - 1 if query.page > 2 else "")),
            next_query=urlencode(query.params(page=query.page + 1)),
        )

    def rows_html(query: RunsQuery) -> str:
        return templates.get_template("runs_rows.html").render(page=runs_page(store, query))

    def rows(request: Request) -> Response:
        html = rows_html(RunsQuery.from_params(request.query_params))
        return HTMLResponse(html, headers={"cache-control": "no-store"})

    async def events(request: Request) -> Response:
        run_id = request.query_params.get("run")
        if run_id is not None:
            try:
                store.paths(run_id, refuse_links=True)
            except InvalidRunIdError as exc:
                return not_found(exc)
        query = RunsQuery.from_params(request.query_params)

        async def stream() -> AsyncIterator[bytes]:
            yield HEARTBEAT  # the answer starts now: the page knows it listens
            last = None
            async for changed in changes.listen():
                if changed is None:
                    yield HEARTBEAT
                elif run_id is not None:
                    if not changed or run_id in changed:
                        yield sse_event("run", run_id)
                else:
                    html = await run_in_threadpool(rows_html, query)
                    if html != last:
                        last = html
                        yield sse_event("rows", html)

        return EventStream(stream(), headers=SSE_HEADERS)

    def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            p = run_page(store, run_id)
        except (RunNotFoundError, InvalidRunIdError) as exc:
            return not_found(exc)
        names = p.metrics.names()
        charts = [
            line_chart(shown_text(name), p.metrics.series(name)) for name in names[:MAX_CHARTS]
        ]
        follow = request.query_params.get("follow") != "0" and runs_by_itself(p)
        return render(
            "run.html",
            p=p,
            charts=charts,
            more_metrics=max(0, len(names) - MAX_CHARTS),
            reload_s=NOSCRIPT_RELOAD_S if follow else None,
            notice=request.query_params.get("notice"),
            problem=request.query_params.get("problem"),
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
        before = [s for s in c.seqs if s < c.seq]
        after = [s for s in c.seqs if s > c.seq]
        return render(
            "checkpoint.html",
            c=c,
            prev_seq=before[-1] if before else None,
            next_seq=after[0] if after else None,
        )

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
        page = store_page(store, verify=request.query_params.get("verify") == "1")
        return render("store.html", nav="store", s=page)

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
        except (AfkLocalError, ValueError) as exc:
            log.info("ui: %s of run %s refused: %s", request.path_params["action"], run_id, exc)
            return RedirectResponse(f"{back}?{urlencode({'problem': str(exc)})}", 303)
        log.info("ui: run %s: %s", run_id, done.said)
        where = f"/runs/{quote(done.run_id, safe='')}"
        return RedirectResponse(f"{where}?{urlencode({'notice': done.said})}", 303)

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
    app = Starlette(routes=routes, middleware=[Middleware(AccessGuard, access=access)])
    app.state.run_changes = changes
    return app


__all__ = ["create_app"]
