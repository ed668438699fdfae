"""What a durable job runs with: :class:`RunContext` (``step``, ``state``, ``iterate``, ``pause``).

``ctx.step`` routes a call through the run's effect journal (replayed on
resume), ``ctx.state`` is checkpointed with the loop positions of
``ctx.iterate``, and ``ctx.pause`` waits for a person. The job function
re-runs from the top on every attempt; these make that cheap and safe.
``ctx.metric``, ``ctx.progress`` and ``ctx.tags`` say how the run is doing
(:mod:`.run_report`, :mod:`.tags`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import datetime as dt
import functools
import inspect
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from typing import Any, TypeVar

import msgspec

from afk_local.errors import ReplayDivergence, RunPaused, UnstorableValueError
from afk_local.journal.journal import Journal
from afk_local.journal.replay import idempotency_key
from afk_local.journal.replaying import PATCH_PREFIX, ReplayJournal
from afk_local.runner.observe.observe import AttemptObservation, StepInfo
from afk_local.runner.observe.progress import Progress
from afk_local.runner.observe.run_report import Reporting, RunReport
from afk_local.runner.run.loops import Loop, Scope, as_async, total_of
from afk_local.runner.run.stopping import defer_stop, raise_deferred_stop
from afk_local.runner.run.tags import SLOT_TAG_KEY, RunTags
from afk_local.runner.time.durable_time import DurableTime
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry, call_with_retry
from afk_local.runner.writer import DurableWriter
from afk_local.storage.format.records import Phase
from afk_local.storage.store import Store
from afk_local.storage.views.run_info import tags_of
from afk_local.storage.views.run_progress import PROGRESS_KEY

T = TypeVar("T")
R = TypeVar("R")

StepHook = Callable[[str, str], None]

NO_INPUT: Any = object()
"""The ``input_value`` of an attempt that answers no pause."""
PAUSE_NAME = "@pause"
"""The name of the journaled call that holds a pause's answer (the effects show it)."""
_PAUSE = PAUSE_NAME

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


class RunContext(Reporting, DurableTime):
    """What a durable function gets as its first argument.

    Attributes:
        run_id: the run's id.
        attempt: 1 for the first process that ran it, +1 for every resume.
        resumed: True when this call continues an earlier attempt.
        state: a dict of msgpack-able data saved with every checkpoint and
            restored on resume (initialise it with ``setdefault``: the function
            re-runs from the top).
        store: the store the run lives in.
        park_after: a ``sleep`` (or retry backoff) longer than this many seconds
            parks the run (see :meth:`sleep`); None never parks.
    """

    def __init__(
        self,
        writer: DurableWriter,
        store: Store,
        *,
        state: dict[str, Any],
        cursors: dict[str, Any],
        version: str | None,
        attempt: int,
        resumed: bool,
        input_value: Any = NO_INPUT,
        in_doubt: Any = None,
        report: RunReport | None = None,
        observations: tuple[AttemptObservation, ...] = (),
        patches: dict[str, bool] | None = None,
    ) -> None:
        self.run_id = writer.run_id
        self.attempt = attempt
        self.resumed = resumed
        self.state = state
        self.store = store
        self._writer = writer
        self._cursors = cursors
        self._version = version
        self._input = input_value
        self._in_doubt = in_doubt
        self._scopes = [Scope("", {})]
        self._steps = 0
        self._report = report if report is not None else RunReport()
        self._observations = observations
        self._tags: RunTags | None = None
        self._step_error: tuple[str, BaseException] | None = None
        self._patches = patches or {}  # decided by the replay check a resume ran first
        self._in_flight: set[asyncio.Future[Any]] = set()  # astep calls not ended yet

    def __repr__(self) -> str:
        return f"RunContext(run_id={self.run_id!r}, attempt={self.attempt}, steps={self._steps})"

    @property
    def effects(self) -> Journal:
        """The run's effect journal (for custom replay logic)."""
        return self._writer.effects

    @property
    def writer(self) -> DurableWriter:
        """The run's writer (durability mode, flush)."""
        return self._writer

    @property
    def steps(self) -> int:
        """How many ``step`` calls this attempt made so far (replayed ones included)."""
        return self._steps

    @property
    def tags(self) -> RunTags:
        """The run's tags (``{str: str}``); setting one rewrites ``run.meta`` at once."""
        if self._tags is None:
            self._tags = RunTags(self._writer)
        return self._tags

    @property
    def scheduled_slot(self) -> dt.datetime | None:
        """The slot (UTC) a schedule started this run for; None for a run no schedule made.

        Read from the run's ``schedule.slot`` tag, which the watcher sets when it creates
        the run, so a run started late (machine off, catch-up) still knows which slot it
        is for.
        """
        slot = tags_of(self._writer.run.meta.extra).get(SLOT_TAG_KEY)
        if slot is None:
            return None
        try:
            return dt.datetime.fromisoformat(slot)
        except ValueError:
            return None

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

    # -- steps --------------------------------------------------------------------

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

    # -- checkpoints and loops ------------------------------------------------------

    def checkpoint(self) -> None:
        """Persist ``ctx.state`` (and the loop positions) now, per the durability mode.

        The checkpoint also carries the run's progress and the metric points
        recorded since the previous one.
        """
        report = self._report
        payload = {
            "state": self.state,
            "cursors": self._cursors,
            "version": self._version,
            PROGRESS_KEY: report.progress_payload(),
        }
        metrics = report.take_metrics()
        try:
            self._writer.checkpoint(
                Phase.RUNTIME_STATE, payload, step=report.steps, metrics=metrics
            )
        except UnstorableValueError:
            report.put_back(metrics)  # nothing was written: they go with the next one
            raise  # it names the value's path (state.model.weights) and type
        except (TypeError, msgspec.EncodeError) as exc:
            report.put_back(metrics)
            raise TypeError(
                f"run {self.run_id!r}: ctx.state must hold msgpack-able data (dict, list, str, "
                f"int, float, bool, None, bytes, datetime, msgspec Structs): {exc}"
            ) from exc

    def iterate(
        self,
        items: Iterable[T],
        key: Callable[[T], str | int] | None = None,
        *,
        name: str | None = None,
        progress: bool = True,
    ) -> Iterator[T]:
        """Yield the items not done yet; after the loop body for one returns, checkpoint.

        Args:
            items: any iterable; it must yield the same items in the same order
                on resume when ``key`` is None (positions identify items).
            key: ``key(item)`` identifies items instead of positions (use it when
                the order may change between attempts).
            name: the loop's name in the checkpoint (default ``iterate#n``).
            progress: show progress on stderr (tqdm when installed, rich or one
                line on a terminal, periodic lines in a log; see :mod:`.progress`);
                ``False`` for none.

        An item whose body raised or did ``break`` is not done. Steps inside the
        body get keys scoped to the item, so skipped items do not shift them. The
        items of a loop not nested in another loop's item are the run's progress
        (n/N in ``afk-local runs``), unless :meth:`progress` declared another.
        """
        loop, total = self._open_loop(items, key, name)
        bar = Progress(total, loop.done_count(), desc=loop.name, enabled=self._shows(progress))
        return self._loop(items, loop, bar)

    def _open_loop(
        self, items: Iterable[Any], key: Callable[[Any], Any] | None, name: str | None
    ) -> tuple[Loop, int | None]:
        outer = len(self._scopes) == 1
        loop = Loop.open(self._cursors, self._scopes[-1], items, key, name, outer=outer)
        total = total_of(items)
        if outer:
            self._report.loop_opened(total, loop.done_count())
        return loop, total

    def _loop(self, items: Iterable[T], loop: Loop, bar: Progress) -> Iterator[T]:
        try:
            for index, item in enumerate(items):
                ident = loop.pending(index, item)
                if ident is None:
                    continue
                with self._item_scope(loop, ident, index):
                    yield item
                self._item_done(loop, index, ident)
                bar.update()
        finally:
            bar.close()

    async def aiterate(
        self,
        items: Iterable[T] | AsyncIterable[T],
        key: Callable[[T], str | int] | None = None,
        *,
        name: str | None = None,
        progress: bool = True,
    ) -> AsyncIterator[T]:
        """The async twin of :meth:`iterate`: ``async for item in ctx.aiterate(items)``."""
        loop, total = self._open_loop(items, key, name)  # type: ignore[arg-type]
        bar = Progress(total, loop.done_count(), desc=loop.name, enabled=self._shows(progress))
        source: AsyncIterator[T] = (
            aiter(items) if isinstance(items, AsyncIterable) else as_async(iter(items))
        )
        try:
            index = -1
            async for item in source:
                index += 1
                ident = loop.pending(index, item)
                if ident is None:
                    continue
                with self._item_scope(loop, ident, index):
                    yield item
                await asyncio.to_thread(self._item_done, loop, index, ident)
                bar.update()
        finally:
            bar.close()

    def _shows(self, progress: bool) -> bool:
        """Whether a loop shows its progress: never while its run is only replayed."""
        return progress and not self._writer.effects.replaying

    @contextlib.contextmanager
    def _item_scope(self, loop: Loop, ident: str, index: int) -> Iterator[None]:
        """Scope the steps of the loop body to this item, so skipped items do not shift keys.

        Metrics recorded meanwhile default to the item's ``index`` as their step.
        """
        scope = loop.item_scope(ident)
        self._scopes.append(scope)
        outer_index, self._report.item_index = self._report.item_index, index
        try:
            yield
        finally:
            self._report.item_index = outer_index
            self._drop_scope(scope)

    def _item_done(self, loop: Loop, index: int, ident: str) -> None:
        loop.mark_done(index, ident, self._cursors)
        if loop.outer:
            self._report.item_done(loop.done_count())
        self.checkpoint()

    def _drop_scope(self, scope: Scope) -> None:
        for i in range(len(self._scopes) - 1, 0, -1):
            if self._scopes[i] is scope:
                del self._scopes[i]
                return

    # -- code changes -----------------------------------------------------------------

    def patched(self, patch_id: str) -> bool:
        """True where the code may take its new branch ``patch_id``; False where a run's
        journal already went past this point without it.

        Put a change to a job with runs in flight behind it, so that those runs keep
        doing what they recorded and new ones (and each run from the point it reaches
        live) take the new path::

            for item in items:
                if ctx.patched("fee"):
                    ctx.step("fee", charge_fee, item)
                ctx.step("charge", charge, item)

        The decision is journaled where it is made, so it never flips on a later
        resume. Once no run needs the old branch any more, replace the call by
        :meth:`deprecate_patch` (``afk-local replay --all`` lists the runs that still
        take an old branch), and later remove both.
        """
        key = self._key(PATCH_PREFIX + _patch_id(patch_id))
        journal = self._writer.effects
        known = journal.lookup(key)
        if known is not None and known.status == "ok" and known.outcome is not None:
            return known.outcome.result is True
        if isinstance(journal, ReplayJournal):
            decision = not journal.passed()
            journal.patch_decisions[key] = decision
            return decision
        decision = self._patches.get(key, True)
        journal.record_outcome(key, status="ok", result=decision)
        return decision

    def deprecate_patch(self, patch_id: str) -> None:
        """Say that the old branch of ``patch_id`` is gone: the code takes the new one only.

        A run whose journal recorded the old branch here cannot go on under this code:
        it raises :class:`~afk_local.ReplayDivergence` (``afk-local replay`` finds such
        runs first).
        """
        key = self._key(PATCH_PREFIX + _patch_id(patch_id))
        known = self._writer.effects.lookup(key)
        if known is not None and known.outcome is not None and known.outcome.result is False:
            raise ReplayDivergence(
                self.run_id,
                self._steps + 1,
                key,
                f"the old branch of patch {patch_id!r}",
                f"the new branch only (ctx.deprecate_patch({patch_id!r}))",
                kind="patch",
            )

    # -- human in the loop ----------------------------------------------------------

    def pause(self, prompt: Any = None, *, kind: str = "input") -> Any:
        """Wait for a person: the run becomes ``paused``; :class:`~afk_local.RunPaused` propagates.

        ``afk.resume(run_id, input=value)`` re-runs the job; this call then
        returns ``value`` (journaled, so later resumes return it too). The
        prompt and the input must be msgpack-able.
        """
        key = self._key(_PAUSE)
        journal = self._writer.effects
        answered = journal.lookup(key)
        if answered is not None and answered.status == "ok" and answered.outcome is not None:
            journal.replayed_count += 1
            return answered.outcome.result
        if self._input is not NO_INPUT:
            value, self._input = self._input, NO_INPUT
            return journal.call(
                key, lambda: value, name=_PAUSE, step=self._report.steps, idempotent=True
            )
        self.checkpoint()
        self._writer.pause(kind, prompt, key=key, step=self._report.steps, **self._report.extras())
        raise RunPaused(self.run_id, kind, prompt)


def _patch_id(patch_id: str) -> str:
    if not isinstance(patch_id, str) or not patch_id or "/" in patch_id or "#" in patch_id:
        raise ValueError(f"a patch id is a non-empty string without '/' or '#', not {patch_id!r}")
    return patch_id


__all__ = ["NO_INPUT", "PAUSE_NAME", "RunContext", "set_step_hook"]


async def _outlast_cancellation(journaled: asyncio.Future[Any]) -> None:
    """Wait for a journaled call whose awaiter was cancelled to end, whatever its outcome."""
    while not journaled.done():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(journaled)
    if not journaled.cancelled():
        journaled.exception()  # retrieved: its error is the call's, already journaled
