"""The storage layer: what a run directory holds and how it gets there durably.

Records and their codec (msgpack + zstd + crc/MAC, deltas), durable file I/O,
the run directory layout and ``latest`` pointer, the ownership lock, the run's
reader and writer, verify, retention/gc, fork and export. Lowest layer: it
imports nothing above itself except the journal that :class:`RunWriter` hands out.
"""
