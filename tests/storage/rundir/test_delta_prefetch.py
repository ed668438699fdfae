"""Deltas made with a compressor prepared in the background decode as the deltas made
without, and are the C extension's own frames."""

from __future__ import annotations

import time

import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import afk_local as afk
from afk_local.storage.format import codec
from afk_local.storage.rundir.delta_prefetch import (
    MAX_PREFETCH_BASE_BYTES,
    WAITS_KEPT,
    DeltaPrefetch,
)


def _wait_ready(prefetch: DeltaPrefetch, phase: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slot = prefetch._slots.get(phase)
        if slot is not None and slot.ready is not None:
            return
        time.sleep(0.001)
    raise AssertionError("the prefetch thread prepared nothing within 10 s")


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=40_000), st.binary(max_size=2_000), st.integers(0, 4))
def test_a_prepared_delta_decodes_as_the_usual_one(base: bytes, change: bytes, cut: int) -> None:
    raw = base[: len(base) // (cut + 1)] + change + base
    prefetch = DeltaPrefetch()
    prefetch.submit("runtime_state", base)
    prefetch.start()
    _wait_ready(prefetch, "runtime_state")
    params = codec.delta_parameters(codec.DEFAULT_LEVEL, len(base), len(raw))
    prepared = params is codec.delta_parameters(codec.DEFAULT_LEVEL, len(base), len(base))
    frame = prefetch.compress("runtime_state", base, raw)
    usual = codec.compress(raw, base)
    assert codec.decompress(frame, "f", base=base, max_bytes=1 << 20) == raw
    assert codec.decompress(usual, "f", base=base, max_bytes=1 << 20) == raw
    if prepared:  # the C extension's frame, as a compressor made for this base makes it
        dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        made = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params)
        assert frame == made.compress(raw)
    # Used when the delta needs the parameters it was prepared with, never otherwise.
    assert (prefetch.hits, prefetch.misses) == ((1, 0) if prepared else (0, 1))


def test_a_compressor_prepared_for_another_base_is_not_used() -> None:
    prefetch = DeltaPrefetch()
    first, second = b"first state " * 500, b"second state " * 500
    prefetch.submit("runtime_state", first)
    prefetch.start()
    _wait_ready(prefetch, "runtime_state")
    frame = prefetch.compress("runtime_state", second, second + b"!")
    assert codec.decompress(frame, "f", base=second, max_bytes=1 << 20) == second + b"!"
    assert (prefetch.hits, prefetch.misses) == (0, 1)


def test_nothing_is_prepared_before_start() -> None:
    """The writer hands bases over while the disk syncs (start() right before the
    file's fsync), so the thread never competes with the encoding for the GIL."""
    prefetch = DeltaPrefetch()
    prefetch.submit("runtime_state", b"state " * 2000)
    time.sleep(0.05)
    assert prefetch._slots["runtime_state"].ready is None
    prefetch.start()
    _wait_ready(prefetch, "runtime_state")


def test_huge_bases_are_not_prepared() -> None:
    prefetch = DeltaPrefetch()
    prefetch.submit("runtime_state", bytes(MAX_PREFETCH_BASE_BYTES + 1))
    assert "runtime_state" not in prefetch._slots


def test_a_writer_uses_prepared_compressors_and_the_run_reads_back(tmp_path) -> None:
    store = afk.Store(tmp_path)
    states = [{"step": i, "log": [f"line {j} " * 30 for j in range(40 + i)]} for i in range(12)]
    with store.create("r") as run:
        run._delta.prefetch.overlap = True  # whatever this disk's waits
        for i, state in enumerate(states):
            if i:
                _wait_ready(run._delta.prefetch, "runtime_state")
            run.checkpoint("runtime_state", state, step=i)
        assert run._delta.prefetch.hits == len(states) - 1
    assert [c.payload for c in store.open("r").history()] == states


def test_bases_stay_on_the_callers_path_while_the_disk_waits_are_too_short_to_hide_them() -> None:
    """On a fast disk (tmpfs, NVMe) waking the thread costs more than the delta it spares:
    nothing is handed over while the waits are shorter than twice a preparation."""
    prefetch = DeltaPrefetch()
    prefetch.prepared_ns = 10**12  # a preparation far longer than any wait below
    for _ in range(3):
        prefetch.submit("runtime_state", b"state " * 2000)
        prefetch.start()
        prefetch.synced()
    assert not prefetch.worth_overlapping()
    time.sleep(0.05)
    assert prefetch._slots["runtime_state"].ready is None  # never handed to the thread
    base = b"state " * 2000
    frame = prefetch.compress("runtime_state", base, base + b"!")
    assert frame == codec.compress(base + b"!", base)
    assert (prefetch.hits, prefetch.misses) == (0, 1)


def test_bases_go_to_the_thread_while_the_disk_waits_are_long_enough() -> None:
    prefetch = DeltaPrefetch()
    prefetch.prepared_ns = 1
    for _ in range(WAITS_KEPT):  # every recent wait long: the shortest decides
        prefetch.start()
        time.sleep(0.001)
        prefetch.synced()
    assert prefetch.worth_overlapping()
    prefetch.submit("runtime_state", b"state " * 2000)
    prefetch.start()
    _wait_ready(prefetch, "runtime_state")
    assert prefetch._slots["runtime_state"].prepared_ns > 0
