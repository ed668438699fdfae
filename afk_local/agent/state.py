"""The agent's runtime snapshot (``runtime_state``, docs/agent.md) and the light phase payloads.

Kept apart from the loop so the on-disk shape is in one place: the keys written
here are the contract the tests check against the phase table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from afk_local.agent.types import AgentResult, LLMResponse
from afk_local.storage.format.records import now_ms

RUNTIME_STATE_KEYS = (
    "messages",
    "step",
    "state",
    "context",
    "llm_calls",
    "tool_calls",
    "started_at_s",
    "usage",
    "total_cost_usd",
    "session_token",
    "checkpoint_token",
    "pending_llm_response",
    "tool_executions",
    "subagent_executions",
    "final_text",
    "final_structured",
    "replayed_effect_count",
    "requested_model",
    "normalized_model",
    "provider",
    "agent_name",
    "stage",
)
"""Every key of a ``runtime_state`` payload (``stage`` says where in the step it was taken)."""

PHASE_KEYS: dict[str, tuple[str, ...]] = {
    "run_started": ("agent_name", "resumed"),
    "step_started": ("state", "message_count"),
    "pre_subagent_batch": ("targets", "router_parallel"),
    "post_subagent_batch": ("success_count", "failure_count"),
    "pre_llm": ("model", "provider", "message_count"),
    "post_llm": (
        "model",
        "provider",
        "finish_reason",
        "tool_call_count",
        "session_token",
        "checkpoint_token",
        "total_cost_usd",
    ),
    "pre_tool_batch": ("tool_call_count",),
    "post_tool_batch": ("tool_calls_total", "tool_failures"),
    "resumed": ("kind",),
}
"""The light payload keys of each phase (the phase table of docs/agent.md)."""

STAGE_STEP_STARTED = "step_started"
STAGE_POST_LLM = "post_llm"
STAGE_POST_TOOLS = "post_tool_batch"


@dataclass
class Snapshot:
    """The agent loop's whole state: what a ``runtime_state`` checkpoint stores."""

    agent_name: str
    messages: list[dict[str, Any]]
    context: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    stage: str = STAGE_POST_TOOLS
    state: str = "running"
    llm_calls: int = 0
    tool_calls: int = 0
    started_at_s: float = field(default_factory=lambda: now_ms() / 1000)
    usage: dict[str, int | float] = field(default_factory=dict)
    total_cost_usd: float | None = None
    session_token: str | None = None
    checkpoint_token: str | None = None
    pending_llm_response: dict[str, Any] | None = None
    tool_executions: list[dict[str, Any]] = field(default_factory=list)
    subagent_executions: list[dict[str, Any]] = field(default_factory=list)
    final_text: str | None = None
    final_structured: Any = None
    replayed_effect_count: int = 0
    requested_model: str | None = None
    normalized_model: str | None = None
    provider: str | None = None

    def payload(self) -> dict[str, Any]:
        """The ``runtime_state`` payload (exactly :data:`RUNTIME_STATE_KEYS`)."""
        return {key: getattr(self, key) for key in RUNTIME_STATE_KEYS}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Snapshot:
        """Rebuild from a stored payload; unknown keys are ignored, missing ones default."""
        known = {key: payload[key] for key in RUNTIME_STATE_KEYS if key in payload}
        if "messages" not in known or "agent_name" not in known:
            raise ValueError("a runtime_state payload needs 'messages' and 'agent_name'")
        return cls(**known)

    @property
    def pending(self) -> LLMResponse | None:
        """The checkpointed LLM response whose tool calls are not all done yet."""
        if self.pending_llm_response is None:
            return None
        return msgspec.convert(self.pending_llm_response, LLMResponse)

    def add_response(self, response: LLMResponse) -> None:
        """Account for one LLM response: usage, cost, tokens, model fields."""
        self.llm_calls += 1
        for name, value in response.usage.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.usage[name] = self.usage.get(name, 0) + value
        if response.cost_usd is not None:
            self.total_cost_usd = (self.total_cost_usd or 0.0) + response.cost_usd
        if response.session_token is not None:
            self.session_token = response.session_token
        if response.checkpoint_token is not None:
            self.checkpoint_token = response.checkpoint_token
        if response.model is not None:
            self.normalized_model = response.model
        if response.provider is not None:
            self.provider = response.provider

    def result(
        self,
        run_id: str,
        thread_id: str | None,
        state: str,
        *,
        error: str | None = None,
        pending: dict[str, Any] | None = None,
    ) -> AgentResult:
        """An :class:`AgentResult` of this snapshot."""
        return AgentResult(
            run_id=run_id,
            thread_id=thread_id,
            state=state,
            final_text=self.final_text,
            final_structured=self.final_structured,
            usage=dict(self.usage),
            tool_executions=list(self.tool_executions),
            total_cost_usd=self.total_cost_usd,
            steps=self.step,
            llm_calls=self.llm_calls,
            replayed_effect_count=self.replayed_effect_count,
            error=error,
            pending=pending,
            messages=list(self.messages),
        )

    def model_fields(self) -> dict[str, Any]:
        """``requested_model``, ``normalized_model``, ``provider`` (for ``run_terminal``)."""
        return {
            "requested_model": self.requested_model,
            "normalized_model": self.normalized_model,
            "provider": self.provider,
        }


def result_from_terminal(value: Any, run_id: str) -> AgentResult:
    """The :class:`AgentResult` stored as a completed run's ``terminal_result``."""
    if not isinstance(value, dict):
        raise ValueError(
            f"run {run_id!r}: its terminal_result is not an agent result; was it an agent run?"
        )
    return msgspec.convert(value, AgentResult)


__all__ = [
    "PHASE_KEYS",
    "RUNTIME_STATE_KEYS",
    "Snapshot",
    "result_from_terminal",
]
