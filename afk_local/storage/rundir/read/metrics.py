"""Metrics a run recorded (``ctx.metric``): reading them back, and keeping them through gc.

A durable job's ``ctx.metric(name, value)`` calls are batched into the next
checkpoint's payload under ``metrics`` (``{name: [[step, value], ...]}``; the
checkpoint's timestamp stands for when they were recorded; docs/format.md,
"Progress and metrics"): no write of their own. Compaction deletes old
checkpoints, so before it deletes any that carry metrics it copies them into the
run's ``metrics.archive`` (:func:`archive_metrics`), one immutable record replaced
atomically. Reading (:func:`read_metrics`) takes the archive and every checkpoint
it does not cover, by seq, so nothing is counted twice and a crash between
archiving and deleting loses nothing.

Example:
    >>> import afk_local as afk
    >>> @afk.durable(store="/tmp/afk-doc-metrics")  # doctest: +SKIP
    ... def train(ctx):
    ...     for epoch in ctx.iterate(range(3), progress=False):
    ...         ctx.metric("loss", 1.0 / (epoch + 1))
    >>> train.run(run_id="metrics-doc")  # doctest: +SKIP
    >>> reader = afk.Store("/tmp/afk-doc-metrics").open("metrics-doc")  # doctest: +SKIP
    >>> [p.value for p in reader.metrics().series("loss")]  # doctest: +SKIP
    [1.0, 0.5, 0.3333333333333333]
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import msgspec

from afk_local.errors import AfkLocalError, CheckpointCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import NO_MAC, record_digest
from afk_local.storage.format.layout import CheckpointFile, RunPaths
from afk_local.storage.format.records import SCHEMA_VERSION, Checkpoint, Phase, now_ms

log = logging.getLogger("afk_local")

METRICS_KEY = "metrics"
"""The payload key holding the metric points recorded since the previous checkpoint."""
ARCHIVE_NAME = "metrics.archive"
"""The file in a run directory holding the metrics of checkpoints that gc deleted."""
ARCHIVE_PHASE = "metrics_archive"
"""The ``phase`` of the archive's record (its seq is 0: it is no checkpoint of the run)."""
MAX_ARCHIVE_BYTES = 256 << 20

# Phases whose payloads a durable job gives metrics (the others are never decoded for them).
_CARRIERS = frozenset({Phase.RUNTIME_STATE.value, Phase.PAUSED.value, Phase.RUN_TERMINAL.value})

Batch = dict[str, list[Any]]
"""One checkpoint's metrics: ``{name: [[step, value], ...]}``."""


class Stamped(NamedTuple):
    """The metrics of one checkpoint and the checkpoint's time."""

    timestamp_ms: int
    batch: Batch


class RunFiles(Protocol):
    """What reading metrics needs of a run (a :class:`~afk_local.RunReader` is one)."""

    @property
    def run_id(self) -> str:
        """The run's id."""

    @property
    def paths(self) -> RunPaths:
        """Where the run's files are."""

    @property
    def record_codec(self) -> RecordCodec:
        """The codec (and, keyed, the signer) of the run's store."""

    def checkpoint_files(self) -> list[CheckpointFile]:
        """The run's checkpoint files, by seq."""

    def load(self, file: CheckpointFile) -> Checkpoint:
        """One checkpoint, decoded and checked."""


@dataclass(frozen=True)
class MetricPoint:
    """One ``ctx.metric`` call: the value, the run's logical step then, when, and where."""

    name: str
    value: float
    step: int
    timestamp_ms: int
    """When the checkpoint that carried it was written (points wait for the next one)."""
    seq: int
    """The checkpoint that carried it."""


class MetricLog(list[MetricPoint]):
    """Every metric point of a run, in the order recorded (a list, with views for analysis)."""

    def names(self) -> list[str]:
        """The metric names, in the order each first appeared."""
        return list(dict.fromkeys(p.name for p in self))

    def series(self, name: str) -> list[MetricPoint]:
        """The points of one metric, in order."""
        return [p for p in self if p.name == name]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per metric: ``count``, ``last``, ``min``, ``max``, ``mean`` and the ``last_step``."""
        result: dict[str, dict[str, Any]] = {}
        for name in self.names():
            values = [p.value for p in self.series(name)]
            finite = [v for v in values if math.isfinite(v)]
            result[name] = {
                "count": len(values),
                "last": values[-1],
                "min": min(finite) if finite else None,
                "max": max(finite) if finite else None,
                "mean": sum(finite) / len(finite) if finite else None,
                "last_step": self.series(name)[-1].step,
            }
        return result

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per point: ``name, value, step, timestamp_ms, seq``."""
        return [
            {
                "name": p.name,
                "value": p.value,
                "step": p.step,
                "timestamp_ms": p.timestamp_ms,
                "seq": p.seq,
            }
            for p in self
        ]

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` of :meth:`to_records` (ImportError without pandas)."""
        try:
            import pandas  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
        except ImportError:
            raise ImportError(
                "to_pandas() needs pandas (pip install pandas); to_records() gives plain dicts"
            ) from None
        columns = ["name", "value", "step", "timestamp_ms", "seq"]
        return pandas.DataFrame(self.to_records(), columns=columns)


def batch_of(payload: Any) -> Batch:
    """The metrics a checkpoint payload carries (empty when none or malformed)."""
    if not isinstance(payload, dict):
        return {}
    raw = payload.get(METRICS_KEY)
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, list)}


def merge_batches(first: Batch | None, second: Batch | None) -> Batch | None:
    """The points of ``first`` then ``second`` as one batch (either may be None)."""
    if not first:
        return second or None
    if not second:
        return first
    merged = {name: list(rows) for name, rows in first.items()}
    for name, rows in second.items():
        merged.setdefault(name, []).extend(rows)
    return merged


def add_batch(payload: bytes, batch: Batch) -> bytes:
    """The msgpack map ``payload`` with a ``metrics`` entry holding ``batch`` appended.

    For payloads encoded before their metrics were final (the ``async`` and ``exit``
    write modes coalesce queued checkpoints, and the newest one must carry the
    points of those it replaced): the map's header is rewritten for one more entry
    and the entry appended, nothing else is re-encoded.

    Raises:
        ValueError: ``payload`` is not a msgpack map.
    """
    first = payload[0] if payload else -1
    if 0x80 <= first <= 0x8F:
        count, start = first & 0x0F, 1
    elif first == 0xDE:
        (count,), start = struct.unpack_from(">H", payload, 1), 3
    elif first == 0xDF:
        (count,), start = struct.unpack_from(">I", payload, 1), 5
    else:
        raise ValueError("a payload that carries metrics must be a dict")
    count += 1
    if count <= 0x0F:
        head = bytes([0x80 | count])
    elif count <= 0xFFFF:
        head = b"\xde" + struct.pack(">H", count)
    else:
        head = b"\xdf" + struct.pack(">I", count)
    entry = msgspec.msgpack.encode(METRICS_KEY) + msgspec.msgpack.encode(batch)
    return head + payload[start:] + entry


def _points(seq: int, stamped: Stamped) -> Iterable[MetricPoint]:
    for name, rows in stamped.batch.items():
        for row in rows:
            if not isinstance(row, (list, tuple)) or len(row) < 2:
                continue
            step, value = row[0], row[1]
            if isinstance(value, (int, float)) and isinstance(step, int):
                yield MetricPoint(name, float(value), step, stamped.timestamp_ms, seq)


def read_metrics(
    run: RunFiles, *, newest: int | None = None, files: list[CheckpointFile] | None = None
) -> MetricLog:
    """Every metric point of ``run``: its archive, then the checkpoints the archive does not hold.

    ``newest=N`` reads only the newest N checkpoints (and the archive): what a page that
    draws a run's recent metrics can afford on a run of many checkpoints. ``files``: the
    run's :meth:`~RunFiles.checkpoint_files` when the caller has just listed them (a
    listing of 50,000 checkpoints is worth not taking twice).
    Damaged checkpoints are skipped (``afk-local verify`` names them); their points are lost.
    """
    batches = dict(read_archive(run))
    if files is None:
        files = run.checkpoint_files()
    if newest is not None:
        files = files[-newest:] if newest > 0 else []
    for file in files:
        if file.seq in batches or file.phase not in _CARRIERS:
            continue
        try:
            record = run.load(file)
        except CheckpointCorruptionError as exc:
            log.warning("run %s: metrics of %s unreadable: %s", run.run_id, file.name, exc.reason)
            continue
        batch = batch_of(record.payload)
        if batch:
            batches[file.seq] = Stamped(record.timestamp_ms, batch)
    log_ = MetricLog()
    for seq in sorted(batches):
        log_.extend(_points(seq, batches[seq]))
    return log_


# -- the archive ------------------------------------------------------------------------


def archive_path(paths: RunPaths) -> Path:
    """``<run dir>/metrics.archive``."""
    return paths.dir / ARCHIVE_NAME


def read_archive(run: RunFiles) -> dict[int, Stamped]:
    """The batches in ``run``'s ``metrics.archive``, by seq (empty when there is none).

    A damaged archive, or in a keyed store one whose signature does not match, is
    logged and ignored: metrics are for people, never for resuming.
    """
    path = archive_path(run.paths)
    try:
        data = fsio.read_bounded(path, MAX_ARCHIVE_BYTES)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("run %s: %s unreadable: %s", run.run_id, path, exc)
        return {}
    try:
        record = _decode_archive(run.record_codec, data, str(path), run.run_id)
    except AfkLocalError as exc:
        log.warning("run %s: %s ignored: %s", run.run_id, path, exc)
        return {}
    result: dict[int, Stamped] = {}
    batches = record.payload.get("batches") if isinstance(record.payload, dict) else None
    for entry in batches if isinstance(batches, list) else []:
        if (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], int)
            and isinstance(entry[1], int)
        ):
            result[entry[0]] = Stamped(entry[1], batch_of({METRICS_KEY: entry[2]}))
    return result


def _decode_archive(record_codec: RecordCodec, data: bytes, path: str, run_id: str) -> Checkpoint:
    header, body = codec.unpack_frame(data, path, expect_kind=codec.KIND_CHECKPOINT)
    raw = codec.decompress(body, path, base=None, max_bytes=MAX_ARCHIVE_BYTES)
    signer = record_codec.signer
    if signer is not None:
        if header.mac is None:
            raise CheckpointCorruptionError(path, codec.UNSIGNED_REASON, run_id)
        expected = signer.checkpoint_mac(run_id, 0, ARCHIVE_PHASE, NO_MAC, record_digest(raw))
        if not signer.matches(expected, header.mac):
            raise CheckpointCorruptionError(path, "HMAC mismatch", run_id)
    record = record_codec.decode_checkpoint(raw, path)
    if record.phase != ARCHIVE_PHASE or record.run_id != run_id:
        raise CheckpointCorruptionError(path, "not this run's metrics archive", run_id)
    return record


def write_archive(
    record_codec: RecordCodec,
    paths: RunPaths,
    batches: dict[int, Stamped],
    *,
    sync_dir: bool = True,
    env: fsio.Env = fsio.DEFAULT_ENV,
) -> None:
    """Replace ``paths``' archive by one holding ``batches`` (temp + fsync + rename)."""
    record = Checkpoint(
        schema_version=SCHEMA_VERSION,
        run_id=paths.run_id,
        thread_id=None,
        seq=0,
        step=0,
        phase=ARCHIVE_PHASE,
        timestamp_ms=now_ms(),
        payload={"batches": [[seq, *batches[seq]] for seq in sorted(batches)]},
    )
    raw = record_codec.encode(record)
    mac = None
    if record_codec.signer is not None:
        digest = record_digest(raw)
        mac = record_codec.signer.checkpoint_mac(paths.run_id, 0, ARCHIVE_PHASE, NO_MAC, digest)
    frame = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw), mac=mac)
    env.atomic_write(archive_path(paths), frame, sync_dir=sync_dir)


def archive_metrics(
    run: RunFiles, doomed: Sequence[CheckpointFile], env: fsio.Env = fsio.DEFAULT_ENV
) -> int:
    """Copy the metrics of checkpoints about to be deleted into the archive; returns how many.

    Call it holding the run's lock, before deleting anything: the archive is durable
    when it returns. Nothing is written when none of ``doomed`` carries metrics.
    """
    found: dict[int, Stamped] = {}
    for file in doomed:
        if file.phase not in _CARRIERS:
            continue
        try:
            record = run.load(file)
        except CheckpointCorruptionError:
            continue  # damaged: nothing to save
        batch = batch_of(record.payload)
        if batch:
            found[file.seq] = Stamped(record.timestamp_ms, batch)
    if not found:
        return 0
    batches = read_archive(run)
    batches.update(found)
    write_archive(run.record_codec, run.paths, batches, env=env)
    return len(found)


def copy_archive(
    source: RunFiles, target: RunPaths, until_seq: int, env: fsio.Env = fsio.DEFAULT_ENV
) -> None:
    """Give a fork (being built at ``target``) the source's archived metrics up to ``until_seq``.

    The copy is signed for the fork's own run id in a keyed store. The caller makes
    the fork's directory durable.
    """
    batches = {seq: b for seq, b in read_archive(source).items() if seq <= until_seq}
    if batches:
        write_archive(source.record_codec, target, batches, sync_dir=False, env=env)


__all__ = [
    "ARCHIVE_NAME",
    "METRICS_KEY",
    "Batch",
    "MetricLog",
    "MetricPoint",
    "Stamped",
    "add_batch",
    "archive_metrics",
    "batch_of",
    "copy_archive",
    "merge_batches",
    "read_archive",
    "read_metrics",
    "write_archive",
]
