"""RunSession: the Agents SDK's session protocol on a run's files.

In-process: the protocol (get/add/pop/clear, limits), the files, refusals. Real
processes: a durable job using the session is SIGKILLed mid-turn and resumed; a new
process reads the conversation, each item once.
"""

from __future__ import annotations

import asyncio
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from advice import follow
from openai_agents_procs import EXPECTED_OUTPUT, effects, env_for, kill_at
from proc import afk_local_cli

import afk_local as afk
from afk_local.cli import main
from afk_local.errors import InvalidRunIdError, RunLockedError


@pytest.fixture(autouse=True)
def _needs_agents() -> None:
    """The tests need agents: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "agents", reason="openai-agents not installed: pip install 'afk_local[test-all]'"
    )


def test_the_session_protocol_on_a_runs_files(tmp_path: Path) -> None:
    from agents import Session  # noqa: PLC0415

    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    store = afk.Store(tmp_path)
    session = RunSession("chat-1", store=store)
    assert isinstance(session, Session)  # the SDK's protocol

    async def talk() -> None:
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "hi"}])
        await session.add_items([{"role": "assistant", "content": "hello"}, USER_AGAIN])
        await session.add_items([])
        assert await session.get_items(limit=2) == [
            {"role": "assistant", "content": "hello"},
            USER_AGAIN,
        ]
        assert await session.pop_item() == USER_AGAIN
        # another session object (another process) reads what this one wrote
        assert await RunSession("chat-1", store=store).get_items() == [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
        await session.clear_session()
        assert await session.get_items() == []

    asyncio.run(talk())
    reader = store.open("chat-1")
    assert reader.meta.status == "paused"  # a conversation waits for its next message
    assert not store.owner_alive("chat-1")  # the lock is held for a change only
    run_dir = store.paths("chat-1").dir
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


USER_AGAIN = {"role": "user", "content": "again"}


def test_a_keyed_add_is_made_once_and_settings_limit_reads(tmp_path: Path) -> None:
    from agents.memory import SessionSettings  # noqa: PLC0415

    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    session = RunSession(
        "chat-2", store=afk.Store(tmp_path), session_settings=SessionSettings(limit=1)
    )

    async def add_twice() -> list[Any]:
        await session.add_items([USER_AGAIN], idempotency_key="k1")
        await session.add_items([USER_AGAIN], idempotency_key="k1")  # a resume's repeat
        await session.add_items([{"role": "user", "content": "third"}])
        return await session.get_items(limit=None)

    assert asyncio.run(add_twice()) == [{"role": "user", "content": "third"}]
    assert asyncio.run(session.get_items(limit=5)) == [
        USER_AGAIN,
        {"role": "user", "content": "third"},
    ]


def test_a_change_waits_for_another_writer_of_the_conversation(tmp_path: Path) -> None:
    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    store = afk.Store(tmp_path)
    session = RunSession("chat-4", store=store)
    asyncio.run(session.add_items([USER_AGAIN]))
    holding = threading.Event()
    release = threading.Event()

    def hold_the_lock() -> None:
        with store.resume_writer("chat-4", new_attempt=False):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    holding.wait(30)
    threading.Timer(0.2, release.set).start()  # the other change ends while this one waits
    asyncio.run(session.add_items([{"role": "user", "content": "after"}]))
    holder.join()
    assert asyncio.run(session.get_items()) == [USER_AGAIN, {"role": "user", "content": "after"}]
    with pytest.raises(RunLockedError), store.resume_writer("chat-4", new_attempt=False):
        asyncio.run(RunSession("chat-4", store=store, lock_timeout=0).add_items([USER_AGAIN]))


def test_bad_session_ids_and_foreign_runs_are_refused(tmp_path: Path) -> None:
    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    store = afk.Store(tmp_path)
    with pytest.raises(InvalidRunIdError):
        RunSession("../escape", store=store)
    with store.create("a-job") as run:  # a run that is not a conversation
        run.checkpoint("runtime_state", {"state": {}}, step=1)
    with pytest.raises(ValueError, match="not a RunSession conversation"):
        asyncio.run(RunSession("a-job", store=store).get_items())


def test_the_plain_runner_keeps_its_conversation_in_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    monkeypatch.setenv("AFK_LOCAL_ROOT", str(tmp_path))
    assert jobs.chat_turn("chat-3", "hello") == "turn 1: hello"
    assert jobs.chat_turn("chat-3", "again") == "turn 2: again"  # it saw the first turn
    items = asyncio.run(RunSession("chat-3", store=afk.Store(tmp_path)).get_items())
    assert [item["role"] for item in items] == ["user", "assistant", "user", "assistant"]


SESSION = """
import sys
import openai_agents_jobs
print("OUTPUT " + openai_agents_jobs.session_job.run("notes", "record", run_id=sys.argv[1]))
"""


def test_a_run_session_keeps_the_history_once_across_a_kill(tmp_path: Path) -> None:
    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    kill_at(env, "TOOL b", "noted", script=SESSION)  # the session holds the first turn's items

    done = afk_local_cli(env, "--root", str(root), "resume", "noted")
    assert done.returncode == 0, done.stderr
    assert effects(files) == ["a", "b"]
    assert afk.Store(root).open("noted").resume_state().result == EXPECTED_OUTPUT

    # the conversation, read here from the session's run: each item once
    items: list[Any] = asyncio.run(RunSession("notes", store=afk.Store(root)).get_items())
    kinds = [item.get("type", item.get("role")) for item in items]
    assert kinds == [
        "user",
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[0]["content"] == "record"
    assert [i["output"] for i in items if i.get("type") == "function_call_output"] == [
        "a-ok",
        "b-ok",
    ]


def test_an_approval_pause_keeps_the_session_history_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai_agents_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner, RunSession  # noqa: PLC0415

    monkeypatch.setenv("OA_EFFECTS", str(tmp_path / "effects.txt"))
    store = afk.Store(tmp_path / "store")

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        session = RunSession("shipping", store=ctx.store)
        return str(
            DurableRunner.run_sync(ctx, jobs.shipper, "ship order 7", session=session).final_output
        )

    with pytest.raises(afk.RunPaused):
        job.run(run_id="ship")
    assert afk.resume("ship", store=store, input={"ship-7": True}) == "shipping: order 7 shipped"
    items = asyncio.run(RunSession("shipping", store=store).get_items())
    kinds = [item.get("type", item.get("role")) for item in items]
    assert kinds == ["user", "function_call", "function_call_output", "message"]


def test_a_session_id_taken_by_another_run_advises_commands_that_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from afk_local.integrations.openai_agents import RunSession  # noqa: PLC0415

    store = afk.Store(tmp_path)
    params = {"args": [3, str(tmp_path / "out")], "kwargs": {}}
    with store.create("chat", entrypoint="cli_jobs:count_job", params=params) as run:
        run.checkpoint("runtime_state", {"state": {}, "cursors": {}}, step=0)  # a crashed job
    with pytest.raises(ValueError, match="is not a RunSession conversation") as refused:
        asyncio.run(RunSession("chat", store=store).get_items())

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    results = follow(cli, str(refused.value), root=store.root)  # cancel, then rm --force
    assert [code for code, _ in results] == [0, 0], results
    assert asyncio.run(RunSession("chat", store=store).get_items()) == []
