"""Who may use the page: the token, the Host header, and a CSRF check on every action.

``afk-local ui`` prints a URL holding a random token (as Jupyter does). A request
carries it in the query (``?token=``) once; the answer is a redirect to the same
address without it (so it leaves the address bar and the history) that sets it as an
HttpOnly, SameSite=Strict cookie. The server listens on a loopback address of its own
(:mod:`~afk_local.ui.server`), so that cookie goes to no other local server. Any
request without the token gets 403. The ``Host`` header must name the address and
port the server listens on, so a web page whose DNS name is rebound to loopback
cannot reach the server under its own name. Actions are POSTs and additionally need
the CSRF value of the page's forms and, when the browser sends one, a same-origin
``Origin``; under ``--read-only`` every POST is refused. Every answer, refusals and
errors included, carries :data:`SECURITY_HEADERS`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, parse_qsl, quote, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("afk_local")

TOKEN_PARAM = "token"  # noqa: S105 - the name of a parameter, not a secret
"""The query parameter that carries the token."""
CSRF_FIELD = "csrf"
"""The form field that carries the CSRF value."""


SECURITY_HEADERS = (
    # The token is in the first URL: never send it on to another site. (Not no-referrer:
    # then a browser sends `Origin: null` with the page's own forms.)
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    ),
)
"""Headers on every answer: no referrer, no framing, nothing loaded from elsewhere."""


def new_token() -> str:
    """A fresh random token for one server (``secrets.token_urlsafe``, 32 bytes)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Access:
    """What a request must show to be served.

    Attributes:
        token: the secret of this server.
        port: the port it listens on (the Host header must name it).
        read_only: refuse every action.
        host: the loopback address it listens on (the Host header must name it).
    """

    token: str
    port: int
    read_only: bool = False
    host: str = "127.0.0.1"

    @property
    def cookie_name(self) -> str:
        """One cookie per port: two servers on one machine keep their own token."""
        return f"afk_local_ui_{self.port}"

    @property
    def hosts(self) -> frozenset[str]:
        """The Host headers accepted: the server's own address and port.

        Not ``localhost``: a cookie set there would go to every server on ``localhost``.
        """
        return frozenset({f"{self.host}:{self.port}"})

    @property
    def origins(self) -> frozenset[str]:
        """The ``Origin`` headers accepted on an action."""
        return frozenset(f"http://{host}" for host in self.hosts)

    @property
    def csrf(self) -> str:
        """The value the page's forms carry: derived from the token, never the token itself."""
        return hmac.new(self.token.encode(), b"afk-local ui csrf", hashlib.sha256).hexdigest()

    def token_ok(self, given: str | None) -> bool:
        """``given`` is this server's token (compared in constant time)."""
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def csrf_ok(self, given: str | None) -> bool:
        """``given`` is the CSRF value of this server's forms."""
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _query_token(scope: Scope) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(TOKEN_PARAM)
    return values[0] if values else None


def _cookie_token(headers: dict[str, str], name: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no token
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


def refusal(scope: Scope, access: Access) -> str | None:
    """Why a request is refused (403), or None when it may be served.

    Checks the Host header, the token (query or cookie) and, for anything but GET and
    HEAD, read-only mode and a same-origin ``Origin``; the CSRF field of a POST's
    body is checked by the action itself, once the body is read.
    """
    headers = _headers(scope)
    if headers.get("host", "") not in access.hosts:
        return "unexpected Host header: open the URL afk-local ui printed"
    if not (
        access.token_ok(_query_token(scope))
        or access.token_ok(_cookie_token(headers, access.cookie_name))
    ):
        return "no valid token: open the URL afk-local ui printed (it holds the token)"
    if scope.get("method", "GET") in ("GET", "HEAD"):
        return None
    if access.read_only:
        return "this page is read-only (afk-local ui --read-only): actions are off"
    origin = headers.get("origin")
    if origin is not None and origin not in access.origins:
        return "cross-origin request refused"
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    return None


async def _answer(
    send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A plain-text answer with :data:`SECURITY_HEADERS`."""
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *SECURITY_HEADERS,
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def without_token(scope: Scope) -> str:
    """The request's path and query, the token left out: where the first request goes next."""
    pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    query = urlencode([(k, v) for k, v in pairs if k != TOKEN_PARAM])
    path = quote(scope.get("path", "/"))
    return f"{path}?{query}" if query else path


class AccessGuard:
    """ASGI middleware: refuse with 403 what :func:`refusal` refuses; trade the token for a cookie.

    A GET that brings the token in its query is answered by a redirect to the same
    address without it, setting the cookie. Every answer carries
    :data:`SECURITY_HEADERS`, a refusal's and an unexpected error's (500) too.
    """

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope`` if :func:`refusal` allows it."""
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            return
        why = refusal(scope, self.access)
        if why is not None:
            await _answer(send, 403, f"403 Forbidden: {why}\n")
            return
        if self.access.token_ok(_query_token(scope)) and scope.get("method") in ("GET", "HEAD"):
            cookie = (
                f"{self.access.cookie_name}={self.access.token}; Path=/; HttpOnly; SameSite=Strict"
            )
            location = without_token(scope)
            await _answer(
                send,
                303,
                f"See {location}\n",
                [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
            )
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("ui: %s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            await _answer(send, 500, "500: the server failed; its log says why\n")


__all__ = [
    "CSRF_FIELD",
    "SECURITY_HEADERS",
    "TOKEN_PARAM",
    "Access",
    "AccessGuard",
    "new_token",
    "refusal",
    "without_token",
]
