"""``afk-local runs --remote URL``: the runs a remote holds, with their lease and state."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from afk_local.errors import AfkLocalError, MirrorError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.layout import MAX_META_BYTES, MAX_RUNS
from afk_local.integrations.remote.remote_run import read_remote_run
from afk_local.storage.format.codec import RecordCodec, decode_meta
from afk_local.storage.format.layout import parse_checkpoint_name, validate_run_id
from afk_local.storage.format.records import Phase, RunStatus


@dataclass(frozen=True)
class RemoteRunInfo:
    """One run on a remote: who holds it and how far it got."""

    run_id: str
    epoch: int
    holder: str
    """The store id of the lease holder."""
    host: str
    status: str | None
    """From the newest run.meta (None when it cannot be read)."""
    seq: int
    updated_ms: int
    problem: str | None = None


def terminal_problem(status: RunStatus, names: list[str]) -> str | None:
    """Why a remote run whose meta says ``status`` lacks the files that say so: a
    completed run's newest file is its ``run_terminal`` checkpoint (or a pack holding
    it); None when it is there. ``names`` are the run's file names, by seq."""
    if status is not RunStatus.COMPLETED:
        return None
    newest = parse_checkpoint_name(names[-1]) if names else None
    if newest is None and names:
        return None  # a pack: its members are checked when it is pulled
    if newest is not None and newest.phase == Phase.RUN_TERMINAL.value:
        return None
    return (
        "run.meta says completed but the run's terminal checkpoint is not on the remote "
        "(objects missing): the remote is damaged"
    )


def remote_run_info(
    bucket: Bucket, run_id: str, record_codec: RecordCodec | None = None
) -> RemoteRunInfo | None:
    """One run's lease and state on the remote (None when it has no lease there); a
    damaged run carries ``problem``."""
    try:
        remote = read_remote_run(bucket, run_id)
    except MirrorError as exc:
        return RemoteRunInfo(run_id, 0, "", "", None, 0, 0, problem=str(exc))
    if remote is None:
        return None
    head = remote.head
    status, updated, problem, seq = None, head.taken_ms, None, head.base_seq
    try:
        snapshot = remote.snapshot()
        seq = snapshot.head_seq
        data = (
            bucket.get(snapshot.meta_key, MAX_META_BYTES)
            if snapshot.meta_key
            else snapshot.lease_meta
        )
        if data is not None:
            meta = decode_meta(
                record_codec or RecordCodec(),
                data,
                f"{run_id}/run.meta",
                max_bytes=MAX_META_BYTES,
                run_id=run_id,
            )
            status, updated = meta.status.value, max(updated, meta.updated_ms)
            problem = terminal_problem(meta.status, [f.name for f in snapshot.files])
    except (AfkLocalError, msgspec.DecodeError) as exc:
        problem = str(exc)
    return RemoteRunInfo(run_id, head.epoch, head.owner, head.host, status, seq, updated, problem)


def remote_runs(url: str | Bucket, record_codec: RecordCodec | None = None) -> list[RemoteRunInfo]:
    """Every run under ``url`` that has a lease, newest first; damaged ones carry ``problem``.

    Signatures of run.meta are checked when ``record_codec`` has a key.
    """
    bucket = url if isinstance(url, Bucket) else Bucket(url)
    found = []
    for name in bucket.list_dirs("", limit=MAX_RUNS):
        try:
            run_id = validate_run_id(name)
        except AfkLocalError:
            continue  # not a run of ours
        info = remote_run_info(bucket, run_id, record_codec)
        if info is not None:
            found.append(info)
    found.sort(key=lambda info: info.updated_ms, reverse=True)
    return found


__all__ = ["RemoteRunInfo", "remote_run_info", "remote_runs", "terminal_problem"]
