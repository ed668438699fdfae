"""Concurrent ``ctx.astep`` calls of one name get their keys in the order they were made.

``astep`` runs the journaled call in a worker thread; the key (``name#n``) used to be
chosen there too, in whatever order the threads happened to start, so a retried
attempt could give a replayed call another call's key: an ``EffectMismatchError`` (its
input differs) where every finished call should simply replay. The test runs the
calls' threads in the reverse of the order they were made (an executor that waits for
all of them, then runs them last first), which no thread pool promises not to do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import afk_local as afk

CALLS = 24


class LastFirstExecutor(concurrent.futures.ThreadPoolExecutor):
    """Holds every submitted call until ``CALLS`` are in, then runs them newest first."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self._held: list[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._held.append((future, lambda: fn(*args, **kwargs)))
        if len(self._held) == CALLS:
            held, self._held = self._held, []
            threading.Thread(target=self._run, args=(held[::-1],), daemon=True).start()
        return future

    @staticmethod
    def _run(calls: list[tuple[concurrent.futures.Future[Any], Callable[[], Any]]]) -> None:
        for future, call in calls:
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the awaiting task
                future.set_exception(exc)


def test_gathered_asteps_of_one_name_replay_each_their_own_result(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    calls: list[int] = []
    attempts: list[int] = []

    def fetch(i: int) -> int:
        calls.append(i)
        return i * i

    @afk.durable(store=store)
    async def job(ctx: afk.RunContext) -> list[int]:
        asyncio.get_running_loop().set_default_executor(LastFirstExecutor())
        attempts.append(ctx.attempt)
        results = await asyncio.gather(*(ctx.astep("fetch", fetch, i) for i in range(CALLS)))
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails after its steps")
        return list(results)

    with contextlib.suppress(RuntimeError):
        job.run(run_id="r")
    assert calls == list(range(CALLS))[::-1]  # the threads ran last first
    effects = store.open("r").effects()
    by_key = {e.key: e.result for e in effects if e.kind == "outcome"}
    assert by_key == {f"fetch#{i + 1}": i * i for i in range(CALLS)}  # keys in call order
    assert job.run(run_id="r") == [i * i for i in range(CALLS)]  # the retry replays them all
    assert sorted(calls) == list(range(CALLS))  # and runs none again
