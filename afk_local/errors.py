"""The exception hierarchy of afk_local, rooted at :class:`AfkLocalError`.

Every message names the run, the file (where there is one) and what a user can
do next, because these errors are usually read long after the run died.
"""

from __future__ import annotations

from typing import Any


class AfkLocalError(Exception):
    """Base class of every error raised by afk_local."""


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


class RunExistsError(AfkLocalError, FileExistsError):
    """``Store.create`` was asked for a run id that is already taken."""

    def __init__(self, run_id: str, path: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} already exists at {path}: resume it with "
            "`store.resume_writer(run_id)` or choose another id"
        )


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
    """A checkpoint or meta file failed its integrity checks."""

    def __init__(self, path: str, reason: str, run_id: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.run_id = run_id
        run = f"run {run_id!r}: " if run_id else ""
        hint = f"`afk-local verify {run_id}`" if run_id else "`afk-local verify`"
        super().__init__(
            f"{run}corrupt file {path}: {reason}; run {hint} to see every damaged file"
        )


class EffectLogCorruptionError(AfkLocalError):
    """The effect journal is damaged somewhere other than a torn tail."""

    def __init__(self, path: str, offset: int, reason: str, run_id: str | None = None) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        self.run_id = run_id
        run = f"run {run_id!r}: " if run_id else ""
        super().__init__(
            f"{run}effect journal {path} is corrupt at byte {offset}: {reason}; good records "
            "follow the damage, so it is not a torn write. Run `afk-local verify` and restore "
            "the file from a backup, or fork the run before the damage"
        )


class EffectMismatchError(AfkLocalError):
    """A journaled call is replayed with different inputs than were recorded."""

    def __init__(
        self, run_id: str, key: str, recorded: str, current: str, path: str | None = None
    ) -> None:
        self.run_id = run_id
        self.key = key
        where = f" ({path})" if path else ""
        super().__init__(
            f"run {run_id!r}: effect {key!r}{where} was recorded as {recorded} but is now called "
            f"as {current}; the code or its inputs changed since the run started. Restore the "
            "old inputs, or fork the run before this step to redo it"
        )


class EffectInDoubtError(AfkLocalError):
    """A side effect started before a crash and may or may not have happened."""

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
            f"run {run_id!r}: effect {key!r} was started before a crash but has no recorded "
            f"outcome{where}: it may or may not have happened. Check the outside system for "
            f"idempotency key {idempotency_key!r}, then record what happened with "
            f"`afk-local settle {run_id} {quoted} --done` (or --failed 'it did not happen') "
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
        super().__init__(
            f"run {run_id!r}: an earlier write failed ({cause}); the writer is closed to avoid "
            "acknowledging data the disk may have lost. Reopen the run with "
            "`store.resume_writer(run_id)`"
        )


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
    """A run's entrypoint cannot be found or imported, so it cannot be resumed here."""

    def __init__(self, run_id: str, entrypoint: str | None, reason: str) -> None:
        self.run_id = run_id
        self.entrypoint = entrypoint
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
            "timedelta, UUID, Decimal, Path, set, Enum, dataclass, msgspec Struct, numpy array); "
            "convert it, or give the Store an enc_hook/dec_hook pair (docs/runner.md, "
            '"Custom types")'
        )

    def under(self, prefix: str, run_id: str | None = None) -> UnstorableValueError:
        """The same error with ``prefix`` put before its path (and the run named)."""
        inner = "" if self.path == "(the value itself)" else self.path
        path = f"{prefix}.{inner}" if prefix and inner else (prefix or self.path)
        return UnstorableValueError(path, self.type_name, run_id or self.run_id)


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
    elsewhere), by ``push`` for such a run, and by opening a copy pulled without
    ``--take`` for writing. The writer then refuses every checkpoint and effect.
    """

    def __init__(self, run_id: str, url: str, detail: str) -> None:
        self.run_id = run_id
        self.url = url
        super().__init__(
            f"run {run_id!r}: lease lost on {url}: {detail}; this store may not write the run. "
            f"Take it back with `afk-local pull {run_id} --from {url} --take`"
        )


class MirrorError(AfkLocalError):
    """A remote mirror could not upload (after its retries), or is not available here."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(f"mirror {url}: {detail}")
