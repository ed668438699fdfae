"""Durable jobs: the ``@afk.durable`` decorator and :class:`DurableFunction`.

``job.run(...)`` records a call as a run and drives one attempt of it: create
or reopen the run under its lock, restore ``ctx.state`` (migrating it when the
job's version changed), call the function with a fresh
:class:`~afk_local.RunContext`, and record the outcome (completed, failed,
paused, or stopped by a signal).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, overload

from afk_local.runner.code.versions import OnCodeChange, code_fingerprint
from afk_local.runner.run.attempt_cycle import (
    AttemptCycle,
    JobReached,
    Settled,
    _Attempt,
    _check_not_stopping,
    settled,
    stop_at_first_run,
)
from afk_local.runner.run.current import running
from afk_local.runner.run.run_context import NO_INPUT
from afk_local.runner.run.script_exit import install_script_excepthook
from afk_local.runner.run.stopping import loop_stops, sigterm_exits
from afk_local.runner.writer import validate_durability
from afk_local.storage.store import Store, StoreLike, as_store

log = logging.getLogger("afk_local")

T = TypeVar("T")
R = TypeVar("R")

_REGISTRY: dict[str, DurableFunction[Any]] = {}


def registered(entrypoint: str) -> DurableFunction[Any] | None:
    """The ``@afk.durable`` job this process defined as ``module:qualname``, if any."""
    return _REGISTRY.get(entrypoint)


def registered_in(module: str) -> list[str]:
    """The qualnames of the ``@afk.durable`` jobs this process defined in ``module``."""
    return sorted(name.partition(":")[2] for name in _REGISTRY if name.startswith(f"{module}:"))


class DurableFunction(AttemptCycle[R]):
    """A function made durable by :func:`durable`. Call :meth:`run` (or :meth:`arun`)."""

    def __init__(
        self,
        fn: Callable[..., R],
        *,
        store: StoreLike = None,
        durability: str = "sync",
        version: str | None = None,
        on_code_change: OnCodeChange = "resume",
        flush_timeout_s: float = 30.0,
        in_doubt: Any = None,
    ) -> None:
        if on_code_change not in ("resume", "refuse", "replay"):
            raise ValueError("on_code_change must be 'resume', 'refuse' or 'replay'")
        self.fn = fn
        self.store = store
        self.durability = validate_durability(durability)
        self.version = None if version is None else str(version)
        self.on_code_change = on_code_change
        self.flush_timeout_s = flush_timeout_s
        self.in_doubt = in_doubt
        self.is_async = inspect.iscoroutinefunction(fn)
        self.entrypoint = f"{fn.__module__}:{fn.__qualname__}"
        self.fingerprint = code_fingerprint(fn)
        functools.update_wrapper(self, fn)
        _REGISTRY[self.entrypoint] = self

    def __repr__(self) -> str:
        return f"<durable {self.entrypoint} durability={self.durability!r}>"

    def with_store(self, store: StoreLike) -> DurableFunction[R]:
        """The same job writing to another store (the registry keeps the original)."""
        clone = object.__new__(type(self))  # a subclass stays itself
        clone.__dict__.update(self.__dict__)
        clone.store = store
        return clone

    # -- entry points ---------------------------------------------------------------

    def run(
        self,
        *args: Any,
        run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> R:
        """Start a run, resume it (``run_id`` of an unfinished run) or return its stored result.

        A completed run returns its stored result without running anything; a
        failed one is retried (attempt + 1, finished steps replayed); a paused
        one raises :class:`~afk_local.RunPaused` (give the input with
        :func:`~afk_local.resume`); a cancelled one raises
        :class:`~afk_local.errors.RunCancelledError`. For ``async def`` jobs
        this runs the event loop (use :meth:`arun` inside one).

        ``run_id`` and ``tags`` are afk_local's (``tags={"model": "small"}``: strings
        to filter runs by, see ``ctx.tags``); every other argument goes to the job.

        In a script, a pause, a park or a refusal that nobody catches ends the process
        with one line and a status of its own (docs/runner.md, "Exit status of a script").
        """
        install_script_excepthook()
        if self.is_async:
            return run_coroutine(self.arun(*args, run_id=run_id, tags=tags, **kwargs))
        return self._sync(
            as_store(self.store),
            run_id,
            args,
            kwargs,
            input_value=NO_INPUT,
            in_doubt=None,
            tags=tags,
        )

    __call__ = run

    def submit(
        self,
        *args: Any,
        run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Record a new run of this job without running it (status ``created``); returns its id.

        A watcher (``afk-local watch``) starts it like any interrupted run; so does
        ``afk-local resume RUN``. ``afk-local submit`` calls this.

        Raises:
            RunExistsError: ``run_id`` is taken.
        """
        store = as_store(self.store)
        params = self._params(store, args, kwargs)
        run = store.create(
            run_id,
            entrypoint=self.entrypoint,
            params=params,
            code_fingerprint=self.fingerprint,
            version=self.version,
            extra=self._new_extra(tags),
            new_attempt=False,  # whoever starts it makes attempt 1
        )
        run.close()
        return run.run_id

    async def arun(
        self,
        *args: Any,
        run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> R:
        """The async form of :meth:`run` (works for sync jobs too)."""
        install_script_excepthook()
        return await self._async(
            as_store(self.store),
            run_id,
            args,
            kwargs,
            input_value=NO_INPUT,
            in_doubt=None,
            tags=tags,
        )

    def _sync(
        self,
        store: Store,
        run_id: str | None,
        args: Any,
        kwargs: Any,
        *,
        input_value: Any,
        in_doubt: Any,
        tags: Mapping[str, str] | None = None,
        pause_seq: int | None = None,
    ) -> R:
        _check_not_stopping()
        begun = self._begin(
            store, run_id, args, kwargs, input_value=input_value, in_doubt=in_doubt,
            tags=tags, pause_seq=pause_seq,
        )  # fmt: skip
        if not isinstance(begun, _Attempt):
            return begun.result  # type: ignore[no-any-return]
        if self.is_async:
            return run_coroutine(self._drive_async(begun))
        with sigterm_exits():
            try:
                with running(begun.ctx):  # DurableRunner.run(agent, ...) finds the ctx
                    result = self.fn(begun.ctx, *begun.args, **begun.kwargs)
            except BaseException as exc:
                self._abort(begun, exc)
                raise
        return self._complete(begun, result)

    async def _async(
        self,
        store: Store,
        run_id: str | None,
        args: Any,
        kwargs: Any,
        *,
        input_value: Any,
        in_doubt: Any,
        tags: Mapping[str, str] | None = None,
        pause_seq: int | None = None,
    ) -> R:
        _check_not_stopping()
        begun = self._begin(
            store, run_id, args, kwargs, input_value=input_value, in_doubt=in_doubt,
            tags=tags, pause_seq=pause_seq,
        )  # fmt: skip
        if not isinstance(begun, _Attempt):
            return begun.result  # type: ignore[no-any-return]
        return await self._drive_async(begun)

    async def _drive_async(self, begun: _Attempt) -> R:
        with loop_stops() as stop:
            try:
                with running(begun.ctx):  # DurableRunner.run(agent, ...) finds the ctx
                    result = self.fn(begun.ctx, *begun.args, **begun.kwargs)
                    if inspect.isawaitable(result):
                        result = await result
            except BaseException as exc:
                stopped = stop.translate(exc)  # Ctrl-C/SIGTERM cancelled the task
                self._abort(begun, stopped)
                if stopped is exc:
                    raise
                raise stopped from None
        return self._complete(begun, result)

    # -- one attempt --------------------------------------------------------------------


def run_coroutine(coroutine: Awaitable[T]) -> T:
    """Run ``coroutine`` to its end in a new event loop; refuse inside a running one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)  # type: ignore[arg-type]
    close = getattr(coroutine, "close", None)
    if close is not None:
        close()
    raise RuntimeError(
        "an event loop is running here: use `await job.arun(...)` / `await afk.aresume(...)`"
    )


@overload
def durable(fn: Callable[..., R], /) -> DurableFunction[R]: ...


@overload
def durable(
    *,
    store: StoreLike = None,
    durability: str = "sync",
    version: str | None = None,
    on_code_change: OnCodeChange = "resume",
    flush_timeout_s: float = 30.0,
    in_doubt: Any = None,
) -> Callable[[Callable[..., R]], DurableFunction[R]]: ...


def durable(
    fn: Callable[..., R] | None = None,
    /,
    *,
    store: StoreLike = None,
    durability: str = "sync",
    version: str | None = None,
    on_code_change: OnCodeChange = "resume",
    flush_timeout_s: float = 30.0,
    in_doubt: Any = None,
) -> DurableFunction[R] | Callable[[Callable[..., R]], DurableFunction[R]]:
    """Make ``fn(ctx, *args, **kwargs)`` a durable job; use bare or with options.

    Args:
        store: a :class:`~afk_local.Store` or its root (default ``$AFK_LOCAL_ROOT``
            else ``./.afk``, looked up at each run).
        durability: ``"sync"`` (every checkpoint durable on return), ``"async"``
            (write-behind, a crash loses at most queued checkpoints) or ``"exit"``
            (checkpoints written at pause, end, error and exit). Effects are
            journaled synchronously in every mode.
        version: your version of the job's state; with :func:`migration`, old states upgrade.
        on_code_change: when the job's source changed since the run started,
            ``"resume"`` warns, replays the run's journal against the current code (as
            ``afk-local replay`` does) and refuses with
            :class:`~afk_local.ReplayDivergence` before any effect when it diverges,
            else continues; ``"refuse"`` raises
            :class:`~afk_local.errors.CodeChangedError`; ``"replay"``: as ``"resume"``,
            with the replay check before every resume, changed source or not (for code
            a job calls outside its own body).
        flush_timeout_s: bound on waiting for queued checkpoints before pause/end.
        in_doubt: default policy for steps a crash left in doubt (``"retry"``,
            ``"raise"`` or a callable); None: retry the steps whose function takes an
            ``idempotency_key`` (and ``idempotent=True`` ones), raise for the others.

    Example:
        >>> @afk.durable(durability="async")  # doctest: +SKIP
        ... def crawl(ctx, urls): ...
    """
    options = {
        "store": store,
        "durability": durability,
        "version": version,
        "on_code_change": on_code_change,
        "flush_timeout_s": flush_timeout_s,
        "in_doubt": in_doubt,
    }
    if fn is not None:
        return DurableFunction(fn, **options)

    def decorate(func: Callable[..., R]) -> DurableFunction[R]:
        return DurableFunction(func, **options)

    return decorate


__all__ = [
    "DurableFunction",
    "JobReached",
    "Settled",
    "durable",
    "settled",
    "stop_at_first_run",
]
