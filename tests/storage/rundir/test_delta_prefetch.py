"""Deltas made with a compressor prepared in the background are the deltas made without."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

import afk_local as afk
from afk_local.storage.format import codec
from afk_local.storage.rundir.delta_prefetch import MAX_PREFETCH_BASE_BYTES, DeltaPrefetch


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
def test_a_prepared_delta_is_byte_for_byte_the_usual_one(
    base: bytes, change: bytes, cut: int
) -> None:
    raw = base[: len(base) // (cut + 1)] + change + base
    prefetch = DeltaPrefetch()
    prefetch.submit("runtime_state", base)
    prefetch.start()
    _wait_ready(prefetch, "runtime_state")
    params = codec.delta_parameters(codec.DEFAULT_LEVEL, len(base), len(raw))
    prepared = params is codec.delta_parameters(codec.DEFAULT_LEVEL, len(base), len(base))
    frame = prefetch.compress("runtime_state", base, raw)
    assert frame == codec.compress(raw, base)
    assert codec.decompress(frame, "f", base=base, max_bytes=1 << 20) == raw
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
        for i, state in enumerate(states):
            if i:
                _wait_ready(run._delta.prefetch, "runtime_state")
            run.checkpoint("runtime_state", state, step=i)
        assert run._delta.prefetch.hits == len(states) - 1
    assert [c.payload for c in store.open("r").history()] == states
