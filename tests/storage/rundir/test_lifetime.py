"""A writer's lifetime: refused writes, writes in flight, and the lock's release."""

from __future__ import annotations

import threading

import pytest

from afk_local.errors import WriterFailedError
from afk_local.storage.rundir.write.lifetime import WriterLifetime


def _life() -> tuple[WriterLifetime, list[str]]:
    events: list[str] = []
    return WriterLifetime("r", release=lambda: events.append("release")), events


def test_close_runs_the_hooks_last_registered_first_then_releases() -> None:
    life, events = _life()
    life.on_close(lambda: events.append("mirror"))
    life.on_close(lambda: events.append("journal"))
    life.close(inherited=lambda: events.append("inherited"))
    life.close(inherited=lambda: events.append("inherited"))  # idempotent
    assert events == ["journal", "mirror", "release"]


def test_a_closed_or_failed_writer_refuses_writes() -> None:
    life, _ = _life()
    life.fail(OSError("fsync failed"))
    with pytest.raises(WriterFailedError, match="fsync failed"), life:
        pass
    life, _ = _life()
    life.close(inherited=lambda: None)
    with pytest.raises(WriterFailedError, match="closed"):
        life.check_writable()


def test_a_close_during_a_write_releases_the_lock_when_the_write_ends() -> None:
    life, events = _life()
    inside, finish = threading.Event(), threading.Event()

    def write() -> None:
        with life:
            inside.set()
            finish.wait(5)

    thread = threading.Thread(target=write)
    thread.start()
    inside.wait(5)
    life.close(inherited=lambda: None)
    assert events == []  # the write in flight keeps the lock
    finish.set()
    thread.join(5)
    assert events == ["release"]


class _LostLease:
    def check(self) -> None:
        raise RuntimeError("lease lost")


def test_a_mirror_whose_lease_was_taken_stops_writes() -> None:
    life = WriterLifetime("r", release=lambda: None, mirror=_LostLease())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="lease lost"):
        life.check_writable()
