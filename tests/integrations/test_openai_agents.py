"""DurableRunner in one process: what is journaled, replayed, refused.

Killed processes: test_openai_agents_crash.py (model, tools, handoffs),
test_openai_agents_pause.py (approvals), test_openai_agents_session.py (sessions).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from openai_agents_procs import EXPECTED_OUTPUT

import afk_local as afk
from afk_local.errors import AgentRequestMismatchError, EffectMismatchError


@pytest.fixture(autouse=True)
def _needs_agents() -> None:
    """The tests need agents: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "agents", reason="openai-agents not installed: pip install 'afk_local[test-all]'"
    )


@pytest.fixture
def effects_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.txt"
    monkeypatch.setenv("OA_EFFECTS", str(path))
    monkeypatch.delenv("OA_MODEL_LOG", raising=False)
    monkeypatch.delenv("OA_PLAIN_TOOL", raising=False)
    return path


def outcome_keys(store: afk.Store, run_id: str) -> list[str]:
    return [e.key for e in store.open(run_id).effects() if e.kind == "outcome"]


def test_every_model_call_and_tool_call_is_a_journaled_step(
    tmp_path: Path, effects_file: Path
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    agent, model = jobs.scripted_recorder()
    store = afk.Store(tmp_path / "store")

    @afk.durable(store=store)
    def job(ctx: afk.RunContext, prompt: str) -> str:
        result = DurableRunner.run_sync(ctx, agent, prompt, idempotent_tools={"record"})
        return str(result.final_output)

    assert job.run("record two items", run_id="rec") == EXPECTED_OUTPUT  # uninterrupted
    assert model.requests == 3
    assert outcome_keys(store, "rec") == [
        "openai-agents.model#1",
        "openai-agents.tool.record.call-a#1",
        "openai-agents.model#2",
        "openai-agents.tool.record.call-b#1",
        "openai-agents.model#3",
    ]
    lines = effects_file.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["a", "b"]
    assert len({line.split()[1] for line in lines}) == 2  # one idempotency key per call
    assert agent.model is model  # the caller's agent is not changed
    assert job.run("record two items", run_id="rec") == EXPECTED_OUTPUT  # its stored result
    assert model.requests == 3


def test_a_failed_attempt_is_replayed_not_asked_again(tmp_path: Path, effects_file: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    agent, model = jobs.scripted_recorder()
    failures = ["once"]

    @afk.durable(store=afk.Store(tmp_path / "store"))
    async def job(ctx: afk.RunContext) -> str:
        result = await DurableRunner.run(ctx, agent, "record two items")
        if failures:
            failures.pop()
            raise RuntimeError("planned failure after the agent ran")
        return str(result.final_output)

    with pytest.raises(RuntimeError, match="planned failure"):
        asyncio.run(job.arun(run_id="again"))
    assert asyncio.run(job.arun(run_id="again")) == EXPECTED_OUTPUT
    assert model.requests == 3  # every answer came from the journal the second time
    assert len(effects_file.read_text().splitlines()) == 2


def test_a_changed_conversation_is_refused_not_answered_from_the_journal(
    tmp_path: Path, effects_file: Path
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    agent, _ = jobs.scripted_recorder()
    prompts = ["record two items", "record three items"]  # the code changed between attempts

    @afk.durable(store=afk.Store(tmp_path / "store"))
    def job(ctx: afk.RunContext) -> str:
        output = str(DurableRunner.run_sync(ctx, agent, prompts[0]).final_output)
        if len(prompts) == 2:
            prompts.pop(0)
            raise RuntimeError("planned failure after the agent ran")
        return output

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="changed")
    with pytest.raises(EffectMismatchError, match=re.escape("openai-agents.model#1")) as caught:
        job.run(run_id="changed")
    # in words, without hashes, and without fork advice that cannot help an agent run
    assert caught.value.differences == [  # type: ignore[attr-defined]
        "message 2 of 2, the user input 'record three items', is not the one the recorded call sent"
    ]
    assert not re.search(r"[0-9a-f]{16}", str(caught.value))


def test_a_renamed_tool_is_a_mismatch_that_names_it(tmp_path: Path, effects_file: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    agent, _ = jobs.scripted_recorder()
    renamed = agent.clone(tools=[dataclasses.replace(agent.tools[0], name="record_item")])
    agents_by_attempt = [agent, renamed]

    @afk.durable(store=afk.Store(tmp_path / "store"))
    def job(ctx: afk.RunContext) -> str:
        output = str(DurableRunner.run_sync(ctx, agents_by_attempt[0], "record").final_output)
        if len(agents_by_attempt) == 2:
            agents_by_attempt.pop(0)
            raise RuntimeError("planned failure after the agent ran")
        return output

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="renamed")
    with pytest.raises(AgentRequestMismatchError) as caught:
        job.run(run_id="renamed")
    assert caught.value.differences == [
        "tool 'record_item' is offered now, not then",
        "tool 'record' was offered then, not now",
    ]


def test_run_needs_a_job_or_a_run_id_and_the_key_a_tool_call() -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner, tool_idempotency_key  # noqa: PLC0415

    agent, _ = jobs.scripted_recorder()
    with pytest.raises(TypeError, match=re.escape("DurableRunner.run(starting_agent, input")):
        DurableRunner.run_sync("not a context", agent, "hi")
    with pytest.raises(TypeError, match=r"outside any @afk\.durable job and without run_id"):
        DurableRunner.run_sync(agent, "hi")
    with pytest.raises(RuntimeError, match="inside a DurableRunner tool call"):
        tool_idempotency_key()


def test_parallel_tool_calls_are_each_journaled_under_their_call_id(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent, function_tool  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    started: list[str] = []

    def both_at_once(items: list[Any]) -> list[Any]:
        done = jobs.tool_outputs(items, prefix="id-")
        if not done:
            return [jobs.tool_call("fetch", {"url": u}, f"id-{u}") for u in "xy"]
        return [jobs.message(" ".join(sorted(done)))]

    @function_tool
    async def fetch(url: str) -> str:
        started.append(url)
        await asyncio.sleep(0.01)  # both calls are in flight together
        return f"page-{url}"

    agent = Agent(name="fetcher", model=jobs.ScriptedModel(both_at_once), tools=[fetch])
    store = afk.Store(tmp_path)

    @afk.durable(store=store)
    async def job(ctx: afk.RunContext) -> str:
        return str((await DurableRunner.run(ctx, agent, "fetch x and y")).final_output)

    assert asyncio.run(job.arun(run_id="parallel")) == "page-x page-y"
    assert sorted(started) == ["x", "y"]
    keys = set(outcome_keys(store, "parallel"))
    assert {"openai-agents.tool.fetch.id-x#1", "openai-agents.tool.fetch.id-y#1"} <= keys


def test_model_responses_are_stored_as_json_and_validated_when_read() -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents.items import ModelResponse  # noqa: PLC0415
    from agents.usage import Usage  # noqa: PLC0415

    from afk_local.integrations.openai_agents.responses import dump_response, load_response  # noqa: PLC0415

    usage = Usage(requests=1, input_tokens=7, output_tokens=3, total_tokens=10)
    response = ModelResponse(
        output=[jobs.tool_call("record", {"item": "a"}, "call-a"), jobs.message("hi")],
        usage=usage,
        response_id="resp_1",
        request_id="req_1",
    )
    stored = dump_response(response)
    plain = json.loads(stored)  # plain JSON, nothing pickled
    assert [item["type"] for item in plain["output"]] == ["function_call", "message"]
    again = load_response(stored)
    assert again.output == response.output
    assert (again.usage.input_tokens, again.usage.total_tokens) == (7, 10)
    assert (again.response_id, again.request_id) == ("resp_1", "req_1")
    with pytest.raises(ValueError, match="no model response"):
        load_response(b'"not a response"')
    with pytest.raises(ValueError):  # an output item of no known type
        load_response(json.dumps({**plain, "output": [{"type": "bogus"}]}).encode())


def test_a_plain_agent_handoff_is_a_journaled_step(tmp_path: Path, effects_file: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    recorder, _ = jobs.scripted_recorder()
    triage = Agent(name="triage", model=jobs.ScriptedModel(jobs.hand_over), handoffs=[recorder])
    store = afk.Store(tmp_path)

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        result = DurableRunner.run_sync(ctx, triage, "record")
        return f"{result.last_agent.name}: {result.final_output}"

    assert job.run(run_id="handoff") == f"recorder: {EXPECTED_OUTPUT}"
    keys = outcome_keys(store, "handoff")
    assert keys[:3] == [
        "openai-agents.model#1",
        "openai-agents.handoff.transfer_to_recorder#1",
        "openai-agents.model#2",
    ]


def test_approval_answers_reject_with_a_message_and_a_wrong_answer_asks_again(
    tmp_path: Path, effects_file: Path
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    store = afk.Store(tmp_path)

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        return str(DurableRunner.run_sync(ctx, jobs.shipper, "ship order 7").final_output)

    with pytest.raises(afk.RunPaused):
        job.run(run_id="ask")
    with pytest.raises(afk.RunPaused) as again:
        afk.resume("ask", store=store, input={"ship-7": "maybe"} | {"other": True})
    assert "ship-7" in again.value.prompt["error"]
    with pytest.raises(afk.RunPaused):
        afk.resume("ask", store=store, input={"ship-7": 3})  # not true, false or a message
    result = afk.resume("ask", store=store, input={"ship-7": "not on a Sunday"})
    assert result == "shipping: not on a Sunday"  # the model was told why
    assert not effects_file.exists()  # nothing shipped


def test_a_session_is_read_and_written_once_per_run(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent, SQLiteSession  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    model = jobs.ScriptedModel(jobs.echo_turn)
    chat = Agent(name="chat", model=model)
    session = SQLiteSession("conversation", str(tmp_path / "history.db"))
    failures = ["once"]

    @afk.durable(store=afk.Store(tmp_path / "store"))
    def job(ctx: afk.RunContext, text: str) -> str:
        output = str(DurableRunner.run_sync(ctx, chat, text, session=session).final_output)
        if failures:
            failures.pop()
            raise RuntimeError("planned failure after the turn")
        return output

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run("hello", run_id="turn-1")
    assert job.run("hello", run_id="turn-1") == "turn 1: hello"  # replayed, not re-added
    assert job.run("again", run_id="turn-2") == "turn 2: again"
    items = asyncio.run(session.get_items())
    assert [item.get("role") for item in items] == ["user", "assistant", "user", "assistant"]
    assert model.requests == 2


def test_many_parallel_calls_of_a_sync_tool_finish(tmp_path: Path) -> None:
    """The SDK runs a sync tool in a default-executor thread; the steps must not take them all."""
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent, function_tool  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    calls = 12  # more than the default executor's threads on a small machine

    def all_at_once(items: list[Any]) -> list[Any]:
        done = jobs.tool_outputs(items, prefix="n-")
        if not done:
            return [jobs.tool_call("double", {"n": n}, f"n-{n}") for n in range(calls)]
        return [jobs.message(str(sum(int(d) for d in done)))]

    @function_tool
    def double(n: int) -> int:
        return 2 * n

    agent = Agent(name="doubler", model=jobs.ScriptedModel(all_at_once), tools=[double])

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        return str(DurableRunner.run_sync(ctx, agent, "double them").final_output)

    assert job.run(run_id="many") == str(sum(2 * n for n in range(calls)))


def test_models_named_by_string_or_set_in_the_run_config_are_journaled(
    tmp_path: Path, effects_file: Path
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent, RunConfig  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    model = jobs.ScriptedModel(jobs.record_twice)
    by_name = Agent(name="by-name", model="scripted", tools=[jobs.record])
    provider = jobs.Provider(model)
    store = afk.Store(tmp_path)

    @afk.durable(store=store)
    def job(ctx: afk.RunContext, config: str) -> str:
        run_config = (
            RunConfig(model_provider=provider) if config == "provider" else RunConfig(model=model)
        )
        result = DurableRunner.run_sync(ctx, by_name, "record", run_config=run_config)
        return str(result.final_output)

    assert job.run("provider", run_id="by-provider") == EXPECTED_OUTPUT
    assert provider.names[0] == "scripted"
    assert job.run("model", run_id="by-config") == EXPECTED_OUTPUT
    assert model.requests == 6
    for run_id in ("by-provider", "by-config"):
        keys = outcome_keys(store, run_id)
        assert [k for k in keys if k.startswith("openai-agents.model")] == [
            f"openai-agents.model#{n}" for n in (1, 2, 3)
        ]


def test_model_calls_take_a_retry_and_a_limit(tmp_path: Path) -> None:
    """Parity with DurableAgent: afk.Retry and afk.Limit on model calls, as on any step."""
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    model = jobs.FlakyModel()
    agent = Agent(name="flaky", model=model)
    store = afk.Store(tmp_path / "store")
    options = {"model_retry": afk.Retry(3, initial=0), "model_limit": afk.Limit("provider", 1)}

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        return str(DurableRunner.run_sync(agent, "hi", **options).final_output)

    assert job.run(run_id="flaky") == "fine"
    assert model.calls == 2
    effects = store.open("flaky").effects()
    tries = [e.status for e in effects if e.kind == "outcome" and e.key == "openai-agents.model#1"]
    assert tries == ["error", "ok"]  # each try journaled, the failed one with its error
    assert (store.root / "limits" / "provider").is_dir()  # the call took a slot
    assert job.run(run_id="flaky") == "fine" and model.calls == 2  # replayed, not asked


def test_a_standalone_run_with_a_model_retry_is_continued_by_its_caller_only(
    tmp_path: Path,
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    store = afk.Store(tmp_path / "store")
    retry = afk.Retry(2, initial=0)
    result = DurableRunner.run_sync(jobs.chat, "hi", run_id="alone", store=store, model_retry=retry)
    assert result.final_output == "turn 1: hi"
    reason = store.read_meta("alone").extra["in_process_only"]
    assert "model_retry" in reason  # a Retry holds exception types: it is not stored
