"""Durable functions: ``@afk.durable``, :class:`RunContext`, ``afk.resume``.

A durable function is a plain (sync or async) function whose first parameter
is a :class:`RunContext`. ``job.run(...)`` records it as a run; when the
process dies, ``job.run(..., run_id=...)`` or ``afk.resume(run_id)`` calls the
function again **from the top**, with:

- ``ctx.state`` restored from the newest ``runtime_state`` checkpoint,
- every finished ``ctx.step`` replayed from the effect journal (not executed),
- every ``ctx.iterate`` skipping the items already done,
- every answered ``ctx.pause`` returning its recorded input.

Example:
    >>> import afk_local as afk
    >>> @afk.durable(store="/tmp/afk-doc-runner")
    ... def total(ctx, numbers):
    ...     ctx.state.setdefault("sum", 0)
    ...     for n in ctx.iterate(numbers, progress=False):
    ...         ctx.state["sum"] += ctx.step("square", lambda x: x * x, n)
    ...     return ctx.state["sum"]
    >>> total.run([1, 2, 3])
    14
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib
import inspect
import logging
import os
import re
import signal
import threading
import warnings
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

import msgspec

from afk_local.errors import (
    AfkLocalError,
    CodeChangedError,
    EntrypointError,
    RunCancelledError,
    RunExistsError,
    RunPaused,
    WriterFailedError,
)
from afk_local.journal import Journal, idempotency_key
from afk_local.progress import Progress
from afk_local.records import Phase, RunMeta, RunStatus
from afk_local.run import RunWriter
from afk_local.store import Store
from afk_local.writer import DurableWriter, validate_durability

log = logging.getLogger("afk_local")

T = TypeVar("T")
R = TypeVar("R")

OnCodeChange = Literal["resume", "refuse"]
StoreLike = Store | str | os.PathLike[str] | None
StateMigration = Callable[[dict[str, Any]], dict[str, Any]]

_ENTRYPOINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_NO_INPUT: Any = object()
_PAUSE = "@pause"
_ITERATE = "@iterate"

_REGISTRY: dict[str, DurableFunction[Any]] = {}
_MIGRATIONS: dict[tuple[str, str], StateMigration] = {}

_test_hook: Callable[[str, str], None] | None = None
"""``hook(event, key)`` before each step (``"step"``); used by :mod:`afk_local.testing`."""


class CodeChangedWarning(UserWarning):
    """A run resumes under code (or a version) different from the one that started it."""


# -- migrations and fingerprints --------------------------------------------------------


def migration(from_version: str, to_version: str) -> Callable[[StateMigration], StateMigration]:
    """Register ``fn(state) -> state`` upgrading ``ctx.state`` of runs made under ``from_version``.

    Applied when a run whose last checkpoint was written under ``from_version``
    resumes under a job declared with ``version=to_version`` (chains are
    followed: 1 -> 2 -> 3). The migrated state is checkpointed before the job runs.

    Example:
        >>> @afk.migration("1", "2")  # doctest: +SKIP
        ... def add_seen(state):
        ...     return {**state, "seen": []}
    """

    def register(fn: StateMigration) -> StateMigration:
        _MIGRATIONS[(str(from_version), str(to_version))] = fn
        return fn

    return register


def _migration_path(start: str, goal: str) -> list[tuple[str, StateMigration]] | None:
    """The shortest chain of registered migrations from ``start`` to ``goal``."""
    frontier: list[tuple[str, list[tuple[str, StateMigration]]]] = [(start, [])]
    seen = {start}
    while frontier:
        version, path = frontier.pop(0)
        if version == goal:
            return path
        for (src, dst), fn in _MIGRATIONS.items():
            if src == version and dst not in seen:
                seen.add(dst)
                frontier.append((dst, [*path, (dst, fn)]))
    return None


def code_fingerprint(fn: Callable[..., Any]) -> str:
    """A digest of ``fn``'s source (``src:...``), or of its bytecode when there is no source."""
    try:
        data = inspect.getsource(fn).encode()
        kind = "src"
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return "none"
        data = code.co_code + repr((code.co_consts, code.co_names)).encode()
        kind = "code"
    return f"{kind}:{hashlib.blake2b(data, digest_size=12).hexdigest()}"


def as_store(store: StoreLike) -> Store:
    """``store`` itself, or a :class:`Store` on the root directory it names."""
    return store if isinstance(store, Store) else Store(store)


# -- the context a job runs with --------------------------------------------------------


@dataclass
class _Scope:
    prefix: str
    counters: dict[str, int]


class RunContext:
    """What a durable function gets as its first argument.

    Attributes:
        run_id: the run's id.
        attempt: 1 for the first process that ran it, +1 for every resume.
        resumed: True when this call continues an earlier attempt.
        state: a dict of msgpack-able data saved with every checkpoint and
            restored on resume (initialise it with ``setdefault``: the function
            re-runs from the top).
        store: the store the run lives in.
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
        input_value: Any = _NO_INPUT,
        in_doubt: Any = None,
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
        self._scopes = [_Scope("", {})]
        self._steps = 0

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

    def _key(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a step name must be a non-empty string, not {name!r}")
        scope = self._scopes[-1]
        count = scope.counters.get(name, 0) + 1
        scope.counters[name] = count
        return f"{scope.prefix}{name}#{count}"

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
        idempotent: bool = False,
        **kwargs: Any,
    ) -> R:
        """Call ``fn(*args, **kwargs)`` through the effect journal and return its result.

        The n-th call of ``name`` (within the current ``iterate`` item) has the
        stable key ``name#n``. A finished call is replayed on resume; a call a
        crash cut short is *in doubt*: retried when ``idempotent=True`` (``fn``
        gets ``idempotency_key=`` if it takes it), else
        :class:`~afk_local.EffectInDoubtError` (resume with ``in_doubt="retry"``
        once you checked). A call that raised is run again on a later attempt.
        Arguments and result must be msgpack-able.
        """
        key = self._key(name)
        self._steps += 1
        if _test_hook is not None:
            _test_hook("step", key)
        with defer_stop():  # SIGTERM waits for the outcome: a stopped step is not in doubt
            result: R = self._writer.effects.call(
                key,
                fn,
                args,
                kwargs,
                name=name,
                step=self._steps,
                idempotent=idempotent,
                in_doubt=self._in_doubt,
                retry_errors=True,
            )
        return result

    async def astep(
        self,
        name: str,
        fn: Callable[..., Awaitable[R]] | Callable[..., R],
        /,
        *args: Any,
        idempotent: bool = False,
        **kwargs: Any,
    ) -> R:
        """The async twin of :meth:`step`: ``fn`` may be a coroutine function.

        The journal's fsyncs run in a worker thread, so the event loop keeps going.
        """
        loop = asyncio.get_running_loop()
        if inspect.iscoroutinefunction(fn):
            coroutine_fn = fn

            @functools.wraps(fn)
            def call_sync(*a: Any, **kw: Any) -> Any:
                return asyncio.run_coroutine_threadsafe(coroutine_fn(*a, **kw), loop).result()

            target: Callable[..., Any] = call_sync
        else:
            target = fn
        return await asyncio.to_thread(
            self.step, name, target, *args, idempotent=idempotent, **kwargs
        )

    # -- checkpoints and loops ------------------------------------------------------

    def checkpoint(self) -> None:
        """Persist ``ctx.state`` (and the loop positions) now, per the durability mode."""
        payload = {"state": self.state, "cursors": self._cursors, "version": self._version}
        try:
            self._writer.checkpoint(Phase.RUNTIME_STATE, payload, step=self._steps)
        except (TypeError, msgspec.EncodeError) as exc:
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
            progress: a progress bar (tqdm.auto when installed, else one stderr
                line); ``False`` for none.

        An item whose body raised or did ``break`` is not done. Steps inside the
        body get keys scoped to the item, so skipped items do not shift them.
        """
        full, cursor, done = self._open_loop(items, key, name)
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
        bar = Progress(total, done, desc=full, enabled=progress)
        return self._loop(items, key, full, cursor, bar)

    def _open_loop(
        self, items: Iterable[Any], key: Callable[[Any], Any] | None, name: str | None
    ) -> tuple[str, dict[str, Any], int]:
        if isinstance(items, (str, bytes)):
            raise TypeError("iterate() over a str or bytes is almost surely a mistake")
        scope = self._scopes[-1]
        if name is None:
            count = scope.counters.get(_ITERATE, 0) + 1
            scope.counters[_ITERATE] = count
            name = f"iterate#{count}"
        loop_name = scope.prefix + name
        fresh: dict[str, Any] = {"n": 0} if key is None else {"done": []}
        cursor: dict[str, Any] = self._cursors.setdefault(loop_name, fresh)
        done = cursor.get("n", 0) if key is None else len(cursor.get("done", []))
        return loop_name, cursor, done

    def _loop(
        self,
        items: Iterable[T],
        key: Callable[[T], Any] | None,
        full: str,
        cursor: dict[str, Any],
        bar: Progress,
    ) -> Iterator[T]:
        done_keys = set(cursor.get("done", ())) if key is not None else set()
        skip = int(cursor.get("n", 0)) if key is None else 0
        try:
            for index, item in enumerate(items):
                if key is None:
                    if index < skip:
                        continue
                    ident = str(index)
                else:
                    ident = str(key(item))
                    if ident in done_keys:
                        continue
                scope = _Scope(f"{full}[{ident}]/", {})
                self._scopes.append(scope)
                try:
                    yield item
                finally:
                    self._drop_scope(scope)
                self._item_done(full, cursor, index, ident, done_keys)
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
        full, cursor, done = self._open_loop(items, key, name)  # type: ignore[arg-type]
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
        bar = Progress(total, done, desc=full, enabled=progress)
        done_keys = set(cursor.get("done", ())) if key is not None else set()
        skip = int(cursor.get("n", 0)) if key is None else 0
        source: AsyncIterator[T] = (
            aiter(items) if isinstance(items, AsyncIterable) else _as_async(iter(items))
        )
        try:
            index = -1
            async for item in source:
                index += 1
                if key is None:
                    if index < skip:
                        continue
                    ident = str(index)
                else:
                    ident = str(key(item))
                    if ident in done_keys:
                        continue
                scope = _Scope(f"{full}[{ident}]/", {})
                self._scopes.append(scope)
                try:
                    yield item
                finally:
                    self._drop_scope(scope)
                await asyncio.to_thread(self._item_done, full, cursor, index, ident, done_keys)
                bar.update()
        finally:
            bar.close()

    def _item_done(
        self, full: str, cursor: dict[str, Any], index: int, ident: str, done_keys: set[str]
    ) -> None:
        if "n" in cursor:
            cursor["n"] = index + 1
        else:
            cursor["done"].append(ident)
            done_keys.add(ident)
        inner = f"{full}[{ident}]/"
        for name in [n for n in self._cursors if n.startswith(inner)]:
            del self._cursors[name]  # loops nested in a finished item are never re-entered
        self.checkpoint()

    def _drop_scope(self, scope: _Scope) -> None:
        for i in range(len(self._scopes) - 1, 0, -1):
            if self._scopes[i] is scope:
                del self._scopes[i]
                return

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
        if self._input is not _NO_INPUT:
            value, self._input = self._input, _NO_INPUT
            return journal.call(key, lambda: value, name=_PAUSE, step=self._steps, idempotent=True)
        self.checkpoint()
        self._writer.pause(kind, prompt, key=key)
        raise RunPaused(self.run_id, kind, prompt)


async def _as_async(items: Iterator[T]) -> AsyncIterator[T]:
    for item in items:
        yield item


# -- durable functions ------------------------------------------------------------------


@dataclass
class _Attempt:
    writer: DurableWriter
    ctx: RunContext
    args: list[Any]
    kwargs: dict[str, Any]


class DurableFunction(Generic[R]):
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
        if on_code_change not in ("resume", "refuse"):
            raise ValueError("on_code_change must be 'resume' or 'refuse'")
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
        clone = object.__new__(DurableFunction)
        clone.__dict__.update(self.__dict__)
        clone.store = store
        return clone

    # -- entry points ---------------------------------------------------------------

    def run(self, *args: Any, run_id: str | None = None, **kwargs: Any) -> R:
        """Start a run, resume it (``run_id`` of an unfinished run) or return its stored result.

        A completed run returns its stored result without running anything; a
        failed one is retried (attempt + 1, finished steps replayed); a paused
        one raises :class:`~afk_local.RunPaused` (give the input with
        :func:`resume`); a cancelled one raises
        :class:`~afk_local.errors.RunCancelledError`. For ``async def`` jobs
        this runs the event loop (use :meth:`arun` inside one).
        """
        if self.is_async:
            return _run_coroutine(self.arun(*args, run_id=run_id, **kwargs))
        return self._sync(
            as_store(self.store), run_id, args, kwargs, input_value=_NO_INPUT, in_doubt=None
        )

    __call__ = run

    async def arun(self, *args: Any, run_id: str | None = None, **kwargs: Any) -> R:
        """The async form of :meth:`run` (works for sync jobs too)."""
        return await self._async(
            as_store(self.store), run_id, args, kwargs, input_value=_NO_INPUT, in_doubt=None
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
    ) -> R:
        begun = self._begin(store, run_id, args, kwargs, input_value=input_value, in_doubt=in_doubt)
        if not isinstance(begun, _Attempt):
            return begun.result  # type: ignore[no-any-return]
        if self.is_async:
            return _run_coroutine(self._drive_async(begun))
        with sigterm_exits():
            try:
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
    ) -> R:
        begun = self._begin(store, run_id, args, kwargs, input_value=input_value, in_doubt=in_doubt)
        if not isinstance(begun, _Attempt):
            return begun.result  # type: ignore[no-any-return]
        return await self._drive_async(begun)

    async def _drive_async(self, begun: _Attempt) -> R:
        try:
            result = self.fn(begun.ctx, *begun.args, **begun.kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            self._abort(begun, exc)
            raise
        return self._complete(begun, result)

    # -- one attempt --------------------------------------------------------------------

    def _params(self, store: Store, args: Any, kwargs: Any) -> dict[str, Any]:
        try:
            data = store.codec.encode({"args": list(args), "kwargs": dict(kwargs)})
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(
                f"the arguments of durable job {self.entrypoint} must be msgpack-able (dict, "
                f"list, str, int, float, bool, None, bytes, datetime): they are stored in "
                f"run.meta so the run can resume in another process. Pass a path or an id "
                f"instead. ({exc})"
            ) from None
        params: dict[str, Any] = msgspec.msgpack.decode(data)
        return params

    def _begin(
        self,
        store: Store,
        run_id: str | None,
        args: Any,
        kwargs: Any,
        *,
        input_value: Any,
        in_doubt: Any,
    ) -> _Attempt | _Done:
        params = self._params(store, args, kwargs) if (args or kwargs) else None
        if run_id is not None and store.exists(run_id):
            return self._reopen(store, run_id, params, input_value, in_doubt)
        if input_value is not _NO_INPUT:
            raise ValueError(f"run {run_id!r} does not exist: there is no pause to answer")
        params = params or {"args": [], "kwargs": {}}
        try:
            run = store.create(
                run_id,
                entrypoint=self.entrypoint,
                params=params,
                code_fingerprint=self.fingerprint,
                version=self.version,
            )
        except RunExistsError:  # another process created it just now
            assert run_id is not None
            return self._reopen(store, run_id, params, input_value, in_doubt)
        return self._attempt(store, run, params, None, input_value=_NO_INPUT, in_doubt=in_doubt)

    def _reopen(
        self,
        store: Store,
        run_id: str,
        params: dict[str, Any] | None,
        input_value: Any,
        in_doubt: Any,
    ) -> _Attempt | _Done:
        meta = store.read_meta(run_id)
        if meta.entrypoint is not None and meta.entrypoint != self.entrypoint:
            raise ValueError(
                f"run {run_id!r} belongs to {meta.entrypoint}, not {self.entrypoint}: "
                "choose another run_id, or resume it with afk.resume(run_id)"
            )
        if params is not None and meta.params is not None and params != meta.params:
            raise ValueError(
                f"run {run_id!r} was started with other arguments ({_short(meta.params)}); "
                "call job.run(run_id=...) without arguments to continue it, or use a new run_id"
            )
        done = _settled(store, meta, input_value)
        if done is not None:
            return done
        self._check_code(run_id, meta)
        run = store.resume_writer(run_id)
        try:
            meta = run.meta  # re-read under the lock: another process may have finished it
            done = _settled(store, meta, input_value)
        except BaseException:
            run.close()
            raise
        if done is not None:
            run.close()
            return done
        return self._attempt(
            store, run, meta.params, meta, input_value=input_value, in_doubt=in_doubt
        )

    def _check_code(self, run_id: str, meta: RunMeta) -> None:
        recorded = meta.code_fingerprint
        if recorded is None or recorded == self.fingerprint:
            return
        if self.on_code_change == "refuse":
            raise CodeChangedError(run_id, self.entrypoint, recorded, self.fingerprint)
        message = (
            f"run {run_id!r}: resuming {self.entrypoint} under changed code "
            f"({recorded} -> {self.fingerprint}); finished steps are replayed, a step whose "
            "inputs changed raises EffectMismatchError"
        )
        log.warning("%s", message)
        warnings.warn(message, CodeChangedWarning, stacklevel=5)

    def _attempt(
        self,
        store: Store,
        run: RunWriter,
        params: Any,
        meta: RunMeta | None,
        *,
        input_value: Any,
        in_doubt: Any,
    ) -> _Attempt:
        writer = DurableWriter(run, self.durability, flush_timeout_s=self.flush_timeout_s)  # type: ignore[arg-type]
        try:
            state: dict[str, Any] = {}
            cursors: dict[str, Any] = {}
            migrated = False
            if meta is not None:
                snapshot = run.reader().resume_state(on_corrupt="fallback").state
                if isinstance(snapshot, dict):
                    state = dict(snapshot.get("state") or {})
                    cursors = dict(snapshot.get("cursors") or {})
                    # The state's version travels with the state, so a crash between a
                    # migration and its checkpoint can never apply the migration twice.
                    state_version = snapshot.get("version", meta.version)
                    if state_version != self.version:
                        state = self._migrate(run.run_id, state, state_version)
                        migrated = True
            writer.update_meta(
                status=RunStatus.RUNNING,
                pause=None,
                error=None,
                code_fingerprint=self.fingerprint,
                version=self.version,
            )
            ctx = RunContext(
                writer,
                store,
                state=state,
                cursors=cursors,
                version=self.version,
                attempt=run.meta.attempt,
                resumed=meta is not None,
                input_value=input_value,
                in_doubt=in_doubt if in_doubt is not None else self.in_doubt,
            )
            writer.checkpoint(
                Phase.RUN_STARTED,
                {"agent_name": self.entrypoint, "resumed": meta is not None},
                step=0,
            )
            if migrated:
                ctx.checkpoint()
                writer.flush()
            p = params if isinstance(params, dict) else {}
            return _Attempt(writer, ctx, list(p.get("args") or []), dict(p.get("kwargs") or {}))
        except BaseException:
            with contextlib.suppress(Exception):
                writer.close()
            raise

    def _migrate(self, run_id: str, state: dict[str, Any], old: str | None) -> dict[str, Any]:
        path = None
        if old is not None and self.version is not None:
            path = _migration_path(old, self.version)
        if path is None:
            message = (
                f"run {run_id!r}: its state was written under version {old!r}, the job is now "
                f"version {self.version!r} and no afk.migration connects them; resuming with "
                "the state as it is"
            )
            if self.on_code_change == "refuse":
                raise CodeChangedError(run_id, self.entrypoint, f"version {old}", f"{self.version}")
            log.warning("%s", message)
            warnings.warn(message, CodeChangedWarning, stacklevel=6)
            return state
        for version, fn in path:
            state = fn(state)
            if not isinstance(state, dict):
                raise TypeError(
                    f"migration to version {version} returned {type(state).__name__}, not a dict"
                )
            log.info("run %s: migrated state to version %s", run_id, version)
        return state

    def _complete(self, begun: _Attempt, result: R) -> R:
        writer = begun.writer
        try:
            try:
                writer.finish(result)
            except (TypeError, msgspec.EncodeError) as exc:
                raise TypeError(
                    f"run {writer.run_id!r}: the job returned a value that cannot be stored "
                    f"({exc}); return msgpack-able data"
                ) from exc
        except BaseException as exc:
            self._abort(begun, exc)
            raise
        writer.close()
        return result

    def _abort(self, begun: _Attempt, exc: BaseException) -> None:
        writer = begun.writer
        try:
            if isinstance(exc, RunPaused):
                pass  # already durably paused by ctx.pause
            elif (
                isinstance(exc, Exception)
                and not isinstance(exc, WriterFailedError)
                and writer.failed is None
            ):
                writer.fail(exc)
            # BaseExceptions (KeyboardInterrupt, SystemExit from SIGTERM): the run is
            # stopped, not failed; close() below persists what is queued.
        except Exception as write_error:
            log.error("run %s: could not record the failure: %s", writer.run_id, write_error)
        try:
            writer.close()
        except Exception as close_error:
            log.error("run %s: closing the writer failed: %s", writer.run_id, close_error)


@dataclass
class _Done:
    result: Any


def _settled(store: Store, meta: RunMeta, input_value: Any) -> _Done | None:
    """The outcome when a run needs no attempt (completed), or raise for cancelled/paused."""
    if meta.status is RunStatus.COMPLETED:
        state = store.open(meta.run_id).resume_state()
        return _Done(state.result)
    if meta.status is RunStatus.CANCELLED:
        reason = meta.extra.get("cancel_reason")
        raise RunCancelledError(meta.run_id, reason if isinstance(reason, str) else None)
    if meta.status is RunStatus.PAUSED and input_value is _NO_INPUT:
        pause = meta.pause
        raise RunPaused(
            meta.run_id, pause.kind if pause else "input", pause.prompt if pause else None
        )
    if input_value is not _NO_INPUT and meta.status is not RunStatus.PAUSED:
        raise ValueError(
            f"run {meta.run_id!r} is {meta.status}, not paused: input is only for paused runs"
        )
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _run_coroutine(coroutine: Awaitable[T]) -> T:
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


_stop_deferral = [0, 0]
"""[steps in flight, SIGTERM received meanwhile (0 = none)]: see :func:`sigterm_exits`."""
_stop_lock = threading.Lock()  # for the counter's writers; the signal handler only reads it


@contextlib.contextmanager
def defer_stop() -> Iterator[None]:
    """Wrap a journaled call: a SIGTERM under :func:`sigterm_exits` waits for the block to end.

    Used around ``ctx.step`` and the agent's LLM and tool calls, so a process
    stopped by SIGTERM (the watcher stopping) journals the call's outcome before
    it exits and leaves nothing in doubt. Any thread may enter (agent tools run in
    worker threads); the deferred ``SystemExit`` is raised when the main thread
    leaves such a block and none is left open.
    """
    with _stop_lock:
        _stop_deferral[0] += 1
    try:
        yield
    finally:
        with _stop_lock:
            _stop_deferral[0] -= 1
    _raise_deferred_stop()


def _raise_deferred_stop() -> None:
    """Raise the SystemExit a SIGTERM asked for while a step ran (main thread, no step left)."""
    signum = _stop_deferral[1]
    if signum and _stop_deferral[0] == 0 and threading.current_thread() is threading.main_thread():
        _stop_deferral[1] = 0
        raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While a job runs in the main thread, SIGTERM raises SystemExit: queued checkpoints flush.

    Inside ``ctx.step`` the exit waits until the step's outcome is journaled, so
    a run stopped by SIGTERM (the watcher stopping) leaves no effect in doubt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, AttributeError):  # pragma: no cover - no SIGTERM here
        yield
        return
    if previous is not signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if _stop_deferral[0] > 0:  # inside ctx.step: stop right after its outcome is journaled
            _stop_deferral[1] = signum
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_deferral[1] = 0


# -- the decorator and module-level entry points ------------------------------------------


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
        on_code_change: ``"resume"`` (warn and continue) or ``"refuse"``
            (:class:`~afk_local.errors.CodeChangedError`) when the job's source
            changed since the run started.
        flush_timeout_s: bound on waiting for queued checkpoints before pause/end.
        in_doubt: default policy for steps a crash left in doubt (``"retry"``,
            ``"raise"`` or a callable); None means retry only ``idempotent=True`` steps.

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


def is_agent_run(meta: RunMeta) -> bool:
    """True for runs made by :class:`~afk_local.AgentRunner` (``extra["kind"] == "agent"``).

    Agent runs made before the kind was recorded are recognised by ``extra["agent"]``.
    """
    kind = meta.extra.get("kind")
    if kind is not None:
        return bool(kind == "agent")
    return meta.entrypoint is None and "agent" in meta.extra


def load_entrypoint(entrypoint: str | None, run_id: str = "?") -> DurableFunction[Any]:
    """The durable function named ``module:qualname`` (this process's registry first)."""
    if entrypoint is None:
        raise EntrypointError(
            run_id,
            None,
            "the run was not started by an @afk.durable job or a rebuildable agent (a "
            "StateCheckpoint, a LangGraph thread, a plain store.create run): only the code "
            "that writes it can continue it",
        )
    found = _REGISTRY.get(entrypoint)
    if found is not None:
        return found
    module_name, _, qualname = entrypoint.partition(":")
    if module_name == "__main__" or "<locals>" in qualname:
        raise EntrypointError(
            run_id,
            entrypoint,
            "it was defined in a script run as __main__, a notebook or inside a function, "
            "which another process cannot import. Resume it from the same script/notebook with "
            "job.run(run_id=...), or move the job into an importable module",
        )
    if _ENTRYPOINT.fullmatch(entrypoint) is None:
        raise EntrypointError(run_id, entrypoint, "not a module:qualname name")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EntrypointError(
            run_id, entrypoint, f"{exc}; is its package installed / on PYTHONPATH here?"
        ) from exc
    if not isinstance(obj, DurableFunction):
        raise EntrypointError(run_id, entrypoint, "it is not an @afk.durable function")
    return obj


def resume(run_id: str, *, store: StoreLike = None, input: Any = None, in_doubt: Any = None) -> Any:
    """Continue run ``run_id``: re-import its job and run it (see :meth:`DurableFunction.run`).

    Agent runs (:func:`is_agent_run`) are continued by
    :func:`afk_local.agent_rebuild.resume_agent`, which rebuilds the ``Agent`` from the
    run's entrypoint and returns the :class:`~afk_local.AgentResult` (completed,
    failed or paused: it does not raise for those).

    Args:
        store: the run's store (default ``$AFK_LOCAL_ROOT`` else ``./.afk``).
        input: for a paused run, the value its ``ctx.pause`` returns; a paused run
            given no input raises :class:`~afk_local.RunPaused` and changes nothing.
        in_doubt: policy for steps a crash left in doubt (``"retry"`` once you checked).
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if is_agent_run(meta):
        # Imported here, not at the top: agent_rebuild (and agent) import this module.
        from afk_local.agent_rebuild import resume_agent  # noqa: PLC0415

        return resume_agent(run_id, store=the_store, input=input, in_doubt=in_doubt)
    value = _NO_INPUT if input is None else input
    done = _settled(the_store, meta, value)  # completed/paused/cancelled: no import needed
    if done is not None:
        return done.result
    job = load_entrypoint(meta.entrypoint, run_id)
    if job.is_async:
        return _run_coroutine(
            job._async(the_store, run_id, (), {}, input_value=value, in_doubt=in_doubt)
        )
    return job._sync(the_store, run_id, (), {}, input_value=value, in_doubt=in_doubt)


async def aresume(
    run_id: str, *, store: StoreLike = None, input: Any = None, in_doubt: Any = None
) -> Any:
    """The async form of :func:`resume` (an agent run is resumed in a worker thread)."""
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if is_agent_run(meta):
        return await asyncio.to_thread(
            resume, run_id, store=the_store, input=input, in_doubt=in_doubt
        )
    value = _NO_INPUT if input is None else input
    done = _settled(the_store, meta, value)
    if done is not None:
        return done.result
    job = load_entrypoint(meta.entrypoint, run_id)
    return await job._async(the_store, run_id, (), {}, input_value=value, in_doubt=in_doubt)


def resume_run(run_id: str, store: StoreLike = None, input: Any = None) -> Any:
    """What ``python -m afk_local resume RUN`` calls: :func:`resume` with positional store.

    Dispatches on the run's kind. A durable job's run returns its result (or
    raises what the job raised, or :class:`~afk_local.RunPaused`); an agent run
    goes to :func:`afk_local.agent_rebuild.resume_agent_run`, which speaks the same
    terms: the final text, ``RunPaused``, or ``AgentFailedError`` for a failed run.
    """
    the_store = as_store(store)
    if is_agent_run(the_store.read_meta(run_id)):
        from afk_local.agent_rebuild import resume_agent_run  # noqa: PLC0415 - it imports runner

        return resume_agent_run(run_id, the_store, input)
    return resume(run_id, store=the_store, input=input)


def cancel(run_id: str, *, store: StoreLike = None, reason: str = "cancelled") -> None:
    """Make run ``run_id`` terminal (``cancelled``); it is never resumed again.

    Raises:
        RunLockedError: the run is running in some process right now.
        ValueError: it already completed.
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if meta.status is RunStatus.CANCELLED:
        return
    if meta.status is RunStatus.COMPLETED:
        raise ValueError(f"run {run_id!r} already completed; there is nothing to cancel")
    with the_store.resume_writer(run_id) as run:
        run.cancel(reason)
        run.update_meta(extra={**run.meta.extra, "cancel_reason": reason})


__all__ = [
    "AfkLocalError",
    "CodeChangedWarning",
    "DurableFunction",
    "RunContext",
    "aresume",
    "as_store",
    "cancel",
    "code_fingerprint",
    "defer_stop",
    "durable",
    "is_agent_run",
    "load_entrypoint",
    "migration",
    "resume",
    "resume_run",
    "sigterm_exits",
]
