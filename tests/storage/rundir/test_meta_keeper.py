"""run.meta while a writer holds it: the attempt's meta, and atomic changes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import afk_local as afk
from afk_local.errors import LeaseLostError, RunExistsError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.records import RunMeta, RunStatus
from afk_local.storage.rundir.mirror import REMOTE_COPY_KEY
from afk_local.storage.rundir.ownership import current_owner
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.rundir.write.meta_keeper import MetaKeeper, attempt_meta


def _run(tmp_path: Path) -> afk.Store:
    store = afk.Store(tmp_path)
    store.create("r").close()
    return store


def test_resuming_is_the_next_attempt_and_cancelling_is_not(tmp_path: Path) -> None:
    store = _run(tmp_path)
    paths, old = store.paths("r"), store.read_meta("r")
    again = attempt_meta(paths, store.codec, owner=current_owner())
    assert again.attempt == old.attempt + 1
    assert again.updated_ms > old.updated_ms
    same = attempt_meta(paths, store.codec, owner=current_owner(), new_attempt=False)
    assert same.attempt == old.attempt


def test_a_new_run_is_attempt_one_unless_another_creator_won(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    fresh = RunMeta(run_id="new", created_ms=1, updated_ms=1)
    meta = attempt_meta(store.paths("new"), store.codec, owner=current_owner(), new_meta=fresh)
    assert meta.attempt == 1 and meta.owner == current_owner()
    _run(tmp_path)
    with pytest.raises(RunExistsError):
        attempt_meta(store.paths("r"), store.codec, owner=current_owner(), new_meta=fresh)


def test_a_copy_pulled_without_take_is_refused(tmp_path: Path) -> None:
    store = _run(tmp_path)
    paths = store.paths("r")
    meta = store.read_meta("r")
    copy = {"url": "s3://b/p", "holder": "other", "epoch": 3}
    pulled = msgspec.structs.replace(meta, extra={REMOTE_COPY_KEY: copy})
    fsio.atomic_write(paths.meta, codec.encode_meta(store.codec, pulled))
    with pytest.raises(LeaseLostError, match="without --take"):
        attempt_meta(paths, store.codec, owner=current_owner())


def test_replace_writes_atomically_and_bumps_updated_ms(tmp_path: Path) -> None:
    store = _run(tmp_path)
    paths = store.paths("r")
    meta = read_meta(paths, store.codec)
    keeper = MetaKeeper(paths, meta, record_codec=RecordCodec(), on_failure=_unexpected)
    changed = keeper.replace(status=RunStatus.PAUSED)
    assert keeper.meta is changed
    assert changed.updated_ms > meta.updated_ms
    assert read_meta(paths, store.codec) == changed


def test_a_value_that_cannot_be_stored_fails_before_any_io(tmp_path: Path) -> None:
    store = _run(tmp_path)
    paths = store.paths("r")
    before = paths.meta.read_bytes()
    keeper = MetaKeeper(
        paths, read_meta(paths, store.codec), record_codec=RecordCodec(), on_failure=_unexpected
    )
    with pytest.raises(TypeError):
        keeper.replace(extra={"x": object()})
    assert paths.meta.read_bytes() == before


def test_a_failed_write_is_reported_and_raised(tmp_path: Path) -> None:
    store = _run(tmp_path)
    paths = store.paths("r")
    failures: list[BaseException] = []
    keeper = MetaKeeper(
        paths, read_meta(paths, store.codec), record_codec=RecordCodec(), on_failure=failures.append
    )

    def fail_fsync(operation: str, path: str) -> None:
        if operation == "fsync":
            raise OSError("disk gone")

    previous = fsio.set_io_hook(fail_fsync)
    try:
        with pytest.raises(OSError, match="disk gone"):
            keeper.replace(status=RunStatus.PAUSED)
    finally:
        fsio.set_io_hook(previous)
    assert len(failures) == 1
    assert keeper.meta.status is not RunStatus.PAUSED


def _unexpected(exc: BaseException) -> None:
    raise AssertionError(f"unexpected failure: {exc}")
