"""Hand-made zstd frames that the codec tests feed to the readers."""

from __future__ import annotations

import zstandard


def huge_declared_frame(declared: int) -> bytes:
    """A zstd frame whose header declares ``declared`` bytes but holds only a few."""
    out = bytearray()

    class Sink:
        def write(self, b: bytes) -> int:
            out.extend(b)
            return len(b)

    writer = zstandard.ZstdCompressor(write_content_size=True).stream_writer(Sink(), size=declared)
    writer.write(b"x" * 100)
    writer.flush(zstandard.FLUSH_BLOCK)
    return bytes(out)
