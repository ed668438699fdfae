"""One attempt of a durable job from its start to its end: a new run created, or an
existing one reopened (its state, cursors, answers and code checks), the body run, and
the run completed or left failed, paused or parked.

A base class of :class:`~afk_local.runner.run.durable_function.DurableFunction`, which
holds the job's options and the ways to call it (``run``, ``arun``, ``submit``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from afk_local.errors import (
    RunCancelledError,
    RunExistsError,
    RunPaused,
    RunSleeping,
    UnstorableValueError,
    WriterFailedError,
)
from afk_local.runner.code.origin import ORIGIN_KEY, origin_here
from afk_local.runner.code.versions import OnCodeChange, check_code, migrate_state
from afk_local.runner.observe.observe import AttemptObservation
from afk_local.runner.run.answers import check_answer
from afk_local.runner.run.attempt import (
    attempt_ended,
    attempt_extra,
    observe_attempt,
    start_report,
    terminal_extras,
)
from afk_local.runner.run.replay import check_before_resume
from afk_local.runner.run.run_context import NO_INPUT, RunContext
from afk_local.runner.run.stopping import stopped_line
from afk_local.runner.run.tags import checked_tags
from afk_local.runner.writer import DurableWriter
from afk_local.storage.format.records import Phase, RunMeta, RunStatus
from afk_local.storage.rundir.write.writer import RunWriter
from afk_local.storage.store import Store, StoreLike
from afk_local.storage.trust import require_trusted_run
from afk_local.storage.views.run_info import TAGS_KEY
from afk_local.storage.views.run_progress import PROGRESS_KEY

log = logging.getLogger("afk_local")

R = TypeVar("R")

_stopping = threading.local()


class JobReached(BaseException):
    """A script run again to re-enter a job reached its first durable run: stop it there.

    A BaseException, so that the script's own ``except Exception`` does not catch it.
    """


@contextlib.contextmanager
def stop_at_first_run() -> Iterator[None]:
    """While active (in this thread), starting or resuming any durable run raises JobReached."""
    _stopping.active = True
    try:
        yield
    finally:
        _stopping.active = False


def _check_not_stopping() -> None:
    if getattr(_stopping, "active", False):
        _stopping.active = False
        raise JobReached


@dataclass
class _Attempt:
    writer: DurableWriter
    ctx: RunContext
    args: list[Any]
    kwargs: dict[str, Any]
    observations: tuple[AttemptObservation, ...] = ()


@dataclass
class Settled:
    """The outcome of a run that needs no attempt: its stored result."""

    result: Any


def settled(
    store: Store, meta: RunMeta, input_value: Any, pause_seq: int | None = None
) -> Settled | None:
    """The outcome when a run needs no attempt (completed), or raise for cancelled/paused.

    An answer bound to ``pause_seq`` raises :class:`~afk_local.errors.PauseMismatchError`
    unless the run waits at that pause (:mod:`afk_local.runner.run.answers`).
    """
    if input_value is not NO_INPUT:
        check_answer(meta, pause_seq)
    if meta.status is RunStatus.COMPLETED:
        state = store.open(meta.run_id).resume_state()
        return Settled(state.result)
    if meta.status is RunStatus.CANCELLED:
        reason = meta.extra.get("cancel_reason")
        raise RunCancelledError(meta.run_id, reason if isinstance(reason, str) else None)
    if meta.status is RunStatus.PAUSED and input_value is NO_INPUT:
        pause = meta.pause
        raise RunPaused(
            meta.run_id, pause.kind if pause else "input", pause.prompt if pause else None
        )
    if input_value is not NO_INPUT and meta.status is not RunStatus.PAUSED:
        raise ValueError(
            f"run {meta.run_id!r} is {meta.status}, not paused: input is only for paused runs"
        )
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class AttemptCycle(Generic[R]):
    """How a durable job's attempt begins and ends (see ``DurableFunction``)."""

    fn: Callable[..., R]
    store: StoreLike
    durability: str
    version: str | None
    on_code_change: OnCodeChange
    flush_timeout_s: float
    in_doubt: Any
    is_async: bool
    entrypoint: str
    fingerprint: str

    def _new_extra(self, tags: Mapping[str, str] | None) -> dict[str, Any]:
        extra: dict[str, Any] = {ORIGIN_KEY: origin_here(self.fn)}
        if tags:
            extra[TAGS_KEY] = checked_tags(tags)
        return extra

    def _params(self, store: Store, args: Any, kwargs: Any) -> dict[str, Any]:
        try:
            data = store.codec.encode({"args": list(args), "kwargs": dict(kwargs)})
        except UnstorableValueError:
            raise  # names the argument (args.0, kwargs.name) and its type
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(
                f"the arguments of durable job {self.entrypoint} must be msgpack-able (dict, "
                f"list, str, int, float, bool, None, bytes, datetime): they are stored in "
                f"run.meta so the run can resume in another process. Pass a path or an id "
                f"instead. ({exc})"
            ) from None
        params: dict[str, Any] = store.codec.decode_value(data)
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
        tags: Mapping[str, str] | None = None,
        pause_seq: int | None = None,
    ) -> _Attempt | Settled:
        params = self._params(store, args, kwargs) if (args or kwargs) else None
        tags = checked_tags(tags) if tags else None
        if run_id is not None and store.exists(run_id):
            return self._reopen(
                store, run_id, params, input_value, in_doubt, tags=tags, pause_seq=pause_seq
            )
        if input_value is not NO_INPUT:
            raise ValueError(f"run {run_id!r} does not exist: there is no pause to answer")
        params = params or {"args": [], "kwargs": {}}
        try:
            run = store.create(
                run_id,
                entrypoint=self.entrypoint,
                params=params,
                code_fingerprint=self.fingerprint,
                version=self.version,
                extra=self._new_extra(tags),
                # the run appears with its running status: one set of fsyncs
                publish_with_first_write=True,
            )
            return self._attempt(store, run, params, None, input_value=NO_INPUT, in_doubt=in_doubt)
        except RunExistsError:  # another process created it just now
            if run_id is None:
                raise
            return self._reopen(
                store, run_id, params, input_value, in_doubt, tags=tags, pause_seq=pause_seq
            )

    def _reopen(
        self,
        store: Store,
        run_id: str,
        params: dict[str, Any] | None,
        input_value: Any,
        in_doubt: Any,
        *,
        tags: dict[str, str] | None = None,
        pause_seq: int | None = None,
    ) -> _Attempt | Settled:
        # The run's arguments come from its run.meta: the same checks as any resume.
        meta = require_trusted_run(store, run_id).meta
        if meta.entrypoint is not None and meta.entrypoint != self.entrypoint:
            if meta.entrypoint.startswith("__main__:"):  # a script's job: no import finds it
                how = (
                    f"if you renamed the job, give it its old name ({meta.entrypoint[9:]}) "
                    "again, then run this again"
                )
            else:
                how = f"resume it with `afk-local resume {run_id}`"
            raise ValueError(
                f"run {run_id!r} belongs to {meta.entrypoint}, not {self.entrypoint}: "
                f"{how}; or choose another run_id for a new run"
            )
        if params is not None and meta.params is not None and params != meta.params:
            raise ValueError(
                f"run {run_id!r} was started with other arguments ({_short(meta.params)}); "
                "to continue it, call again with those arguments (a job's run also with "
                "job.run(run_id=...) alone), or use a new run_id"
            )
        done = settled(store, meta, input_value, pause_seq)
        if done is not None:
            return done
        check_code(
            run_id,
            meta,
            entrypoint=self.entrypoint,
            fingerprint=self.fingerprint,
            on_code_change=self.on_code_change,
        )
        # The code must reproduce what the run journaled before anything runs for real;
        # a divergence refuses here, before the lock, an attempt or any effect. The check
        # runs the body once more from the top (docs/runner.md), so by default only when
        # the job's code changed since the run recorded it; "replay": before every resume.
        changed = meta.code_fingerprint not in (None, self.fingerprint)
        patches = (
            check_before_resume(self.fn, store, meta, version=self.version)
            if self.on_code_change == "replay" or (self.on_code_change == "resume" and changed)
            else {}
        )
        run = store.resume_writer(run_id)
        try:
            meta = run.meta  # re-read under the lock: another process may have finished it
            done = settled(store, meta, input_value, pause_seq)
        except BaseException:
            run.close()
            raise
        if done is not None:
            run.close()
            return done
        return self._attempt(
            store, run, meta.params, meta, input_value=input_value, in_doubt=in_doubt, tags=tags,
            patches=patches,
        )  # fmt: skip

    def _attempt(
        self,
        store: Store,
        run: RunWriter,
        params: Any,
        meta: RunMeta | None,
        *,
        input_value: Any,
        in_doubt: Any,
        tags: dict[str, str] | None = None,
        patches: dict[str, bool] | None = None,
    ) -> _Attempt:
        writer = DurableWriter(run, self.durability, flush_timeout_s=self.flush_timeout_s)  # type: ignore[arg-type]
        observations: tuple[AttemptObservation, ...] = ()
        try:
            state: dict[str, Any] = {}
            cursors: dict[str, Any] = {}
            migrated = False
            snapshot: Any = None
            if meta is not None:
                snapshot = run.reader().resume_state(on_corrupt="fallback").state
                if isinstance(snapshot, dict):
                    state = dict(snapshot.get("state") or {})
                    cursors = dict(snapshot.get("cursors") or {})
                    # The state's version travels with the state, so a crash between a
                    # migration and its checkpoint can never apply the migration twice.
                    state_version = snapshot.get("version", meta.version)
                    if state_version != self.version:
                        state = migrate_state(
                            run.run_id,
                            state,
                            state_version,
                            self.version,
                            entrypoint=self.entrypoint,
                            on_code_change=self.on_code_change,
                        )
                        migrated = True
            # A run made for another process to start (a schedule's slot, a submitted or
            # restarted run) is at its first attempt with nothing written: not a resume.
            resumed = meta is not None and (meta.attempt > 1 or run.seq > 0)
            report = start_report(run, snapshot, resumed=resumed)
            observations = observe_attempt(run, self.entrypoint, resumed=resumed)
            writer.update_meta(
                status=RunStatus.RUNNING,
                pause=None,
                error=None,
                wake_at_ms=0,
                code_fingerprint=self.fingerprint,
                version=self.version,
                # where it runs now: the next process to continue it starts from here
                extra=attempt_extra(run.meta.extra, origin_here(self.fn), tags, observations),
            )
            ctx = RunContext(
                writer,
                store,
                state=state,
                cursors=cursors,
                version=self.version,
                attempt=run.meta.attempt,
                resumed=resumed,
                input_value=input_value,
                in_doubt=in_doubt if in_doubt is not None else self.in_doubt,
                report=report,
                observations=observations,
                patches=patches,
            )
            if meta is None:
                # A new run: its running meta is all a resume needs, so it is published
                # now, before the body runs, without a run_started checkpoint (whose
                # payload would only repeat the meta: docs/guarantees.md, "What a new run
                # costs"). A resumed attempt still marks where it began.
                run.publish()
            else:
                writer.checkpoint(
                    Phase.RUN_STARTED,
                    {
                        "agent_name": self.entrypoint,
                        "resumed": resumed,
                        PROGRESS_KEY: report.progress_payload(),
                    },
                    step=report.steps,
                )
            if migrated:
                ctx.checkpoint()
                writer.flush()
            p = params if isinstance(params, dict) else {}
            args, kwargs = list(p.get("args") or []), dict(p.get("kwargs") or {})
            return _Attempt(writer, ctx, args, kwargs, observations)
        except BaseException as exc:
            attempt_ended(run.run_id, observations, "stopped", exc)
            with contextlib.suppress(Exception):
                writer.close()
            raise

    def _complete(self, begun: _Attempt, result: R) -> R:
        writer = begun.writer
        try:
            extras = terminal_extras(begun.ctx)
            try:
                writer.finish(result, **extras)
            except (TypeError, msgspec.EncodeError) as exc:
                begun.ctx.report.put_back(extras.get("metrics"))
                raise TypeError(
                    f"run {writer.run_id!r}: the job returned a value that cannot be stored "
                    f"({exc}); return msgpack-able data"
                ) from exc
        except BaseException as exc:
            self._abort(begun, exc)
            raise
        attempt_ended(writer.run_id, begun.observations, "completed", None)
        writer.close()
        return result

    def _abort(self, begun: _Attempt, exc: BaseException) -> None:
        writer = begun.writer
        ended = "stopped"
        try:
            if isinstance(exc, RunPaused):
                ended = "paused"  # already durably paused by ctx.pause
            elif isinstance(exc, RunSleeping):
                ended = "sleeping"  # already durably parked by ctx.sleep
            elif (
                isinstance(exc, Exception)
                and not isinstance(exc, WriterFailedError)
                and writer.failed is None
            ):
                ended = "failed"
                writer.fail(exc, **terminal_extras(begun.ctx, exc))
            # BaseExceptions (KeyboardInterrupt, StopRequested from SIGTERM or Ctrl-C):
            # the run is stopped, not failed; close() below persists what is queued.
        except Exception as write_error:
            log.error("run %s: could not record the failure: %s", writer.run_id, write_error)
        attempt_ended(writer.run_id, begun.observations, ended, exc)
        try:
            writer.close()
        except Exception as close_error:
            log.error("run %s: closing the writer failed: %s", writer.run_id, close_error)
        line = stopped_line(writer.run_id, exc)
        if line is not None:
            log.warning("%s", line)
