"""The garbage collector paused for the index's bulk work (afk_local/storage/index/collector.py):
always given back as the program had it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

import afk_local as afk
from afk_local.storage.index.collector import bulk, collector_paused


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_paused_inside_and_enabled_again_after_an_error() -> None:
    gc.enable()

    @bulk
    def fails() -> None:
        assert not gc.isenabled()
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        fails()
    assert gc.isenabled()


def test_a_program_that_disabled_the_collector_keeps_it_disabled() -> None:
    gc.disable()
    with collector_paused(), collector_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_pauses_in_threads_enable_it_once_the_last_ends() -> None:
    gc.enable()
    inside, release = threading.Barrier(3), threading.Event()
    seen: list[bool] = []

    def worker() -> None:
        with collector_paused():
            inside.wait()
            release.wait()
        seen.append(gc.isenabled())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()  # both inside
    assert not gc.isenabled()
    release.set()
    for thread in threads:
        thread.join()
    assert gc.isenabled()
    assert seen.count(False) <= 1  # the first to leave may still see the other's pause


def test_a_first_listing_leaves_the_collector_as_it_found_it(tmp_path) -> None:
    store = afk.Store(tmp_path / "s")
    for n in range(3):
        with store.create(f"r{n}") as run:
            run.finish(n)
    gc.enable()
    assert [i.run_id for i in afk.Store(tmp_path / "s").runs()] == ["r2", "r1", "r0"]
    assert gc.isenabled()
    gc.disable()
    afk.Store(tmp_path / "s").interrupted()
    assert not gc.isenabled()
