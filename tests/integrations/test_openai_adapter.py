"""The OpenAI-compatible adapter against a loopback HTTP server (never the internet)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import afk_local as afk
from afk_local.integrations.openai import LLMHTTPError, OpenAIChat


class _Handler(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    headers_seen: list[dict[str, str]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        self.headers_seen.append(dict(self.headers))
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "no such path"})
            return
        if body["model"] == "broken":
            self._send(500, {"error": {"message": "upstream exploded"}})
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
    assert handler.headers_seen[0]["Authorization"] == "Bearer sk-test"
    post_llm = [
        c for c in afk.Store(tmp_path / "store").open("oa").history() if c.phase == "post_llm"
    ]
    assert post_llm[0].payload["model"] == "loopback-model-2024"
    assert post_llm[0].payload["provider"] == "openai"
    assert "sk-test" not in repr(llm)


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
