"""An LLM callable for OpenAI-compatible chat-completions APIs, over plain HTTP (stdlib only).

Works with anything that speaks ``POST {base_url}/chat/completions`` (OpenAI,
vLLM, llama.cpp server, Ollama's OpenAI endpoint, LiteLLM...). No extra
dependency: it uses :mod:`urllib`. The agent's messages are already in the
chat-completions shape, so they are sent as they are.

Example:
    >>> from afk_local.integrations.openai import OpenAIChat
    >>> llm = OpenAIChat("gpt-4o-mini", base_url="http://localhost:8000/v1")  # doctest: +SKIP
    >>> agent = afk.Agent("helper", "Be brief.", llm, tools={"add": add})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from afk_local.agent.types import LLMResponse, ToolCall
from afk_local.errors import LLMHTTPError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_RESPONSE_BYTES = 32 << 20


class OpenAIChat:
    """``llm(messages, tools) -> LLMResponse`` for an OpenAI-compatible endpoint.

    Args:
        model: the model name sent with each request.
        base_url: the API root (default ``$OPENAI_BASE_URL`` else the OpenAI API).
        api_key: bearer token (default ``$OPENAI_API_KEY``; omitted when empty).
        timeout_s: socket timeout per request.
        provider: the provider name recorded in checkpoints.
        extra_body: more request fields (``temperature``, ``seed``...).
        headers: more HTTP headers.
        price_per_1k: ``(prompt, completion)`` USD per 1000 tokens, to fill ``cost_usd``.
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

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIChat(model={self.model!r}, base_url={self.base_url!r})"

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
        url = f"{self.base_url}/chat/completions"
        data = json.dumps(self.request_body(messages, tools)).encode()
        headers = {"Content-Type": "application/json", **self.headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # base_url was checked to be http(s) in __init__, so no file:// or custom schemes here.
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310
                raw = answer.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(4096).decode("utf-8", "replace")
            raise LLMHTTPError(url, exc.code, detail) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LLMHTTPError(url, None, str(exc)) from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            raise LLMHTTPError(url, 200, f"response over {MAX_RESPONSE_BYTES} bytes")
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise LLMHTTPError(url, 200, f"not JSON: {exc}") from exc
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


__all__ = ["LLMHTTPError", "OpenAIChat"]
