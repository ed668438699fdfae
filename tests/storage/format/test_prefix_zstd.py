"""Deltas through one reused zstd context (storage/format/prefix_zstd.py): every reader
decodes them as it decodes the C extension's, whichever way a writer made them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import afk_local as afk
from afk_local.storage.format import codec, prefix_zstd

pytest.importorskip("cffi", reason="the reused zstd context needs the cffi package")


@pytest.fixture
def without_prefix() -> Iterator[None]:
    prefix_zstd.enabled = False
    try:
        yield
    finally:
        prefix_zstd.enabled = True


def _usual(raw: bytes, base: bytes, level: int) -> bytes:
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    parameters = codec.delta_parameters(level, len(base), len(raw))
    return zstandard.ZstdCompressor(dict_data=dictionary, compression_params=parameters).compress(
        raw
    )


@settings(max_examples=80, deadline=None)
@given(
    st.binary(min_size=1, max_size=40_000),
    st.binary(max_size=3_000),
    st.integers(0, 4),
    st.sampled_from([-5, 1, 3, 6]),
)
def test_a_delta_decodes_to_its_record_and_declares_it(
    base: bytes, change: bytes, cut: int, level: int
) -> None:
    raw = base[: len(base) // (cut + 1)] + change + base[len(base) // 2 :]
    frame = codec.compress(raw, base, level=level)
    assert codec.check_content_size(frame, "f", 1 << 20) == len(raw)
    assert codec.decompress(frame, "f", base=base, max_bytes=1 << 20) == raw
    assert codec.decompress_chain([codec.compress(base), frame], ["k", "d"]) == raw
    # The reused context after a frame of other parameters (the sizes pick them).
    assert codec.decompress(_usual(raw, base, level), "f", base=base, max_bytes=1 << 20) == raw
    again = codec.compress(base, raw, level=level)
    assert codec.decompress(again, "f", base=raw, max_bytes=1 << 20) == base


def test_deltas_are_made_through_the_reused_context_when_cffi_is_there() -> None:
    compressor = prefix_zstd.prefix_compressor()
    assert compressor is not None
    base = b"the state of step %d; " * 400
    frame = codec.compress(base + b"one more", base)
    assert len(frame) < 100
    assert codec.decompress(frame, "f", base=base, max_bytes=1 << 20) == base + b"one more"
    # Each thread its own context (a context is not thread-safe).
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(prefix_zstd.prefix_compressor()))
    thread.start()
    thread.join()
    assert other[0] is not None and other[0] is not compressor


def test_a_run_written_either_way_reads_the_same(tmp_path: Path, without_prefix: None) -> None:
    store = afk.Store(tmp_path / "store")
    states = [{"step": n, "notes": [f"note {i} of {n}" * 20 for i in range(30)]} for n in range(6)]
    run = store.create("both-ways")
    for n, state in enumerate(states[:3]):
        run.checkpoint("runtime_state", state, step=n)  # the C extension's deltas
    prefix_zstd.enabled = True
    for n, state in enumerate(states[3:], start=3):
        run.checkpoint("runtime_state", state, step=n)  # the reused context's
    run.close()
    reader = afk.Store(tmp_path / "store").open(run.run_id)
    files = reader.checkpoint_files()
    assert [f.seq for f in files] == [1, 2, 3, 4, 5, 6]
    assert [reader.load(f).payload for f in files] == states


def test_a_failed_compression_leaves_the_context_usable() -> None:
    compressor = prefix_zstd.prefix_compressor()
    assert compressor is not None
    base = b"base " * 1000
    # A window zstd has no table for: it refuses the parameters.
    usual = codec.delta_parameters(codec.DEFAULT_LEVEL, len(base), len(base))
    fields = {field: getattr(usual, field) for _, field in prefix_zstd._PARAMETERS}
    refused = SimpleNamespace(**{**fields, "window_log": 40})
    with pytest.raises(zstandard.ZstdError):
        compressor.compress(base, base, refused)  # type: ignore[arg-type]
    frame = codec.compress(base + b"!", base)
    assert codec.decompress(frame, "f", base=base, max_bytes=1 << 20) == base + b"!"


def test_without_cffi_deltas_are_the_c_extensions(without_prefix: None) -> None:
    assert prefix_zstd.prefix_compressor() is None
    base = b"x" * 5000 + b"y" * 5000
    raw = base + b"z"
    assert codec.compress(raw, base) == _usual(raw, base, codec.DEFAULT_LEVEL)


def test_a_large_base_gets_a_context_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reused context keeps the match tables it last grew to: a base above
    MAX_BASE_BYTES is compressed against with a context freed afterwards."""
    used: list[int] = []
    reused = prefix_zstd.PrefixCompressor.compress

    def compress(self: prefix_zstd.PrefixCompressor, raw: bytes, base: bytes, p: object) -> bytes:
        used.append(len(base))
        return reused(self, raw, base, p)  # type: ignore[arg-type]

    monkeypatch.setattr(prefix_zstd.PrefixCompressor, "compress", compress)
    small = bytes(range(256)) * 64
    large = bytes(range(256)) * (prefix_zstd.MAX_BASE_BYTES // 256 + 1)
    for base in (small, large):
        frame = codec.compress(base + b"!", base)
        assert codec.decompress(frame, "f", base=base, max_bytes=4 << 20) == base + b"!"
    assert used == [len(small)]


def test_where_the_cffi_module_cannot_load_deltas_are_made_the_usual_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A zstandard without its cffi module, or no cffi package: the import fails, the
    writer makes deltas with the C extension, and says nothing louder than debug."""
    monkeypatch.setitem(sys.modules, "zstandard._cffi", None)  # the import raises
    monkeypatch.setattr(prefix_zstd._Loaded, "tried", False)
    monkeypatch.setattr(prefix_zstd._Loaded, "module", None)
    monkeypatch.setattr(prefix_zstd._Loaded, "local", threading.local())
    assert prefix_zstd.prefix_compressor() is None
    assert prefix_zstd._Loaded.tried
    base = b"x" * 5000 + b"y" * 5000
    raw = base + b"z"
    assert codec.compress(raw, base) == _usual(raw, base, codec.DEFAULT_LEVEL)
