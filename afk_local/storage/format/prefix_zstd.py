"""Deltas through one reused zstd context, with the base as its prefix.

A delta is a zstd frame of a record compressed against its base as a raw-content
dictionary (docs/format.md, "Deltas"). zstandard's C extension makes that with a new
compressor, and so a new compression context and a new dictionary object, for every
base: on a ~9 KB state that allocation is about a third of a delta's CPU. zstd itself
can do better, ``ZSTD_CCtx_refPrefix``: one context per thread, reused, told for each
frame which bytes precede it. zstandard ships the library's whole API as a cffi module
(``zstandard._cffi``), usable wherever the ``cffi`` package is installed (``pip install
'afk_local[fast]'``; most environments have it already). The frames are the same kind:
a prefix is a raw-content dictionary under another name, so every reader decodes both
alike and the bytes on disk do not say which wrote them.

Where that module cannot be loaded, :func:`prefix_compressor` returns None and deltas
are made the usual way.

Example:
    >>> from afk_local.storage.format import codec
    >>> base, raw = b"state " * 500, b"state " * 500 + b"one more line"
    >>> compressor = prefix_compressor()
    >>> frame = compressor.compress(raw, base, codec.delta_parameters(3, len(base), len(raw)))
    >>> codec.decompress(frame, "(a delta)", base=base, max_bytes=1 << 20) == raw
    True
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import zstandard

log = logging.getLogger("afk_local")

MAX_BASE_BYTES = 1 << 20
"""Deltas of larger bases get a context of their own, freed after it (the C extension's
way): a reused context keeps the match tables it last grew to, and a large base's cost
megabytes, while the allocation a reused one spares is nothing next to its compression."""

_PARAMETERS = (
    ("ZSTD_c_windowLog", "window_log"),
    ("ZSTD_c_hashLog", "hash_log"),
    ("ZSTD_c_chainLog", "chain_log"),
    ("ZSTD_c_searchLog", "search_log"),
    ("ZSTD_c_minMatch", "min_match"),
    ("ZSTD_c_targetLength", "target_length"),
    ("ZSTD_c_strategy", "strategy"),
    ("ZSTD_c_checksumFlag", "write_checksum"),
    ("ZSTD_c_contentSizeFlag", "write_content_size"),
    ("ZSTD_c_dictIDFlag", "write_dict_id"),
)
"""The zstd parameter each field of a ``ZstdCompressionParameters`` sets (those a
delta's parameters hold; the rest keep zstd's defaults)."""

_NAMES = (
    "ZSTD_createCCtx",
    "ZSTD_freeCCtx",
    "ZSTD_CCtx_reset",
    "ZSTD_CCtx_setParameter",
    "ZSTD_CCtx_refPrefix",
    "ZSTD_compress2",
    "ZSTD_compressBound",
    "ZSTD_isError",
    "ZSTD_getErrorName",
    "ZSTD_reset_session_only",
    "ZSTD_reset_session_and_parameters",
    *(name for name, _ in _PARAMETERS),
)


class PrefixCompressor:
    """One thread's reused zstd context that compresses a record against a prefix.

    Not thread-safe: :func:`prefix_compressor` gives each thread its own.
    """

    def __init__(self, ffi: Any, lib: Any) -> None:
        self._ffi = ffi
        self._lib = lib
        context = lib.ZSTD_createCCtx()
        if context == ffi.NULL:
            raise MemoryError("zstd: no compression context")
        self._context = ffi.gc(context, lib.ZSTD_freeCCtx)
        self._parameters: object | None = None  # the parameters the context is set to
        self._out: Any = None
        self._capacity = 0

    def compress(
        self, raw: bytes, base: bytes, parameters: zstandard.ZstdCompressionParameters
    ) -> bytes:
        """One zstd frame of ``raw`` with ``base`` as the bytes before it: the frame
        ``ZstdCompressor(dict_data=<base as raw content>, compression_params=parameters)``
        makes of it, decoded the same way.

        Raises:
            zstandard.ZstdError: zstd refused (the context stays usable).
        """
        lib, ffi, context = self._lib, self._ffi, self._context
        if parameters is not self._parameters:
            self._configure(parameters)
        bound = lib.ZSTD_compressBound(len(raw))
        if bound > self._capacity:
            self._out, self._capacity = ffi.new("char[]", bound), bound
        self._check(lib.ZSTD_CCtx_refPrefix(context, ffi.from_buffer(base), len(base)))
        written = lib.ZSTD_compress2(context, self._out, bound, ffi.from_buffer(raw), len(raw))
        self._check(written)
        return bytes(ffi.buffer(self._out, written))

    def _configure(self, parameters: zstandard.ZstdCompressionParameters) -> None:
        lib = self._lib
        self._parameters = None  # unknown until every parameter is set
        self._check(lib.ZSTD_CCtx_reset(self._context, lib.ZSTD_reset_session_and_parameters))
        for key, field in _PARAMETERS:  # 0 is zstd's "the default", as in the C extension
            value = int(getattr(parameters, field))
            self._check(lib.ZSTD_CCtx_setParameter(self._context, getattr(lib, key), value))
        self._parameters = parameters

    def _check(self, code: int) -> None:
        lib = self._lib
        if lib.ZSTD_isError(code):
            # The context forgets the frame it was in (and its prefix); its parameters stay.
            lib.ZSTD_CCtx_reset(self._context, lib.ZSTD_reset_session_only)
            name = self._ffi.string(lib.ZSTD_getErrorName(code)).decode(errors="replace")
            raise zstandard.ZstdError(f"zstd: {name}")


class _Loaded:
    """The cffi module once loaded (None: cannot be), and each thread's compressor."""

    lock = threading.Lock()
    tried = False
    module: tuple[Any, Any] | None = None
    local = threading.local()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the lock at the fork: it is never released here.
    _Loaded.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _load() -> tuple[Any, Any] | None:
    with _Loaded.lock:
        if not _Loaded.tried:
            _Loaded.tried = True
            try:
                from zstandard._cffi import ffi, lib  # type: ignore[import-not-found]  # noqa: PLC0415
            except ImportError as exc:  # no cffi package, or a zstandard without the module
                log.debug("deltas through zstandard's C extension (%s)", exc)
                return None
            if all(hasattr(lib, name) for name in _NAMES):
                _Loaded.module = (ffi, lib)
        return _Loaded.module


def prefix_compressor() -> PrefixCompressor | None:
    """This thread's :class:`PrefixCompressor`, or None where zstandard's cffi module
    cannot be loaded (deltas are then made with its C extension)."""
    if not enabled:
        return None
    compressor: PrefixCompressor | None = getattr(_Loaded.local, "compressor", None)
    if compressor is None:
        module = _Loaded.module if _Loaded.tried else _load()
        if module is None:
            return None
        compressor = _Loaded.local.compressor = PrefixCompressor(*module)
    return compressor


enabled = True
"""False: :func:`prefix_compressor` returns None, and deltas are made with zstandard's C
extension (a benchmark compares both ways; tests check that readers decode both)."""


__all__ = ["MAX_BASE_BYTES", "PrefixCompressor", "enabled", "prefix_compressor"]
