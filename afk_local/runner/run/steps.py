"""``ctx.step`` and ``ctx.astep``: a call routed through the run's effect journal.

The step's key (its name and how many times the name was used in this scope), the
journaled call with its retry and limit, replay on resume, and the step hook the kill
switch of :mod:`afk_local.testing` uses. A base class of
:class:`~afk_local.runner.run.run_context.RunContext`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
from collections.abc import (
    Awaitable,
    Callable,
)
from typing import Any, TypeVar

from afk_local.journal.replay import idempotency_key
from afk_local.runner.observe.observe import AttemptObservation, StepInfo
from afk_local.runner.run.loops import Scope
from afk_local.runner.run.stopping import defer_stop, raise_deferred_stop
from afk_local.runner.time.durable_time import DurableTime
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry, call_with_retry

T = TypeVar("T")


R = TypeVar("R")


StepHook = Callable[[str, str], None]


_step_hook: StepHook | None = None


_COROUTINE_STEP_THREADS = 256
"""Threads for ``astep`` calls of coroutine functions in flight at once (made as needed)."""


@functools.cache
def _coroutine_step_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads ``astep`` journals coroutine calls in: apart from any loop's executor."""
    return concurrent.futures.ThreadPoolExecutor(
        _COROUTINE_STEP_THREADS, thread_name_prefix="afk-astep"
    )


def set_step_hook(hook: StepHook | None) -> StepHook | None:
    """Install ``hook("step", key)``, called before each ``ctx.step``; returns the previous one.

    For fault-injection tests (see :mod:`afk_local.testing`); never needed in normal use.
    """
    global _step_hook
    previous, _step_hook = _step_hook, hook
    return previous


class Steps(DurableTime):
    """The steps of a run context: ``step``, ``astep``, their keys and the failed step."""

    attempt: int
    _scopes: list[Scope]
    _steps: int
    _observations: tuple[AttemptObservation, ...]
    _in_doubt: Any
    _step_error: tuple[str, BaseException] | None
    _in_flight: set[asyncio.Future[Any]]

    def failed_step(self, error: BaseException) -> str | None:
        """The key of the ``ctx.step`` whose exception ``error`` is (or was raised from)."""
        if self._step_error is None:
            return None
        key, raised = self._step_error
        seen: BaseException | None = error
        for _ in range(16):  # the __cause__/__context__ chain, bounded
            if seen is None:
                return None
            if seen is raised:
                return key
            seen = seen.__cause__ or seen.__context__
        return None

    def _key(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a step name must be a non-empty string, not {name!r}")
        scope = self._scopes[-1]
        count = scope.counters.get(name, 0) + 1
        scope.counters[name] = count
        return f"{scope.prefix}{name}#{count}"

    def next_step_key(self, name: str) -> str:
        """The key the next step named ``name`` will get here (``name#n``); nothing is taken.

        An integration looks the key up in :attr:`effects` before it calls the step, to
        tell in words what differs from a recorded call.
        """
        scope = self._scopes[-1]
        return f"{scope.prefix}{name}#{scope.counters.get(name, 0) + 1}"

    def idempotency_key(self, name: str) -> str:
        """A stable key for an outside call named ``name`` here: equal across attempts."""
        return idempotency_key(self.run_id, f"{self._scopes[-1].prefix}{name}")

    def step(
        self,
        name: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        idempotent: bool | None = None,
        retry: Retry | None = None,
        limit: Limit | None = None,
        **kwargs: Any,
    ) -> R:
        """Call ``fn(*args, **kwargs)`` through the effect journal and return its result.

        The n-th call of ``name`` (within the current ``iterate`` item) has the
        stable key ``name#n``. A finished call is replayed on resume; a call a
        crash cut short is *in doubt*. It is called again, with the same
        idempotency key, when ``fn`` takes an ``idempotency_key`` parameter (it
        gets ``idempotency_key=``, and the service it calls drops the duplicate)
        or when ``idempotent=True``; otherwise, or with ``idempotent=False``, the
        resume stops with :class:`~afk_local.EffectInDoubtError` (settle it, or
        resume with ``in_doubt="retry"`` once you checked). A call that raised is
        run again on a later attempt. Arguments and result must be msgpack-able.

        ``retry=afk.Retry(...)`` tries a failing call again, each try journaled with
        its error and the backoff between tries a durable :meth:`sleep`; past its
        attempts the last error is raised. ``limit=afk.Limit(...)`` waits for a place
        under a limit shared by every process of the store before the call runs (a
        replayed call waits for nothing). The names ``retry`` and ``limit`` are
        therefore not passed on to ``fn``.

        >>> def charge(amount, *, idempotency_key):  # doctest: +SKIP
        ...     return payments.charge(amount, idempotency_key=idempotency_key)
        >>> receipt = ctx.step("charge", charge, 5)  # doctest: +SKIP
        """
        key = self._key(name)
        return self._step(
            key, name, fn, args=args, kwargs=kwargs, idempotent=idempotent, retry=retry, limit=limit
        )

    def _step(
        self,
        key: str,
        name: str,
        fn: Callable[..., R],
        *,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        idempotent: bool | None,
        retry: Retry | None,
        limit: Limit | None,
    ) -> R:
        """:meth:`step` once its key is chosen (``astep`` chooses it on the event loop)."""
        if not isinstance(retry, (Retry, type(None))) or not isinstance(limit, (Limit, type(None))):
            raise TypeError(f"step {name!r}: retry= takes an afk.Retry, limit= an afk.Limit")
        self._steps += 1
        journal = self._writer.effects
        known = journal.lookup(key)
        number = self._report.step_started(known is not None)
        if _step_hook is not None:
            _step_hook("step", key)
        try:
            with contextlib.ExitStack() as observed:
                if self._observations:
                    replayed = known is not None and known.status == "ok"
                    info = StepInfo(
                        self.run_id, self.attempt, key, name, number, self._writer.run.seq, replayed
                    )
                    for observation in self._observations:
                        observed.enter_context(observation.step(info))

                def attempt() -> R:
                    # SIGTERM waits for the outcome (defer_stop): a stopped step is not in doubt
                    with self._limited(journal, key, limit), defer_stop():
                        called: R = journal.call(
                            key,
                            fn,
                            args,
                            kwargs,
                            name=name,
                            step=number,
                            idempotent=idempotent,
                            in_doubt=self._in_doubt,
                            retry_errors=True,
                        )
                    return called

                if retry is None:
                    result = attempt()
                else:
                    result = call_with_retry(journal, key, retry, attempt, self._backoff)
        except BaseException as exc:
            self._step_error = (key, exc)
            raise
        return result

    async def astep(
        self,
        name: str,
        fn: Callable[..., Awaitable[R]] | Callable[..., R],
        /,
        *args: Any,
        idempotent: bool | None = None,
        **kwargs: Any,
    ) -> R:
        """The async twin of :meth:`step`: ``fn`` may be a coroutine function.

        The journal's fsyncs run in a worker thread, so the event loop keeps going.
        """
        loop = asyncio.get_running_loop()
        threads: concurrent.futures.Executor | None = None  # the loop's default executor
        if inspect.iscoroutinefunction(fn):
            coroutine_fn = fn

            @functools.wraps(fn)
            def call_sync(*a: Any, **kw: Any) -> Any:
                running = asyncio.run_coroutine_threadsafe(coroutine_fn(*a, **kw), loop)
                try:
                    return running.result()
                except concurrent.futures.CancelledError:
                    # Cancelled part-way (the loop shut down under it): it may or may not
                    # have done its effect, so it stays in doubt, never a recorded error
                    # that a resume would run again.
                    raise asyncio.CancelledError from None

            target: Callable[..., Any] = call_sync
            # The thread waits for the coroutine, which runs on this loop and may need the
            # loop's default executor itself (asyncio.to_thread, a sync tool of an agent
            # framework): with as many such steps in flight as that executor has threads,
            # the coroutines would wait for threads held by the steps waiting for them.
            threads = _coroutine_step_threads()
        else:
            target = fn
        # The key is chosen here, on the event loop, in the order the astep calls were
        # made: chosen in the worker threads, two concurrent calls of one name could swap
        # keys between attempts and each replay the other's result.
        key = self._key(name)
        retry, limit = kwargs.pop("retry", None), kwargs.pop("limit", None)
        step = functools.partial(
            contextvars.copy_context().run,  # as asyncio.to_thread does
            self._step,
            key,
            name,
            target,
            args=args,
            kwargs=kwargs,
            idempotent=idempotent,
            retry=retry,
            limit=limit,
        )
        journaled = loop.run_in_executor(threads, step)
        self._in_flight.add(journaled)
        journaled.add_done_callback(self._in_flight.discard)
        try:
            result: R = await asyncio.shield(journaled)
        except asyncio.CancelledError:
            # Cancelled while the call runs (a parallel sibling failed): the call goes on
            # in its thread, so wait until its outcome is journaled; left behind, it would
            # be in doubt although it finished, or wait for a loop that no longer runs.
            await _outlast_cancellation(journaled)
            raise
        raise_deferred_stop()  # a Ctrl-C or SIGTERM that waited for this step's outcome
        return result

    async def wait_for_steps(self) -> None:
        """Wait until every :meth:`astep` call started in this event loop has ended.

        A framework that cancels a running call and moves on (a parallel sibling failed)
        leaves the call running in its thread; awaited here before the loop ends, its
        outcome is journaled as it ends, rather than cut short by the loop's shutdown.
        """
        loop = asyncio.get_running_loop()
        for journaled in [f for f in self._in_flight if f.get_loop() is loop]:
            await _outlast_cancellation(journaled)


async def _outlast_cancellation(journaled: asyncio.Future[Any]) -> None:
    """Wait for a journaled call whose awaiter was cancelled to end, whatever its outcome."""
    while not journaled.done():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(journaled)
    if not journaled.cancelled():
        journaled.exception()  # retrieved: its error is the call's, already journaled
