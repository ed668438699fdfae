"""The exception hierarchy of afk_local, rooted at :class:`AfkLocalError`.

Every message names the run, the file (where there is one) and what a user can
do next, because these errors are usually read long after the run died.

Every error class of the package is defined here, also those raised by one
sub-package only (the agent's, the integrations'), so that this module, the lowest
layer, is the one place to find them; their old homes import them back. Each one
pickles with its fields, because Dask, Ray and the watcher carry errors between
processes (see :func:`_rebuild_error`).
"""

from __future__ import annotations

import datetime
import errno
import os
import shlex
from typing import Any, TypeVar

_E = TypeVar("_E", bound=BaseException)


def _rebuild_error(cls: type[_E], args: tuple[Any, ...]) -> _E:
    """An instance of ``cls`` holding ``args`` (its message), made without ``__init__``.

    The inverse of :func:`_reduce_error`. Error classes take their fields as
    constructor arguments and pass only the message they format on to
    ``Exception``, so the default unpickling, ``cls(*args)`` with that message,
    fails or loses fields. Rebuilding skips ``__init__``: the message is restored
    as it was and the fields come back through the instance ``__dict__``.
    """
    error = cls.__new__(cls, *args)
    if isinstance(error, OSError):
        OSError.__init__(error, *args)  # errno, strerror, filename: slots, not __dict__
    else:
        error.args = args
    return error


def _reduce_error(error: BaseException) -> tuple[Any, ...]:
    """``__reduce__`` for an error whose ``__init__`` takes other arguments than its message.

    Returns ``(_rebuild_error, (type, args), fields)``: the type, the message and
    every attribute (``run_id``, ``path``... and ``__notes__``) survive the round
    trip, whatever the class's constructor takes. As with every exception,
    ``__cause__``, ``__context__`` and the traceback are not carried.
    """
    args = error.args
    if isinstance(error, OSError) and error.filename is not None:
        args = (error.errno, error.strerror, error.filename)  # as OSError's own reduce
    return (_rebuild_error, (type(error), args), error.__dict__ or None)


class AfkLocalError(Exception):
    """Base class of every error raised by afk_local; every subclass pickles with its fields."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce_error(self)


class InvalidRunIdError(AfkLocalError, ValueError):
    """A run id does not match ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``."""

    def __init__(self, run_id: object) -> None:
        self.run_id = run_id
        super().__init__(
            f"invalid run id {run_id!r}: use 1-128 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )


class RunNotFoundError(AfkLocalError, LookupError):
    """No run with this id exists in the store."""

    def __init__(self, run_id: str, root: str) -> None:
        self.run_id = run_id
        self.root = root
        super().__init__(
            f"run {run_id!r} not found under {root}: run `afk-local runs --root {root}` "
            "to list the runs there"
        )


class CheckpointNotFoundError(AfkLocalError, LookupError):
    """The run has no checkpoint with the requested seq."""

    def __init__(self, run_id: str, seq: int) -> None:
        self.run_id = run_id
        self.seq = seq
        super().__init__(
            f"run {run_id!r} has no checkpoint {seq}: run `afk-local log {run_id}` to list them"
        )


class RunExistsError(AfkLocalError, FileExistsError):
    """``Store.create`` was asked for a run id that is already taken."""

    def __init__(self, run_id: str, path: str, *, next_step: str | None = None) -> None:
        self.run_id = run_id
        step = next_step or "resume it with `store.resume_writer(run_id)` or choose another id"
        super().__init__(f"run {run_id!r} already exists at {path}: {step}")


class RunLockedError(AfkLocalError):
    """Another process (or writer) owns the run: one writer per run."""

    def __init__(self, run_id: str, lock_path: str, owner: str | None = None) -> None:
        self.run_id = run_id
        self.lock_path = lock_path
        held_by = f" by {owner}" if owner else ""
        super().__init__(
            f"run {run_id!r} is being written{held_by} (lock {lock_path} is held): wait for "
            "that process to finish, or stop it, then try again"
        )


class CheckpointCorruptionError(AfkLocalError):
    """A checkpoint or meta file failed its integrity checks.

    ``moved`` is true when what failed is a file or a delta base not being where the
    reader's view of the run said (gone, or replaced under the same name): what a
    rewrite (pack, merge, gc) racing a lock-free read looks like. Readers retry such a
    failure against a fresh view of the run; any other failure is damage.
    """

    def __init__(
        self,
        path: str,
        reason: str,
        run_id: str | None = None,
        *,
        moved: bool = False,
        root: str | None = None,
    ) -> None:
        self.path = path
        self.reason = reason
        self.run_id = run_id
        self.moved = moved
        run = f"run {run_id!r}: " if run_id else ""
        at = f" --root {shlex.quote(root)}" if root else ""
        hint = f"`afk-local verify {run_id}{at}`" if run_id else f"`afk-local verify{at}`"
        super().__init__(
            f"{run}corrupt file {path}: {reason}; run {hint} to see every damaged file"
        )


class DecodeBudgetError(CheckpointCorruptionError):
    """One read decoded more delta frames than its budget allows: it stops, it never
    turns quadratic. Loops over candidates re-raise it instead of trying the next."""


class EffectLogCorruptionError(AfkLocalError):
    """The effect journal is damaged somewhere other than a torn tail."""

    def __init__(self, path: str, offset: int, reason: str, run_id: str | None = None) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        self.run_id = run_id
        run = f"run {run_id!r}: " if run_id else ""
        target = run_id or "RUN"
        super().__init__(
            f"{run}effect journal {path} is corrupt at byte {offset}: {reason}; good records "
            "follow the damage, so it is not a torn write. Restore the file from a backup, "
            f"or save the intact part into a new run with `afk-local fork {target} --salvage`"
            " (it lists what is lost and in doubt)"
        )


class EffectMismatchError(AfkLocalError):
    """A journaled call is replayed with different inputs than were recorded.

    ``recorded`` and ``current`` are the two calls in words (``charge('a', 10)``).
    """

    def __init__(
        self, run_id: str, key: str, recorded: str, current: str, path: str | None = None
    ) -> None:
        self.run_id = run_id
        self.key = key
        self.recorded = recorded
        self.current = current
        where = f" ({path})" if path else ""
        super().__init__(
            f"run {run_id!r}: step {key!r}{where} was recorded as {recorded} but the code now "
            f"calls {current}: the code or its inputs changed since the run started. "
            f"`afk-local replay {run_id}` shows the first divergence; to continue, put the "
            "change behind `if ctx.patched(...)`, restore the old inputs, fork the run before "
            "this step or restart it"
        )


class ReplayDivergence(EffectMismatchError):
    """The job's current code does not reproduce a run's journal (``afk-local replay``).

    An :class:`EffectMismatchError` found before anything runs: code that catches
    that error around a resume catches this one too.

    Attributes:
        run_id: the run.
        position: the 1-based position, among the run's journaled calls, where the
            code first departs from the journal.
        key: the journal key there (``charge#2``, ``iterate#1[3]/fetch#1``).
        recorded: what the run recorded there, in words (``charge('b', 20)``, or
            ``nothing`` when the code asks a call past the run's journal).
        asked: what the code asks there now, in words (``fee('b')``, or ``nothing``
            when the code ends without the recorded call).
        kind: ``"step"`` (another call than recorded), ``"arguments"`` (the same call
            with other arguments), ``"missing"`` (the code no longer makes a recorded
            call), ``"result"`` (a finished run, another result) or ``"raised"``.
        advice: what to do about it.
        refused: raised by a resume that refused to start (the message is one line
            naming ``afk-local replay RUN``).
    """

    def __init__(
        self,
        run_id: str,
        position: int,
        key: str,
        recorded: str,
        asked: str,
        *,
        kind: str = "step",
        advice: str = "",
        refused: bool = False,
    ) -> None:
        self.run_id = run_id
        self.position = position
        self.key = key
        self.recorded = recorded
        self.asked = asked
        self.kind = kind
        self.advice = advice or replay_advice(run_id)
        self.refused = refused
        self.current = asked
        where = f"at call {position} ({key}) the run recorded {recorded}, the code now asks {asked}"
        if refused:
            message = (
                f"run {run_id!r}: resume refused before any effect: the code diverges from the "
                f"journal: {where}; run `afk-local replay {run_id}` for what to do"
            )
        else:
            message = f"run {run_id!r}: the code diverges from the journal: {where}. {self.advice}"
        AfkLocalError.__init__(self, message)


def replay_advice(run_id: str) -> str:
    """What to do about a run whose journal the current code does not reproduce."""
    return (
        'Either put the change behind `if ctx.patched("<id>"):` so that runs which '
        "passed this point keep the old path; or fork the run before this call "
        f"(`afk-local fork {run_id} --at SEQ`, SEQ from `afk-local log {run_id}`) and "
        f"resume the fork; or restart it from the beginning (`afk-local restart {run_id}`)"
    )


IN_DOUBT_CAUSES = (
    "its process died or was killed, was stopped at once by a second Ctrl-C, or the "
    "result it returned could not be stored"
)
"""Why an effect can be in doubt, for messages: the journal does not record which it was."""


class EffectInDoubtError(AfkLocalError):
    """A side effect was started but its outcome was never recorded: it may or may not have
    happened (its process died, was stopped at once by a second Ctrl-C, or the result it
    returned could not be stored)."""

    def __init__(
        self, run_id: str, key: str, idempotency_key: str, path: str | None = None
    ) -> None:
        self.run_id = run_id
        self.key = key
        self.idempotency_key = idempotency_key
        where = f" in {path}" if path else ""
        import shlex  # noqa: PLC0415 - only this message needs it; a reader never does

        quoted = shlex.quote(key)
        super().__init__(
            f"run {run_id!r}: effect {key!r} was started but has no recorded outcome{where} "
            f"({IN_DOUBT_CAUSES}): it may or may not have happened. Check the outside system for "
            f"idempotency key {idempotency_key!r}, then record what happened with "
            f"`afk-local settle {run_id} {quoted} --done --result JSON` (JSON: what it "
            "returned; or --failed 'it did not happen') "
            f"and resume, or call it again with `afk-local resume {run_id} --in-doubt retry` "
            "(in Python: afk.resume(run_id, in_doubt='retry'))"
        )


class SchemaVersionError(AfkLocalError):
    """A record was written by a newer afk_local than this one."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"{path} has schema version {found}, this afk_local reads up to {supported}: "
            "upgrade afk_local to read it"
        )


class WriterFailedError(AfkLocalError):
    """A durable write failed earlier; this writer refuses further writes."""

    def __init__(self, run_id: str, cause: BaseException) -> None:
        self.run_id = run_id
        if isinstance(cause, DiskFullError):  # its line says what to do: space, then resume
            super().__init__(f"run {run_id!r}: the writer stopped: {cause}")
            return
        super().__init__(
            f"run {run_id!r}: an earlier write failed ({cause}); the writer is closed to avoid "
            f"acknowledging data the disk may have lost. Resume the run (`afk-local resume "
            f"{run_id}`, or run its job again); code that writes with a RunWriter reopens it "
            "with `store.resume_writer(run_id)`"
        )


class DiskFullError(AfkLocalError, OSError):
    """The disk (or quota) holding the store is full: nothing was lost, the run can resume.

    Raised by every write of the store in place of the bare ``OSError``
    (``errno`` is ``ENOSPC`` or ``EDQUOT``), with one line naming the disk
    (``mount``), the directory written to (``path``) and the space left
    (``free_bytes``). The write that failed was not acknowledged; once space is
    freed, resuming the run continues from its last checkpoint.
    """

    def __init__(self, path: str, mount: str, free_bytes: int, code: int = errno.ENOSPC) -> None:
        self.path = path
        self.mount = mount
        self.free_bytes = free_bytes
        what = "the disk quota" if code == getattr(errno, "EDQUOT", -1) else "the disk"
        OSError.__init__(
            self,
            code,
            f"{what} mounted at {mount} is full ({_size(free_bytes)} free) while writing "
            f"{path}: free space on it (delete files you do not need there, or "
            "`afk-local gc` old runs), then resume the run; it continues from its last "
            "checkpoint",
        )

    def __str__(self) -> str:
        return str(self.strerror)


class InvalidStoreRootError(AfkLocalError, ValueError):
    """A store root that cannot be meant: empty, only whitespace, or holding a line break."""

    def __init__(self, root: str, given: str) -> None:
        self.root = root
        self.given = given
        super().__init__(
            f"invalid store root {root!r} (from {given}): it is empty, blank or holds a line "
            "break; give the store's directory with --root or AFK_LOCAL_ROOT (`~` is expanded)"
        )


class StoreUnusableError(AfkLocalError, OSError):
    """The store's directory cannot be made or written (a path under ``/proc``, a file in
    the way, no permission): one line naming the path and the reason.

    Also an ``OSError`` with the underlying ``errno`` and ``filename``, so code that
    handles ``OSError`` keeps working.
    """

    def __init__(self, root: str, code: int, reason: str, filename: str) -> None:
        self.root = root
        OSError.__init__(self, code, reason, filename)

    def __str__(self) -> str:
        where = "" if self.filename == self.root else f" ({self.filename})"
        return (
            f"cannot use {self.root} as a store: {self.strerror}{where}; give Store(root=...) "
            "(or AFK_LOCAL_ROOT) a directory you can write"
        )


class StoreReadOnlyError(StoreUnusableError):
    """The store is on a read-only filesystem or in a directory this process cannot write.

    Nothing can start or continue a run there; everything that only reads still works.
    """

    def __str__(self) -> str:
        return (
            f"the store {self.root} is read-only ({self.strerror}): no run can start or "
            "continue in it; reading still works (`afk-local runs`, `show`, `log`, "
            "`effects`, `export`, `gc --dry-run`); make it writable, or copy it to a "
            "writable place and adopt it there (`afk-local adopt`)"
        )


def _size(n: int) -> str:
    """``n`` bytes for people: ``76 KiB``, ``3.0 MiB``."""
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n // 1024} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


class KeyRequiredError(AfkLocalError):
    """A signed run, or a keyed store, was opened for writing by a store without a key."""

    def __init__(self, run_id: str, path: str, *, keyed_store: bool = False) -> None:
        self.run_id = run_id
        self.path = path
        what = (
            f"the store is keyed ({path} says so)"
            if keyed_store
            else f"run {run_id!r} is signed ({path} carries an HMAC)"
        )
        super().__init__(
            f"{what} but this store has no key: writing would leave unsigned records its "
            "keyed readers refuse. Open it with its key (set AFK_LOCAL_KEY or pass "
            "Store(key=...))"
        )


class UntrustedStoreError(AfkLocalError):
    """A store or run failed a trust check: nothing it names is executed (docs/security.md).

    Raised before any code a store names is imported or run, and by writers that
    must not follow a symlink out of the store. ``reason`` says what is wrong,
    ``hint`` what to do about it.
    """

    def __init__(self, path: str, reason: str, hint: str, run_id: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.hint = hint
        self.run_id = run_id
        run = f"run {run_id!r}: " if run_id else ""
        super().__init__(f"{run}refused: {path}: {reason}; {hint}")


class StoreMovedError(UntrustedStoreError):
    """The store was copied or moved: nothing it names is run until it is adopted.

    Its runs still record the old working directory and scripts, so a resume from
    here would run their jobs there again. ``afk-local adopt`` makes ``root`` the
    store's home (docs/cli.md).
    """

    def __init__(self, path: str, root: str, recorded: str, run_id: str | None = None) -> None:
        self.root = root
        self.recorded = recorded
        super().__init__(
            path,
            f"this store was created at {recorded} and is now at {root} (copied or moved)",
            f"nothing was run; to make {root} its home, run `afk-local --root {root} adopt`",
            run_id,
        )


class RunRolledBackError(UntrustedStoreError):
    """A keyed run is behind its head record: acknowledged writes are gone (rolled back)."""


class RunPaused(AfkLocalError):
    """Control flow: the run is waiting for input and its process should return."""

    def __init__(self, run_id: str, kind: str = "input", prompt: Any = None) -> None:
        self.run_id = run_id
        self.kind = kind
        self.prompt = prompt
        super().__init__(
            f"run {run_id!r} is paused waiting for {kind}: resume it with "
            f"`afk.resume({run_id!r}, input=...)` or `afk-local resume {run_id} --input JSON`"
        )


class RunSleeping(AfkLocalError):
    """Control flow: the run parked in a long ``ctx.sleep`` and its process should return.

    The run's status is ``sleeping`` until ``wake_at_ms`` (wall clock, ms); a watcher
    (``afk-local watch``) resumes it then, and so does ``afk-local resume RUN`` (a
    resume before the due time parks it again).
    """

    def __init__(self, run_id: str, wake_at_ms: int) -> None:
        self.run_id = run_id
        self.wake_at_ms = wake_at_ms
        when = datetime.datetime.fromtimestamp(wake_at_ms / 1000, datetime.timezone.utc)
        super().__init__(
            f"run {run_id!r} is sleeping until {when.isoformat(timespec='seconds')}: "
            f"`afk-local watch` resumes it then (`afk-local show {run_id}`)"
        )


class RunCancelledError(AfkLocalError):
    """The run was cancelled: it is terminal and is never resumed."""

    def __init__(self, run_id: str, reason: str | None = None) -> None:
        self.run_id = run_id
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"run {run_id!r} was cancelled{why} and will not run again: start a new run, or "
            f"fork it with `afk-local fork {run_id} --at SEQ` to continue from a checkpoint"
        )


class CodeChangedError(AfkLocalError):
    """A run would resume under different code and its job refuses that (``on_code_change``)."""

    def __init__(self, run_id: str, entrypoint: str, recorded: str, current: str) -> None:
        self.run_id = run_id
        self.entrypoint = entrypoint
        self.recorded = recorded
        self.current = current
        super().__init__(
            f"run {run_id!r}: the code of {entrypoint} changed since the run started "
            f"({recorded} -> {current}) and the job says on_code_change='refuse'. Restore the "
            "old code, register an afk.migration and bump version=, or use "
            "on_code_change='resume' to continue anyway"
        )


class EntrypointError(AfkLocalError):
    """A run's entrypoint cannot be found or imported, so it cannot be resumed here.

    ``gone``: the code the run names is missing where the run ran (a renamed or
    removed function, a module or script that is not there), so resuming it again
    cannot work until someone restores it; the run is then marked unresumable
    (``afk-local runs`` and ``show`` say why, the watcher leaves it alone).
    """

    def __init__(
        self, run_id: str, entrypoint: str | None, reason: str, *, gone: bool = False
    ) -> None:
        self.run_id = run_id
        self.entrypoint = entrypoint
        self.reason = reason
        self.gone = gone
        super().__init__(f"run {run_id!r}: cannot resume entrypoint {entrypoint!r}: {reason}")


class UnstorableValueError(AfkLocalError, TypeError):
    """A value to store (state, a step's result, job arguments) has a type nothing can store.

    ``path`` says where it is (``state.model.weights``), ``type_name`` what it is.
    """

    def __init__(self, path: str, type_name: str, run_id: str | None = None) -> None:
        self.path = path
        self.type_name = type_name
        self.run_id = run_id
        run = f"run {run_id!r}: " if run_id else ""
        super().__init__(
            f"{run}cannot store {path}: {type_name} is neither msgpack data (dict, list, str, "
            "int, float, bool, None, bytes) nor a type afk_local stores (datetime, date, time, "
            "timedelta, UUID, Decimal, Path, set, Enum, dataclass, msgspec Struct, numpy array, "
            "pandas DataFrame/Series/Index, Arrow table); convert it, or give the Store (or "
            'StateCheckpoint) an enc_hook/dec_hook pair (docs/runner.md, "Custom types")'
        )

    def under(self, prefix: str, run_id: str | None = None) -> UnstorableValueError:
        """The same error with ``prefix`` put before its path (and the run named)."""
        inner = "" if self.path == "(the value itself)" else self.path
        path = f"{prefix}.{inner}" if prefix and inner else (prefix or self.path)
        return UnstorableValueError(path, self.type_name, run_id or self.run_id)


class IntOutOfRangeError(UnstorableValueError):
    """An int to store is outside msgpack's range (-2**63 .. 2**64 - 1)."""

    def __init__(self, path: str, type_name: str, run_id: str | None = None) -> None:
        self.path = path
        self.type_name = type_name
        self.run_id = run_id
        run = f"run {run_id!r}: " if run_id else ""
        AfkLocalError.__init__(
            self,
            f"{run}cannot store {path}: {type_name} is outside the ints msgpack holds "
            "(-2**63 .. 2**64 - 1); store it as str(n) or decimal.Decimal(n)",
        )

    def under(self, prefix: str, run_id: str | None = None) -> UnstorableValueError:
        """The same error with ``prefix`` put before its path (and the run named)."""
        inner = "" if self.path == "(the value itself)" else self.path
        path = f"{prefix}.{inner}" if prefix and inner else (prefix or self.path)
        return IntOutOfRangeError(path, self.type_name, run_id or self.run_id)


class RecordTooDeepError(UnstorableValueError):
    """A value nests lists and dicts deeper than a record may: refused before any I/O.

    Python decodes nested msgpack recursively, so a reader near its recursion limit
    (the CLI, a watcher child) could not read such a record back (docs/security.md).
    """

    def __init__(self, path: str, limit: int, run_id: str | None = None) -> None:
        super().__init__(path, f"a structure nested more than {limit} levels deep", run_id)
        self.limit = limit
        run = f"run {run_id!r}: " if run_id else ""
        Exception.__init__(
            self,
            f"{run}cannot store {path}: it nests lists/dicts deeper than {limit} levels (or "
            "contains itself), and a reader could not decode it back; flatten it, or store "
            "that part as a JSON string",
        )

    def under(self, prefix: str, run_id: str | None = None) -> UnstorableValueError:
        """The same error with ``prefix`` put before its path (and the run named)."""
        return RecordTooDeepError(super().under(prefix).path, self.limit, run_id or self.run_id)


class SettleError(AfkLocalError, ValueError):
    """An effect cannot be settled: the run has no such effect, or it is not in doubt."""

    def __init__(self, run_id: str, key: str, reason: str) -> None:
        self.run_id = run_id
        self.key = key
        super().__init__(f"run {run_id!r}: cannot settle: {reason}")


class ForkedWriterError(WriterFailedError):
    """A forked child used a writer it inherited: only the process that opened a run writes it."""

    def __init__(self, run_id: str, owner_pid: int, pid: int) -> None:
        self.run_id = run_id
        self.owner_pid = owner_pid
        self.pid = pid
        AfkLocalError.__init__(
            self,
            f"run {run_id!r}: this writer was opened by process {owner_pid}; process {pid} is a "
            "fork of it and may not write to the run (the lock, the queue and the journal "
            "belong to the opening process). Do the work in the parent, or open the run in "
            "the child only after the parent closed it",
        )


class PauseMismatchError(AfkLocalError, ValueError):
    """An answer names a pause the run is no longer waiting at: it is never applied to another."""

    def __init__(self, run_id: str, pause_seq: int, now: str) -> None:
        self.run_id = run_id
        self.pause_seq = pause_seq
        if pause_seq < 1:
            super().__init__(
                f"run {run_id!r} is {now}, not paused: there is no pause to answer; nothing "
                "was done"
            )
            return
        super().__init__(
            f"run {run_id!r}: the answer is for the pause at checkpoint {pause_seq}, but the run "
            f"is {now}: that pause was answered already or the run moved on, so nothing was "
            f"done. Answer what it waits for now: `afk-local show {run_id}`, then "
            f"`afk-local resume {run_id} --input JSON`"
        )


class LeaseLostError(AfkLocalError):
    """Another store holds the run's lease on its remote mirror: this store may not write it.

    Raised by a mirrored writer once its mirror sees a newer lease (``pull --take``
    elsewhere), or once its own clock says its lease may have lapsed (its last renewal
    is older than the lease period minus a safety margin, or its mirror gave up): it
    fenced itself. Also by ``push`` for a taken run, and by opening a copy pulled
    without ``--take`` for writing. The writer then refuses every checkpoint and effect.
    """

    def __init__(self, run_id: str, url: str, detail: str, *, next_step: str | None = None) -> None:
        self.run_id = run_id
        self.url = url
        step = next_step or f"Take it back with `afk-local pull {run_id} --from {url} --take`"
        super().__init__(
            f"run {run_id!r}: lease lost on {url}: {detail}; this store may not write the run. "
            f"{step}"
        )


class MirrorError(AfkLocalError):
    """A remote mirror could not upload (after its retries), or is not available here."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(f"mirror {url}: {detail}")


class NotRegularFileError(OSError):
    """A path where a regular file is expected is a FIFO, socket, device or directory.

    Raised without blocking: the file is opened ``O_NONBLOCK`` and checked with
    ``fstat`` before anything is read, so a planted FIFO cannot hang a reader.
    Not an :class:`AfkLocalError`: callers handle it as the ``OSError`` it is.
    """

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"is a {kind}, not a regular file", os.fspath(path))
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce_error(self)


class BucketRequestError(MirrorError):
    """A request to the remote failed after obstore's own retries.

    ``retryable`` is False for answers that retrying cannot change (credentials,
    permissions); the background mirror retries the others a while longer.
    """

    def __init__(self, url: str, detail: str, *, retryable: bool) -> None:
        super().__init__(url, detail)
        self.retryable = retryable


class RemoteIntegrityError(MirrorError):
    """A pulled run did not verify: nothing was published locally."""


class FlushTimeoutError(AfkLocalError, TimeoutError):
    """Queued checkpoints were not written within ``flush_timeout_s``."""

    def __init__(self, run_id: str, pending: int, timeout: float) -> None:
        self.run_id = run_id
        self.pending = pending
        super().__init__(
            f"run {run_id!r}: {pending} queued checkpoint(s) not written within {timeout:g} s "
            "(the disk is slow or stuck); nothing was marked finished. Check the disk, then "
            "resume the run, or raise flush_timeout_s"
        )


class StateEditError(AfkLocalError, ValueError):
    """A ``--set`` path that the state does not have, or no state to edit."""

    def __init__(self, run_id: str, message: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r}: {message}")


class ImportFormatError(AfkLocalError, ValueError):
    """An import file is not an afk-local export."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(
            f"{source} is not an afk-local export ({reason}); create one with "
            "`afk-local export RUN > FILE`"
        )


class ImportFieldError(ImportFormatError):
    """A record of an export has a field afk-local will not store (one line, naming it)."""

    def __init__(self, source: str, where: str, reason: str) -> None:
        AfkLocalError.__init__(
            self, f"{source}: {where}: {reason}; nothing was imported (fix or re-export the run)"
        )


# The agent runner's errors (afk_local.agent).


class LLMFailedError(AfkLocalError):
    """The LLM callable still raised after its retries (the run ends ``failed``)."""

    def __init__(self, run_id: str, step: int, cause: BaseException) -> None:
        self.run_id = run_id
        self.step = step
        super().__init__(
            f"run {run_id!r}: the LLM failed at step {step}: {type(cause).__name__}: {cause}. "
            f"`runner.resume(agent, {run_id!r})` retries from the newest snapshot"
        )


class MaxStepsError(AfkLocalError):
    """The agent used ``max_steps`` LLM steps without a final answer."""

    def __init__(self, run_id: str, max_steps: int) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r}: no final answer after max_steps={max_steps}; raise max_steps "
            f"and resume with `runner.resume(agent, {run_id!r})`"
        )


class ToolFailedError(AfkLocalError):
    """A tool still raised after its retries (the run ends ``failed``; ``resume`` retries it)."""

    def __init__(self, run_id: str, name: str, call_id: str, message: str) -> None:
        self.run_id = run_id
        self.tool = name
        self.call_id = call_id
        super().__init__(
            f"run {run_id!r}: tool {name!r} (call {call_id}) failed: {message}. Fix the cause, "
            f"then `runner.resume(agent, {run_id!r})` retries it; finished calls are replayed"
        )


class SubagentFailedError(AfkLocalError):
    """A subagent's child run did not complete."""

    def __init__(self, run_id: str, child_run_id: str, state: str, message: str | None) -> None:
        self.run_id = run_id
        self.child_run_id = child_run_id
        super().__init__(
            f"run {run_id!r}: subagent run {child_run_id!r} ended {state}"
            + (f": {message}" if message else "")
            + f"; inspect it with `afk-local show {child_run_id}`"
        )


class AgentFailedError(RuntimeError):
    """``afk-local resume`` of an agent run that ended ``failed`` (exit code 1).

    Not an :class:`AfkLocalError`: the library worked, the agent's run
    failed — as when a durable job raises. The reason is in the run (``afk-local show``).
    It pickles with its fields all the same.
    """

    def __init__(self, run_id: str, error: str | None) -> None:
        self.run_id = run_id
        self.error = error
        super().__init__(f"agent run {run_id!r} failed: {error or 'see its run_terminal'}")

    def __reduce__(self) -> tuple[Any, ...]:
        return _reduce_error(self)


# The integrations' errors (afk_local.integrations): defined here, so that a
# worker can unpickle one without the extra that raised it being importable.


class AgentRequestMismatchError(EffectMismatchError):
    """A resumed agent run asks the model something else than the call it would replay.

    Raised by the agent integrations (pydantic-ai's ``DurableAgent``, the Agents SDK's
    ``DurableRunner``) before the recorded answer is handed back: ``differences`` says in
    words what the request sends now that it did not then (a message, a tool, the output
    type). An ``except EffectMismatchError`` catches it too.
    """

    def __init__(
        self, run_id: str, key: str, differences: list[str], path: str | None = None
    ) -> None:
        self.run_id = run_id
        self.key = key
        self.differences = list(differences)
        self.path = path
        where = f" ({path})" if path else ""
        what = "; ".join(self.differences) or "the request is not the one recorded"
        # EffectMismatchError's own text speaks of hashes and forks: neither helps here.
        AfkLocalError.__init__(
            self,
            f"run {run_id!r}: model call {key!r}{where} would replay an answer to another "
            f"request: {what}. An agent run keeps no checkpoint between its model calls, so a "
            "fork cannot redo this call: resume with the code, prompt and tools the run was "
            "recorded with to finish it, or start a new run (another run id) with this code",
        )


class LLMHTTPError(AfkLocalError):
    """The chat-completions endpoint answered with an error or something unreadable."""

    def __init__(self, url: str, status: int | None, detail: str) -> None:
        self.url = url
        self.status = status
        code = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(
            f"chat-completions call to {url} failed ({code}): {detail[:500]}; check the "
            "base_url, the model name and the API key (OPENAI_API_KEY)"
        )


class RunFailed(AfkLocalError):
    """Raised by a fan-out task on its worker: the durable run ``run_id`` did not complete.

    It carries the original error as text (its type, message and traceback),
    so it pickles the same way everywhere: the engine sends it back to the
    client, which reports it in a :class:`FanOutError`. The run itself is kept
    (failed or paused); the next ``map_durable`` call resumes it.
    """

    def __init__(
        self, run_id: str, error_type: str, message: str, traceback_text: str = ""
    ) -> None:
        self.run_id = run_id
        self.error_type = error_type
        self.message = message
        self.traceback_text = traceback_text
        super().__init__(f"run {run_id!r} failed: {error_type}: {message}")


class FanOutError(AfkLocalError):
    """Some runs of a ``map_durable`` call did not complete; every other run did.

    Attributes:
        failures: run id -> what went wrong (``"ValueError: bad item"``), in item order.
        total: how many runs the call had.
    """

    def __init__(self, failures: dict[str, str], total: int) -> None:
        self.failures = dict(failures)
        self.total = total
        shown = "; ".join(f"{rid}: {why}" for rid, why in list(self.failures.items())[:5])
        more = f" (and {len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
        super().__init__(
            f"{len(self.failures)} of {total} fan-out runs did not complete: {shown}{more}. "
            "Every run is kept: `afk-local show RUN` shows its error; fix the cause and call "
            "map_durable again: completed runs return their stored results, the others resume"
        )


def run_failure(exc: Exception) -> str:
    """One line for an error met while reading or rewriting one run of a store.

    Store-wide commands (listing, gc, pack, verify) report it for that run and go on
    with the others. An afk_local error or an OSError says what it is; anything else
    (damage no check caught, or a bug) is named with its type, so it can be reported.
    """
    if isinstance(exc, (AfkLocalError, OSError)):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {exc} (please report it)"
