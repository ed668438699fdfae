"""An LLM callable for OpenAI-compatible chat-completions APIs, on the official ``openai`` client.

Install with ``pip install 'afk_local[openai]'``. Works with anything that
speaks ``POST {base_url}/chat/completions`` (OpenAI, vLLM, llama.cpp server,
Ollama's OpenAI endpoint, LiteLLM...). The agent's messages are already in the
chat-completions shape, so they are sent as they are. The ``openai`` package is
imported, and its client made, on the first call: building an :class:`OpenAIChat`
(for instance in an agent factory) never needs it.

Example:
    >>> from afk_local.integrations.openai import OpenAIChat
    >>> llm = OpenAIChat("gpt-4o-mini", base_url="http://localhost:8000/v1")  # doctest: +SKIP
    >>> agent = afk.Agent("helper", "Be brief.", llm, tools={"add": add})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any

from afk_local.agent.types import LLMResponse, ToolCall
from afk_local.errors import LLMHTTPError

if TYPE_CHECKING:
    from types import ModuleType

    from openai import OpenAI

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_RESPONSE_BYTES = 32 << 20
"""The largest answer read from an endpoint: a server that sends more is refused, never
held whole in memory."""
MISSING_EXTRA = "OpenAIChat needs the openai package: pip install 'afk_local[openai]'"


class OpenAIChat:
    """``llm(messages, tools) -> LLMResponse`` for an OpenAI-compatible endpoint.

    Args:
        model: the model name sent with each request.
        base_url: the API root (default ``$OPENAI_BASE_URL`` else the OpenAI API).
        api_key: bearer token (default ``$OPENAI_API_KEY``; no ``Authorization``
            header is sent when it is empty, as local servers expect).
        timeout_s: timeout per request.
        provider: the provider name recorded in checkpoints.
        extra_body: more request fields (``temperature``, ``seed``...).
        headers: more HTTP headers.
        price_per_1k: ``(prompt, completion)`` USD per 1000 tokens, to fill ``cost_usd``.
        max_retries: the ``openai`` client's own retries per call (default 0: the
            agent's ``llm_retries`` retry a failed call, and each attempt is journaled).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        provider: str = "openai",
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        price_per_1k: tuple[float, float] | None = None,
        max_retries: int = 0,
    ) -> None:
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {self.base_url!r}")
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.timeout_s = timeout_s
        self.provider = provider
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.price_per_1k = price_per_1k
        self.max_retries = max_retries
        self._client: OpenAI | None = None
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIChat(model={self.model!r}, base_url={self.base_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the settings only: the client and its lock are remade on first use."""
        state = dict(self.__dict__)
        state["_client"] = None
        del state["_client_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore the settings; the client is made again on the first call."""
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    def client(self) -> OpenAI:
        """The ``openai.OpenAI`` client, made (and ``openai`` imported) on first use."""
        with self._client_lock:
            if self._client is None:
                openai = _openai()
                # openai refuses an empty key: a placeholder lets the client be made, and
                # each request then omits the Authorization header (see __call__)
                self._client = openai.OpenAI(
                    api_key=self._api_key or "no-key",
                    base_url=self.base_url,
                    timeout=self.timeout_s,
                    max_retries=self.max_retries,
                    default_headers=self.headers,
                    http_client=_bounded_http_client(self.timeout_s),
                )
            return self._client

    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The JSON body sent for ``messages`` and ``tools``."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        if tools:
            body["tools"] = [{"type": "function", "function": spec} for spec in tools]
        return body

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        """Send one chat-completions request and parse the first choice."""
        client = self.client()
        openai = _openai()
        url = f"{self.base_url}/chat/completions"
        body = self.request_body(messages, tools)
        # everything but model/messages goes through extra_body, so fields an older or newer
        # openai release does not know as keyword arguments (seed, top_k...) are still sent
        fields = {key: body.pop(key) for key in list(body) if key not in ("model", "messages")}
        # keyless local servers (llama.cpp, Ollama): no Authorization header at all
        # (openai 1.x has Omit only in openai._types; later releases export it)
        omit = getattr(openai, "Omit", None) or openai._types.Omit
        no_auth = {} if self._api_key else {"Authorization": omit()}
        try:
            answer = client.chat.completions.create(
                model=body["model"],
                messages=body["messages"],
                extra_body=fields,
                extra_headers=no_auth,
            )
        except openai.APIStatusError as exc:
            raise LLMHTTPError(url, exc.status_code, _detail(exc)) from exc
        except openai.APIError as exc:
            # connection failures, timeouts, an answer over the size bound (a 200 answer
            # that is not JSON comes back as text and is refused by parse); openai says only
            # "Connection error.", httpx's error under it says what happened
            cause = exc.__cause__
            detail = f"{exc} {cause}" if cause is not None and str(cause) else str(exc)
            raise LLMHTTPError(url, None, detail) from exc
        payload = answer.model_dump() if hasattr(answer, "model_dump") else answer
        return self.parse(payload, url)

    def parse(self, payload: Any, url: str = "") -> LLMResponse:
        """An :class:`LLMResponse` from a chat-completions JSON answer."""
        try:
            choice = payload["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMHTTPError(url, 200, f"no choices[0].message in {str(payload)[:200]}") from exc
        calls = []
        for raw_call in message.get("tool_calls") or []:
            function = raw_call.get("function") or {}
            arguments = function.get("arguments") or "{}"
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError as exc:
                raise LLMHTTPError(
                    url, 200, f"tool call {raw_call.get('id')} has arguments that are not JSON"
                ) from exc
            if not isinstance(parsed, dict):
                parsed = {"value": parsed}
            calls.append(
                ToolCall(
                    id=str(raw_call.get("id")), name=str(function.get("name")), arguments=parsed
                )
            )
        usage = {
            key: value
            for key, value in (payload.get("usage") or {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        cost = None
        if self.price_per_1k is not None:
            prompt, completion = self.price_per_1k
            cost = (
                usage.get("prompt_tokens", 0) * prompt
                + usage.get("completion_tokens", 0) * completion
            ) / 1000
        return LLMResponse(
            text=message.get("content"),
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            model=payload.get("model") or self.model,
            provider=self.provider,
            cost_usd=cost,
        )


def _bounded_http_client(timeout_s: float) -> Any:
    """An ``httpx.Client`` (openai's own HTTP library) that reads at most
    :data:`MAX_RESPONSE_BYTES` of an answer, then fails the request."""
    import httpx  # noqa: PLC0415 - installed with openai

    class BoundedStream(httpx.SyncByteStream):
        def __init__(self, inner: httpx.SyncByteStream) -> None:
            self._inner = inner

        def __iter__(self) -> Any:
            seen = 0
            for chunk in self._inner:
                seen += len(chunk)
                if seen > MAX_RESPONSE_BYTES:
                    raise httpx.ReadError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
                yield chunk

        def close(self) -> None:
            self._inner.close()

    class BoundedTransport(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            assert isinstance(response.stream, httpx.SyncByteStream)
            response.stream = BoundedStream(response.stream)
            return response

    return httpx.Client(transport=BoundedTransport(), timeout=timeout_s, follow_redirects=True)


def _openai() -> ModuleType:
    """The ``openai`` package, imported on first use; without it, an error naming the extra."""
    try:
        import openai  # noqa: PLC0415 - only a call needs it, never building an OpenAIChat
    except ImportError as exc:
        raise ImportError(MISSING_EXTRA) from exc
    return openai


def _detail(exc: Any) -> str:
    """The error body the endpoint sent, as text (its ``message`` when it is OpenAI-shaped)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        return str(message)
    return str(body if body is not None else exc)


__all__ = ["LLMHTTPError", "OpenAIChat"]
