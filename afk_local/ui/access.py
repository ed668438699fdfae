"""Who may use the page: the token, the Host header, and a CSRF check on every action.

``afk-local ui`` prints a URL holding a random token (as Jupyter does). A request
carries it in the query (``?token=``) once; the answer then sets it as an HttpOnly,
SameSite=Strict cookie so the page's links and forms need not repeat it. Any
request without it gets 403. The ``Host`` header must name the loopback address and
port the server listens on, so a web page whose DNS name is rebound to 127.0.0.1
cannot reach the server under its own name. Actions are POSTs and additionally need
the CSRF value of the page's forms and, when the browser sends one, a same-origin
``Origin``; under ``--read-only`` every POST is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

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
    """

    token: str
    port: int
    read_only: bool = False

    @property
    def cookie_name(self) -> str:
        """One cookie per port: two servers on one machine keep their own token."""
        return f"afk_local_ui_{self.port}"

    @property
    def hosts(self) -> frozenset[str]:
        """The Host headers accepted: the loopback address or ``localhost``, with the port."""
        return frozenset({f"127.0.0.1:{self.port}", f"localhost:{self.port}"})

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


class AccessGuard:
    """ASGI middleware: refuse with 403 what :func:`refusal` refuses; set the token cookie.

    The cookie is set on every answer to a request that brought the token in its query;
    every answer carries :data:`SECURITY_HEADERS`.
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
            body = f"403 Forbidden: {why}\n".encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        extra = list(SECURITY_HEADERS)
        if self.access.token_ok(_query_token(scope)):
            cookie = (
                f"{self.access.cookie_name}={self.access.token}; Path=/; HttpOnly; SameSite=Strict"
            )
            extra.append((b"set-cookie", cookie.encode()))

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


__all__ = [
    "CSRF_FIELD",
    "SECURITY_HEADERS",
    "TOKEN_PARAM",
    "Access",
    "AccessGuard",
    "new_token",
    "refusal",
]
