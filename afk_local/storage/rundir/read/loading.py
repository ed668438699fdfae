"""Loading what a run directory holds: one checkpoint through the catalog and its delta
chain, checked against its signature, and ``run.meta`` (with the copy a terminal
checkpoint carries).

The lowest part of a :class:`~afk_local.storage.rundir.read.reader.RunReader`, which
answers the questions a caller asks (latest, history, resume state, verify).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import msgspec

from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    CheckpointNotFoundError,
    DecodeBudgetError,
    RunNotFoundError,
    SchemaVersionError,
)
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import (
    NO_MAC,
    chain_links,
    history_run_ids,
    history_until,
    record_digest,
)
from afk_local.storage.format.layout import (
    CheckpointFile,
    RunPaths,
    parse_checkpoint_name,
)
from afk_local.storage.format.records import (
    META_COPY_KEY,
    Checkpoint,
    ErrorInfo,
    Phase,
    RunMeta,
    RunStatus,
)
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.chain import (
    MAX_READ_CHAIN,
    ChainDecoder,
)
from afk_local.storage.rundir.read.heads import HeadStore

if TYPE_CHECKING:
    pass

log = logging.getLogger("afk_local")

MAX_META_BYTES = 64 << 20


_MOVED_RETRIES = 4  # fresh views a read tries while rewrites keep moving its files


_NO_REWRITES = (None, ())  # view token of a run without packs or manifest (loose files aside)


class Skipped(msgspec.Struct, frozen=True):
    """A file the reader passed over, and why."""

    name: str
    reason: str


def _read_budget(files: list[CheckpointFile]) -> int:
    """Delta frames one pass over a run's files may follow: linear in the files, so a
    fallback through damaged checkpoints never re-decodes chain after chain."""
    return 2 * MAX_READ_CHAIN + 4 * len(files)


def _newer_schema(exc: SchemaVersionError) -> str:
    return (
        f"schema version {exc.found} (this afk_local reads up to {exc.supported}): "
        "written by a newer afk_local; upgrade to read it"
    )


def read_meta(paths: RunPaths, record_codec: RecordCodec) -> RunMeta:
    """Read and check ``run.meta``; RunNotFoundError when the run has none.

    A ``run.meta`` that a power cut tore or left behind its terminal checkpoint reads as
    that checkpoint says (:func:`meta_file_torn` tells the two apart for ``verify``).
    """
    try:
        meta = read_meta_file(paths, record_codec)
    except CheckpointCorruptionError as exc:
        recovered = _terminal_copy(paths, record_codec)
        if recovered is None:
            raise
        log.warning(
            "run %s: %s is damaged (%s); its copy in the terminal checkpoint is used",
            paths.run_id,
            exc.path,
            exc.reason,
        )
        return recovered
    if meta.status.expects_owner:
        return _with_terminal_status(paths, record_codec, meta)
    return meta


def read_meta_file(paths: RunPaths, record_codec: RecordCodec) -> RunMeta:
    """Decode ``run.meta`` as it is on disk, taking nothing from the checkpoints.

    Raises:
        RunNotFoundError: the run has no ``run.meta``.
        CheckpointCorruptionError: it cannot be read or does not decode.
    """
    path = str(paths.meta)
    try:
        data = fsio.read_bounded(path, MAX_META_BYTES)
    except FileNotFoundError:
        raise RunNotFoundError(paths.run_id, str(paths.dir.parent.parent)) from None
    except ValueError as exc:
        raise CheckpointCorruptionError(path, str(exc), paths.run_id) from None
    except OSError as exc:
        raise CheckpointCorruptionError(
            path, f"cannot read: {exc.strerror}", paths.run_id
        ) from None
    try:
        return codec.decode_meta(
            record_codec, data, path, max_bytes=MAX_META_BYTES, run_id=paths.run_id
        )
    except CheckpointCorruptionError as exc:
        raise CheckpointCorruptionError(exc.path, exc.reason, paths.run_id) from None


def meta_file_torn(paths: RunPaths, record_codec: RecordCodec) -> str | None:
    """Why ``run.meta`` does not decode when its terminal checkpoint's copy stands in for
    it (a power cut during its unsynced rewrite); None when it decodes, or when nothing
    stands in (then :func:`read_meta` raises)."""
    try:
        read_meta_file(paths, record_codec)
    except CheckpointCorruptionError as exc:
        return exc.reason if _terminal_copy(paths, record_codec) is not None else None
    return None


def _latest_terminal(
    paths: RunPaths, record_codec: RecordCodec, meta: RunMeta
) -> Checkpoint | None:
    """The run's newest checkpoint when it is terminal, else None."""
    reader = RunLoader(paths, record_codec=record_codec)
    reader._meta = meta  # a fork's shared history is read from this meta, not read again
    try:
        latest = reader.latest()
    except AfkLocalError:
        return None
    if latest is None or latest.phase != Phase.RUN_TERMINAL.value:
        return None
    return latest


def _copy_in(paths: RunPaths, record_codec: RecordCodec, payload: Any) -> RunMeta | None:
    """The ``run.meta`` copy a terminal payload carries, when it is this run's and decodes."""
    data = payload.get(META_COPY_KEY) if isinstance(payload, dict) else None
    if not isinstance(data, bytes):
        return None
    try:
        copy = codec.decode_meta(
            record_codec, data, str(paths.meta), max_bytes=MAX_META_BYTES, run_id=paths.run_id
        )
    except AfkLocalError:
        return None
    return copy if copy.run_id == paths.run_id else None  # an imported run's is another's


def _terminal_copy(paths: RunPaths, record_codec: RecordCodec) -> RunMeta | None:
    """The ``run.meta`` copy in the run's terminal checkpoint, for a torn ``run.meta``.

    The checkpoint is read with a stand-in meta (no fork history, no chain links): the
    torn one cannot say more, and reading it again would only come back here.
    """
    stand_in = RunMeta(run_id=paths.run_id, created_ms=0, updated_ms=0)
    latest = _latest_terminal(paths, record_codec, stand_in)
    return None if latest is None else _copy_in(paths, record_codec, latest.payload)


def _with_terminal_status(paths: RunPaths, record_codec: RecordCodec, meta: RunMeta) -> RunMeta:
    """``meta`` with the status its run's terminal checkpoint carries, when that checkpoint
    is newer than the meta: the run completed or failed, and a power cut lost the rename
    of its ``run.meta`` (which the writer leaves to a later directory fsync, or never
    makes durable at all: docs/guarantees.md, "What a new run costs"). Costs one
    ``readlink`` unless ``latest`` names a terminal checkpoint."""
    target = fsio.read_link(paths.latest)
    if target is None or not target.endswith(f".{Phase.RUN_TERMINAL.value}.ckpt"):
        return meta
    latest = _latest_terminal(paths, record_codec, meta)
    if latest is None or not isinstance(latest.payload, dict):
        return meta
    copy = _copy_in(paths, record_codec, latest.payload)
    if copy is not None:  # the very meta written after it: newer unless a retry began since
        return copy if copy.updated_ms > meta.updated_ms else meta
    if latest.timestamp_ms < meta.updated_ms:  # a retry began after it: the meta is newer
        return meta
    state = latest.payload.get("state")
    if state == RunStatus.COMPLETED.value:
        status, error = RunStatus.COMPLETED, None
    elif state == RunStatus.FAILED.value:
        status = RunStatus.FAILED
        try:
            error = msgspec.convert(latest.payload.get("error"), ErrorInfo)
        except msgspec.ValidationError:
            error = ErrorInfo(type="Error", message=str(latest.payload.get("message", "")))
    else:
        return meta
    return msgspec.structs.replace(
        meta, status=status, pause=None, error=error, updated_ms=latest.timestamp_ms
    )


class RunLoader:
    """A run's files, one checkpoint at a time: the part of a ``RunReader`` that loads."""

    def __init__(
        self,
        paths: RunPaths,
        *,
        record_codec: RecordCodec | None = None,
        max_record_bytes: int = codec.DEFAULT_MAX_RECORD_BYTES,
        heads: HeadStore | None = None,
        html_view: Callable[[Any], str] | None = None,  # takes the RunReader
        env: fsio.Env = fsio.DEFAULT_ENV,
    ) -> None:
        self.paths = paths
        self.env = env
        """The I/O seam of the store this run belongs to: what gc, fork and packing of
        this run write through (a reader itself never writes)."""
        self._html_view = html_view
        self._heads = heads
        self.run_id = paths.run_id
        self._codec = record_codec or RecordCodec()
        self._max_bytes = max_record_bytes
        self._catalog = RunCatalog(
            paths,
            signer=self._codec.signer,
            owners=lambda: (self.run_id, *self._shared_history()),
        )
        self._chain = ChainDecoder(paths, max_record_bytes, catalog=self._catalog)
        self._meta: RunMeta | None = None
        self.skipped: list[Skipped] = []
        """Files that :meth:`latest`, :meth:`history` or :meth:`resume_state` passed over."""

    def __repr__(self) -> str:
        return f"RunReader(run_id={self.run_id!r}, dir={str(self.paths.dir)!r})"

    @property
    def record_codec(self) -> RecordCodec:
        """The codec this reader decodes with (and, in a keyed store, checks signatures with)."""
        return self._codec

    @property
    def meta(self) -> RunMeta:
        """The run's ``run.meta`` (read once; see :meth:`refresh`)."""
        if self._meta is None:
            self._meta = read_meta(self.paths, self._codec)
        return self._meta

    def refresh(self) -> None:
        """Forget cached meta so the next access re-reads it."""
        self._meta = None

    def checkpoint_files(self) -> list[CheckpointFile]:
        """Every live checkpoint, loose or packed, in seq order (nothing decoded).

        A damaged ``MANIFEST`` is skipped (recorded in :attr:`skipped`) and the run
        listed as if it had none.
        """
        files = self._catalog.files()
        problem = self._catalog.manifest_problem
        if problem is not None and not any(s.name == "MANIFEST" for s in self.skipped):
            self._skip("MANIFEST", problem.reason)
        return files

    @property
    def catalog(self) -> RunCatalog:
        """The run's loose and packed checkpoints (where each one's bytes are)."""
        return self._catalog

    def location(self, file: CheckpointFile) -> str:
        """Where ``file``'s bytes are: its path, or ``<pack path>#<name>`` when packed."""
        return self._catalog.location(file)

    def load(self, file: CheckpointFile) -> Checkpoint:
        """Decode one checkpoint file; raises :class:`CheckpointCorruptionError` if damaged.

        In a keyed store the file's signature is checked too (before the record is
        decoded): an unsigned file or an HMAC mismatch counts as damage.
        """
        return self._load(file)[0]

    def record_bytes(self, file: CheckpointFile) -> tuple[bytes, bytes | None]:
        """The decoded record bytes of ``file`` (its delta chain followed) and its MAC.

        The MAC is the file's own trailer (None: unsigned), returned as it is, not
        checked, and the bytes are not decoded into a record: :meth:`load` does
        both. Compaction uses this to rewrite a delta as a keyframe with the same
        bytes and signature.

        Raises:
            CheckpointCorruptionError: ``file`` or a base in its chain is damaged.
        """
        return self._chain.decode(file.seq, file.name, file.pack)

    def stored_bytes(self, file: CheckpointFile) -> bytes:
        """The exact bytes stored for ``file``: its AFK1 frame, from its file or its pack.

        Raises:
            CheckpointCorruptionError: it cannot be read.
        """
        return self._catalog.stored_bytes(file, self._max_bytes + (self._max_bytes >> 7) + 4096)

    def _load(
        self,
        file: CheckpointFile,
        names: dict[int, str] | None = None,
        macs: dict[int, bytes] | None = None,
    ) -> tuple[Checkpoint, bytes | None]:
        try:
            return self._load_once(file, names, macs)
        except DecodeBudgetError:
            raise
        except CheckpointCorruptionError as exc:
            # Files are immutable, so a rewrite racing this lock-free read only ever shows
            # as a file or a base gone missing; anything else is damage. (Raised from
            # here: a kept exception would keep its frames, and their blocks, alive.)
            token = self._catalog.view_token()
            if token[:2] == _NO_REWRITES or not exc.moved:
                raise
        return self._reload(file, names, macs, token)

    def _reload(
        self,
        file: CheckpointFile,
        names: dict[int, str] | None,
        macs: dict[int, bytes] | None,
        token: tuple[object, ...],
    ) -> tuple[Checkpoint, bytes | None]:
        """Load ``file`` again where a fresh view says it is now (the manifest said where
        everything live was at every instant), while rewrites keep moving it."""
        for attempt in range(_MOVED_RETRIES):
            self._chain.forget()
            fresh = self._catalog.find(file.seq)
            if fresh is None or fresh.name != file.name:
                raise CheckpointCorruptionError(
                    self._catalog.location(file), "vanished while reading", self.run_id, moved=True
                )
            try:
                return self._load_once(fresh, names, macs)
            except DecodeBudgetError:
                raise
            except CheckpointCorruptionError:
                now = self._catalog.view_token()
                if now == token or attempt == _MOVED_RETRIES - 1:
                    raise
                token = now
        raise AssertionError("unreachable")  # pragma: no cover

    def _load_once(
        self,
        file: CheckpointFile,
        names: dict[int, str] | None,
        macs: dict[int, bytes] | None,
    ) -> tuple[Checkpoint, bytes | None]:
        path = self._catalog.location(file)
        try:
            raw, mac = self._chain.decode(file.seq, file.name, file.pack)
            if self._codec.signer is not None:
                self._check_signature(file, path, raw, mac, names=names, macs=macs)
            record = self._codec.decode_checkpoint(raw, path)
        except CheckpointCorruptionError as exc:
            if exc.run_id is None:  # name the run; keep the kind (a DecodeBudgetError stays one)
                raise type(exc)(exc.path, exc.reason, self.run_id) from None
            raise
        if (
            record.seq != file.seq
            or record.phase != file.phase
            or (record.run_id != self.run_id and record.run_id not in self._shared_history())
        ):
            raise CheckpointCorruptionError(
                path,
                f"record says run {record.run_id!r} seq {record.seq} phase {record.phase!r}, "
                "which does not match its file name and run",
                self.run_id,
            )
        return record, mac

    def chain_value(self, file: CheckpointFile) -> bytes:
        """The MAC of the checkpoint before ``file`` that ``file``'s signature verifies with.

        Compaction records it (in ``run.meta``) before deleting that predecessor.
        Keyed stores only.

        Raises:
            CheckpointCorruptionError: ``file`` does not verify.
        """
        if self._codec.signer is None:
            raise ValueError("chain values exist in keyed stores only")
        path = self._catalog.location(file)
        raw, mac = self._chain.decode(file.seq, file.name, file.pack)
        return self._check_signature(file, path, raw, mac)

    def _check_signature(
        self,
        file: CheckpointFile,
        path: str,
        raw: bytes,
        mac: bytes | None,
        *,
        names: dict[int, str] | None = None,
        macs: dict[int, bytes] | None = None,
    ) -> bytes:
        """Check ``file``'s MAC; returns the predecessor's chain value it verified with.

        ``names`` (seq -> file name) and ``macs`` (seq -> MAC of a file just read)
        spare lookups when a caller walks the whole run.
        """
        signer = self._codec.signer
        assert signer is not None
        if mac is None:
            raise CheckpointCorruptionError(
                path,
                f"{codec.UNSIGNED_REASON} (written without the key, or its signature was removed)",
                self.run_id,
            )
        extra = self._signed_extra()
        previous: list[bytes] = []
        if file.seq == 1:
            previous.append(NO_MAC)
        else:
            found = macs.get(file.seq - 1) if macs else None
            if found is None:
                found = self._chain.link(file.seq - 1, file.phase, names)
            if found is not None:
                previous.append(found)
            recorded = chain_links(extra).get(file.seq)
            if recorded is not None:
                previous.append(recorded)
            if not previous:
                raise CheckpointCorruptionError(
                    path,
                    f"HMAC mismatch: the chain is broken, checkpoint {file.seq - 1} before it "
                    "is missing and no compaction recorded deleting it",
                    self.run_id,
                    moved=True,  # gc may have deleted it after this reader read run.meta
                )
        owners = [self.run_id]
        owners += [o for o, until in history_until(extra).items() if file.seq <= until]
        digest = record_digest(raw)
        for owner in owners:
            for prev in previous:
                expected = signer.checkpoint_mac(owner, file.seq, file.phase, prev, digest)
                if signer.matches(expected, mac):
                    return prev
        before = f", or checkpoint {file.seq - 1} before it was replaced" if file.seq > 1 else ""
        raise CheckpointCorruptionError(
            path,
            "HMAC mismatch: edited, signed with another key, copied from another run or "
            f"position{before}",
            self.run_id,
        )

    def _signed_extra(self) -> dict[str, Any]:
        # The chain links and fork limits come from run.meta, whose own signature
        # read_meta checked; without a readable meta nothing extra is trusted.
        try:
            extra = self.meta.extra
        except AfkLocalError:
            return {}
        return extra if isinstance(extra, dict) else {}

    def _shared_history(self) -> tuple[str, ...]:
        # A fork shares its ancestors' checkpoint files (hard links): their records
        # carry the ancestor's run id, listed in the fork's meta (see storage/fork.py).

        try:
            return history_run_ids(self.meta)
        except AfkLocalError:
            return ()

    @property
    def heads(self) -> HeadStore | None:
        """The store's head records (keyed stores), if this reader checks against them."""
        return self._heads

    def load_chained(
        self, file: CheckpointFile, names: dict[int, str], macs: dict[int, bytes]
    ) -> bytes | None:
        """Decode ``file`` (its delta chain and signature chain included); its MAC, if any.

        ``names`` maps every seq of the run to its file name and ``macs`` holds the MACs
        of the files read so far, which the next one chains on.
        """
        return self._load(file, names, macs)[1]

    def decode_budget(self, files: list[CheckpointFile]) -> AbstractContextManager[None]:
        """Bound the delta frames one pass over ``files`` may follow (linear in them)."""
        return self._chain.budget(_read_budget(files))

    def _skip(self, name: str, reason: str) -> None:
        # One warning per reader: a run damaged throughout is one line, not one per file
        # (every skip is kept in self.skipped for whoever reports the run).
        level = logging.DEBUG if self.skipped else logging.WARNING
        log.log(level, "run %s: skipped %s: %s", self.run_id, name, reason)
        self.skipped.append(Skipped(name, reason))

    def read_meta(self) -> RunMeta:
        """The run's ``run.meta``, read now (not the cached :attr:`meta`)."""
        return read_meta(self.paths, self._codec)

    def meta_file_torn(self) -> str | None:
        """Why ``run.meta`` is torn when its terminal checkpoint's copy stands in for it."""
        return meta_file_torn(self.paths, self._codec)

    def get(self, seq: int) -> Checkpoint:
        """The checkpoint with sequence number ``seq`` (loose or packed)."""
        file = self._catalog.find(seq)
        if file is None:
            raise CheckpointNotFoundError(self.run_id, seq)
        return self.load(file)

    def latest_file(self) -> CheckpointFile | None:
        """The file ``latest`` names, if it is a sound checkpoint name in this run."""
        target = fsio.read_link(self.paths.latest)
        if target is None:
            return None
        parsed = parse_checkpoint_name(target)  # a bare name: nothing outside the run matches
        if parsed is None:
            self._skip("latest", f"points at {target!r}, not a checkpoint of this run")
        return parsed

    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint (O(1) through ``latest``; a scan when that fails).

        Raises:
            DecodeBudgetError: falling back through damaged checkpoints would decode
                more delta frames than a read may (a crafted run); nothing is returned.
        """
        file = self.latest_file()
        if file is not None:
            try:
                return self.load(file)
            except DecodeBudgetError:
                raise
            except CheckpointCorruptionError as exc:
                self._skip(file.name, exc.reason)
        files = self.checkpoint_files()
        with self._chain.budget(_read_budget(files)):
            for candidate in reversed(files):
                if candidate == file:
                    continue
                try:
                    return self.load(candidate)
                except DecodeBudgetError:
                    raise
                except CheckpointCorruptionError as exc:
                    self._skip(candidate.name, exc.reason)
        return None
