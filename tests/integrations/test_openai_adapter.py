"""The OpenAI-compatible adapter against a loopback HTTP server (never the internet).

The server is a stub OpenAI-compatible endpoint started and stopped by each test; the
adapter reaches it through the official ``openai`` client (the ``openai`` extra).
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import pickle
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import afk_local as afk
import afk_local.integrations.openai as openai_module
from afk_local.integrations.openai import LLMHTTPError, OpenAIChat

needs_openai = pytest.mark.skipif(
    importlib.util.find_spec("openai") is None,
    reason="the openai extra is not installed (pip install 'afk_local[openai]')",
)


class _Handler(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    headers_seen: list[dict[str, str]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        # HTTP header names are case-insensitive; the openai client sends them lower-cased
        self.headers_seen.append({key.lower(): value for key, value in self.headers.items()})
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "no such path"})
            return
        if body["model"] == "broken":
            self._send(500, {"error": {"message": "upstream exploded"}})
            return
        if body["model"] == "endless":  # a server that never stops sending
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            chunk = b" " * (1 << 20)
            with contextlib.suppress(OSError):  # the client hangs up once it read enough
                for _ in range(64):
                    self.wfile.write(chunk)
            return
        if body["model"] == "html":
            page = b"<html>a proxy login page</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        tool_results = [m for m in body["messages"] if m["role"] == "tool"]
        if not tool_results:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": f"the sum is {tool_results[0]['content']}"}
            finish = "stop"
        self._send(
            200,
            {
                "id": "x",
                "model": "loopback-model-2024",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
            },
        )

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"requests": [], "headers_seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@needs_openai
def test_agent_over_loopback_chat_completions(
    server: tuple[str, type[_Handler]], tmp_path: Path
) -> None:
    url, handler = server
    llm = OpenAIChat("gpt-test", base_url=url, api_key="sk-test", price_per_1k=(1.0, 2.0))
    agent = afk.Agent("calc", "You add.", llm, {"add": add}, model="gpt-test")
    result = afk.AgentRunner(tmp_path / "store").run(agent, "2+3?", run_id="oa")
    assert result.state == "completed" and result.final_text == "the sum is 5"
    assert result.usage == {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32}
    assert result.total_cost_usd == pytest.approx(2 * (12 * 1.0 + 4 * 2.0) / 1000)
    first, second = handler.requests
    assert first["model"] == "gpt-test"
    assert first["tools"][0] == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    # the second request carries the assistant's tool call and the tool result, chat-shaped
    assert second["messages"][2]["tool_calls"][0]["function"]["name"] == "add"
    assert second["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert handler.headers_seen[0]["authorization"] == "Bearer sk-test"
    post_llm = [
        c for c in afk.Store(tmp_path / "store").open("oa").history() if c.phase == "post_llm"
    ]
    assert post_llm[0].payload["model"] == "loopback-model-2024"
    assert post_llm[0].payload["provider"] == "openai"
    assert "sk-test" not in repr(llm)


@needs_openai
def test_http_errors_are_named(server: tuple[str, type[_Handler]], tmp_path: Path) -> None:
    url, _ = server
    with pytest.raises(LLMHTTPError, match=r"HTTP 500.*upstream exploded"):
        OpenAIChat("broken", base_url=url, api_key="")([{"role": "user", "content": "x"}], [])
    agent = afk.Agent(
        "calc", None, OpenAIChat("broken", base_url=url), {}, llm_retries=1, retry_backoff_s=0
    )
    result = afk.AgentRunner(tmp_path / "store").run(agent, "x")
    assert result.state == "failed" and "HTTP 500" in (result.error or "")
    with pytest.raises(ValueError, match="http"):
        OpenAIChat("m", base_url="file:///etc/passwd")


def test_parse_rejects_bad_answers() -> None:
    llm = OpenAIChat("m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(LLMHTTPError, match="no choices"):
        llm.parse({"choices": []})
    bad_args = {
        "choices": [
            {
                "message": {
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]
                }
            }
        ]
    }
    with pytest.raises(LLMHTTPError, match="not JSON"):
        llm.parse(bad_args)


@needs_openai
def test_keyless_server_extra_fields_and_headers(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    llm = OpenAIChat(
        "local",
        base_url=url,
        api_key="",
        extra_body={"temperature": 0, "seed": 7, "top_k": 3},
        headers={"X-Team": "batch"},
    )
    answer = llm([{"role": "user", "content": "2+3?"}], [])
    assert answer.tool_calls[0].name == "add" and answer.tool_calls[0].arguments == {"a": 2, "b": 3}
    assert answer.finish_reason == "tool_calls" and answer.text is None
    assert answer.usage == {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
    (request,) = handler.requests
    assert request == {
        "model": "local",
        "messages": [{"role": "user", "content": "2+3?"}],
        "temperature": 0,
        "seed": 7,
        "top_k": 3,
    }
    assert "authorization" not in handler.headers_seen[0]  # llama.cpp / Ollama need no key
    assert handler.headers_seen[0]["x-team"] == "batch"


@needs_openai
def test_unreadable_and_unreachable_endpoints(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    with pytest.raises(LLMHTTPError, match="no choices"):
        OpenAIChat("html", base_url=url, api_key="k")([{"role": "user", "content": "x"}], [])
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    with pytest.raises(LLMHTTPError, match="no answer"):
        OpenAIChat("m", base_url=closed, api_key="k")([{"role": "user", "content": "x"}], [])


@needs_openai
def test_an_answer_over_the_size_bound_is_refused(
    server: tuple[str, type[_Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that sends more than MAX_RESPONSE_BYTES fails the call, never fills memory."""
    monkeypatch.setattr(openai_module, "MAX_RESPONSE_BYTES", 4 << 20)
    url, _ = server
    with pytest.raises(LLMHTTPError, match="over 4194304 bytes"):
        OpenAIChat("endless", base_url=url, api_key="k")([{"role": "user", "content": "x"}], [])


@needs_openai
def test_pickles_after_use(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    llm = OpenAIChat("m", base_url=url, api_key="sk-test")
    llm([{"role": "user", "content": "x"}], [])
    copy = pickle.loads(pickle.dumps(llm))  # fan-out workers receive agents pickled
    assert copy([{"role": "user", "content": "x"}], []).tool_calls[0].name == "add"
    assert handler.headers_seen[1]["authorization"] == "Bearer sk-test"


def test_missing_openai_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # makes ``import openai`` fail
    llm = OpenAIChat("m", base_url="http://127.0.0.1:9/v1")  # building needs no openai
    with pytest.raises(ImportError, match=r"afk_local\[openai\]"):
        llm([{"role": "user", "content": "x"}], [])
