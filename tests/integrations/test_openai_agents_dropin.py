"""DurableRunner called as ``Runner.run`` is: in a job without its ctx, and standalone.

In one process: the drop-in form finds the job's context (the body, its asyncio tasks, a
plain thread), a standalone run is a run of its own (its stored result answers a second
call), and the conversation of each kind of run is read back through the real CLI.
Killed processes on a standalone run, resumed by ``afk-local resume`` and the watcher:
test_openai_agents_crash.py; the drop-in form under SIGKILL: ``agent_job`` there.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import proc
import pytest
from openai_agents_procs import EXPECTED_OUTPUT

import afk_local as afk
from afk_local.runner.code.origin import cannot_resume
from afk_local.runner.run.current import current_run_context


@pytest.fixture(autouse=True)
def _needs_agents() -> None:
    """The tests need agents: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "agents", reason="openai-agents not installed: pip install 'afk_local[test-all]'"
    )


@pytest.fixture(autouse=True)
def effects_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.txt"
    monkeypatch.setenv("OA_EFFECTS", str(path))
    monkeypatch.delenv("OA_MODEL_LOG", raising=False)
    monkeypatch.delenv("OA_PLAIN_TOOL", raising=False)
    return path


def test_the_drop_in_form_makes_each_call_a_step_of_the_jobs_run(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    agent, model = jobs.scripted_recorder()
    store = afk.Store(tmp_path / "store")
    failures = ["once"]

    @afk.durable(store=store)
    def job(ctx: afk.RunContext, prompt: str) -> str:
        result = DurableRunner.run_sync(agent, prompt, idempotent_tools={"record"})
        if failures:
            failures.pop()
            raise RuntimeError("planned failure after the agent ran")
        return str(result.final_output)

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run("record two items", run_id="dropin")
    assert job.run(run_id="dropin") == EXPECTED_OUTPUT
    assert model.requests == 3  # the second attempt replayed every answer from the journal
    keys = [e.key for e in store.open("dropin").effects() if e.kind == "outcome"]
    assert keys[0] == "openai-agents.model#1" and len(keys) == 5


def test_the_context_is_found_in_tasks_and_threads_the_job_starts(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    agent, model = jobs.scripted_recorder()
    found: list[object] = []

    @afk.durable(store=afk.Store(tmp_path / "store"))
    async def job(ctx: afk.RunContext) -> str:
        # an asyncio task the body starts copies its context
        task = asyncio.create_task(DurableRunner.run(agent, "record two items"))
        result = await task
        # a plain thread (no copied context): found because one job body runs here
        thread = threading.Thread(target=lambda: found.append(current_run_context()))
        thread.start()
        thread.join()
        found.append(ctx)
        return str(result.final_output)

    assert asyncio.run(job.arun(run_id="tasks")) == EXPECTED_OUTPUT
    assert found[0] is found[1]
    assert model.requests == 3
    assert current_run_context() is None  # outside any job body


def test_a_plain_thread_is_ambiguous_while_two_job_bodies_run(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    started, release = threading.Event(), threading.Event()
    seen: list[object] = []

    @afk.durable(store=store)
    def waiting(ctx: afk.RunContext) -> int:
        started.set()
        release.wait(60)
        return 1

    @afk.durable(store=store)
    def asking(ctx: afk.RunContext) -> int:
        seen.append(current_run_context() is ctx)  # its own, through the context variable

        def in_thread() -> None:
            try:
                seen.append(current_run_context())
            except RuntimeError as exc:
                seen.append(str(exc))

        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join()
        return 2

    other = threading.Thread(target=lambda: waiting.run(run_id="waiting"))
    other.start()
    try:
        assert started.wait(60)
        assert asking.run(run_id="asking") == 2
    finally:
        release.set()
        other.join()
    assert seen[0] is True
    assert "2 durable job bodies run in this process" in str(seen[1])


def test_a_standalone_run_is_a_run_and_a_finished_one_answers_from_disk(
    tmp_path: Path, effects_file: Path
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415
    from afk_local.integrations.openai_agents.standalone import STANDALONE_ENTRYPOINT  # noqa: PLC0415

    store = afk.Store(tmp_path / "store")
    first = DurableRunner.run_sync(
        jobs.recorder, "record two items", run_id="alone", store=store, idempotent_tools={"record"}
    )
    assert first.final_output == EXPECTED_OUTPUT
    assert len(effects_file.read_text().splitlines()) == 2

    again = DurableRunner.run_sync(
        jobs.recorder, "record two items", run_id="alone", store=store, idempotent_tools={"record"}
    )
    assert (again.final_output, again.last_agent) == (EXPECTED_OUTPUT, jobs.recorder)
    assert len(effects_file.read_text().splitlines()) == 2  # nothing ran again

    meta = store.read_meta("alone")
    assert meta.status == "completed"
    assert meta.entrypoint == STANDALONE_ENTRYPOINT
    assert meta.extra["kind"] == "openai-agents"
    assert meta.params is not None and meta.params["args"][0] == "openai_agents_jobs:recorder"
    assert cannot_resume(meta) is None  # a module-level agent: any process continues it


def test_a_standalone_run_says_when_only_this_code_can_continue_it(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    store = afk.Store(tmp_path / "store")
    agent, _ = jobs.scripted_recorder()  # made in a function: no module holds it
    DurableRunner.run_sync(agent, "record two items", run_id="local", store=store)
    assert "not at the top level of an importable module" in (
        cannot_resume(store.read_meta("local")) or ""
    )
    DurableRunner.run_sync(
        jobs.recorder, "record two items", run_id="ctx", store=store, context={"user": 1}
    )
    assert "Runner.run arguments (context)" in (cannot_resume(store.read_meta("ctx")) or "")
    with pytest.raises(TypeError, match=r"DurableRunner\.run\(starting_agent, input"):
        DurableRunner.run_sync(object(), agent, "hi", run_id="x")  # not a ctx: refused
    with pytest.raises(TypeError, match="store= without run_id="):
        DurableRunner.run_sync(agent, "hi", store=store)


def test_a_finished_standalone_run_gives_its_output_back_as_its_type(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415
    from agents import Agent  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    model = jobs.ScriptedModel(lambda items: [jobs.message('{"customer":"ada","amount":42}')])
    agent = Agent(name="biller", model=model, output_type=jobs.Invoice)
    first = DurableRunner.run_sync(agent, "bill ada", run_id="bill", store=tmp_path)
    again = DurableRunner.run_sync(agent, "bill ada", run_id="bill", store=tmp_path)
    assert first.final_output == again.final_output == jobs.Invoice(customer="ada", amount=42)
    assert isinstance(again.final_output, jobs.Invoice)
    assert model.requests == 1


def test_a_run_journaled_before_requests_were_kept_still_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner, journaled  # noqa: PLC0415

    agent, model = jobs.scripted_recorder()
    store = afk.Store(tmp_path / "store")
    old_dump = journaled.dump_response
    monkeypatch.setattr(
        journaled, "dump_response", lambda response, request=None: old_dump(response)
    )
    failures = ["once"]

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        result = DurableRunner.run_sync(agent, "record two items", idempotent_tools={"record"})
        if failures:
            failures.pop()
            raise RuntimeError("planned failure after the agent ran")
        return str(result.final_output)

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="old")
    monkeypatch.setattr(journaled, "dump_response", old_dump)
    assert job.run(run_id="old") == EXPECTED_OUTPUT
    assert model.requests == 3
    entries = cli_json(store.root, "inspect", "old", "--conversation", "--json")["entries"]
    assert [e["role"] for e in entries][:2] == ["tool_call", "tool_result"]  # no user: not kept
    assert entries[-1] == {"role": "assistant", "text": EXPECTED_OUTPUT}


def cli(root: Path, *args: str) -> str:
    """``python -m afk_local --root ROOT args...`` in a child (it does not import the SDK)."""
    env = {k: v for k, v in os.environ.items() if k != "AFK_LOCAL_ROOT"}
    done = proc.python(["-m", "afk_local", "--root", str(root), *args], env=env, timeout=120)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def cli_json(root: Path, *args: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(cli(root, *args))
    return found


def test_the_conversation_of_each_kind_of_run_through_the_cli(tmp_path: Path) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    store = afk.Store(tmp_path / "store")
    DurableRunner.run_sync(
        jobs.recorder, "record two items", run_id="alone", store=store, idempotent_tools={"record"}
    )
    jobs.handoff_job.with_store(store).run("record", run_id="handed")
    session = jobs.RunSession("chat", store=store)
    for text in ("hello", "again"):
        asyncio.run(jobs.Runner.run(jobs.chat, text, session=session))

    shown = cli(store.root, "show", "alone")
    assert "user: record two items" in shown
    assert 'tool_call record: {"item": "a"}' in shown
    assert "tool_result record: a-ok" in shown
    assert f"assistant: {EXPECTED_OUTPUT}" in shown

    handed = cli_json(store.root, "inspect", "handed", "--conversation", "--json")
    assert handed["source"] == "openai-agents"
    roles = [(e["role"], e.get("tool")) for e in handed["entries"]]
    assert roles == [
        ("user", None),
        ("tool_call", "transfer_to_recorder"),
        ("handoff", "transfer_to_recorder"),
        ("tool_call", "record"),
        ("tool_result", "record"),
        ("tool_call", "record"),
        ("tool_result", "record"),
        ("assistant", None),
    ]
    assert handed["entries"][2]["text"] == "to recorder"

    chat = cli(store.root, "inspect", "chat", "--conversation").splitlines()
    assert chat == [
        "user: hello",
        "assistant: turn 1: hello",
        "user: again",
        "assistant: turn 2: again",
    ]


def test_a_repeated_user_message_is_shown_and_a_repeated_call_without_id_is_not(
    tmp_path: Path,
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    def once_then_answer(items: list[Any]) -> list[Any]:
        if not jobs.tool_outputs(items):
            call = jobs.tool_call("record", {"item": "a"}, "call-a").model_copy(update={"id": None})
            return [call]
        return [jobs.message("noted")]

    agent = jobs.recorder.clone(model=jobs.ScriptedModel(once_then_answer))
    store = afk.Store(tmp_path / "store")

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        session = jobs.RunSession("twice-chat", store=ctx.store)
        for _ in range(2):  # the second turn sends the first one's items again
            DurableRunner.run_sync(agent, "hi", session=session, idempotent_tools={"record"})
        return "ok"

    job.run(run_id="twice")
    entries = cli_json(store.root, "inspect", "twice", "--conversation", "--json")["entries"]
    assert [(e["role"], e["text"]) for e in entries] == [
        ("user", "hi"),
        ("tool_call", '{"item": "a"}'),
        ("tool_result", "a-ok"),
        ("assistant", "noted"),
        ("user", "hi"),
        ("assistant", "noted"),
    ]


def test_a_standalone_approval_pause_is_answered_by_afk_resume(
    tmp_path: Path, effects_file: Path
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    store = afk.Store(tmp_path / "store")
    with pytest.raises(afk.RunPaused):
        DurableRunner.run_sync(jobs.shipper, "ship order 7", run_id="ship", store=store)
    assert not effects_file.exists()  # nothing shipped before the answer
    # answered the way another process does: the agent is found by its module-level name
    result = afk.resume("ship", input={"ship-7": True}, store=store)
    assert result == {"final_output": "shipping: order 7 shipped", "last_agent": "shipper"}
    assert effects_file.read_text() == "ship 7\n"
    again = DurableRunner.run_sync(jobs.shipper, "ship order 7", run_id="ship", store=store)
    assert again.final_output == "shipping: order 7 shipped"
