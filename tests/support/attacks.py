"""Crafting hostile store files the way an attacker would: with afk_local's own encoder.

Every file made here has a valid crc (and, where the attacker is assumed to hold
no key, no MAC or a MAC copied from elsewhere). What a payload would do if it ran
is to create a *marker* file; the tests assert that the marker is absent.

The children the tests start get ``tests/support`` on their PYTHONPATH (:data:`ENV`),
so ``attack_jobs:touch_marker`` and ``hostile_import`` resolve there.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import proc
from proc import REPO, SUPPORT

from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format import pack as pack_format
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import Signer
from afk_local.storage.format.records import SCHEMA_VERSION, Checkpoint, RunMeta, RunStatus, now_ms

ENV = {
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
}
TIMEOUT = 60.0
"""Seconds any child may take: a hang is a failure, never a stuck suite."""


def plant_meta(
    root: Path,
    run_id: str,
    *,
    entrypoint: str | None,
    params: Any = None,
    extra: dict[str, Any] | None = None,
    status: RunStatus = RunStatus.RUNNING,
    signer: Signer | None = None,
    schema_version: int = SCHEMA_VERSION,
) -> Path:
    """Write ``runs/<run_id>/run.meta`` from scratch (valid crc; signed only with ``signer``)."""
    run_dir = root / "runs" / run_id
    fsio.make_dirs(run_dir)
    stamp = now_ms()
    meta = RunMeta(
        run_id=run_id,
        status=status,
        created_ms=stamp,
        updated_ms=stamp,
        entrypoint=entrypoint,
        params=params,
        extra=extra or {},
        schema_version=schema_version,
    )
    path = run_dir / "run.meta"
    path.write_bytes(codec.encode_meta(RecordCodec(signer=signer), meta))
    os.chmod(path, 0o600)
    return path


def agent_meta_params(marker: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """An agent run whose 'factory' is ``subprocess:run``: a rebuild that calls any callable
    it finds runs ``touch MARKER`` (``run(context)`` iterates the dict's keys as argv)."""
    context = {"touch": 0, str(marker): 0}
    return "subprocess:run", {"context": context}, {"kind": "agent"}


def checkpoint_file(
    run_dir: Path,
    seq: int,
    payload_raw: bytes | None = None,
    *,
    phase: str = "runtime_state",
    run_id: str | None = None,
    base: tuple[int, bytes] | None = None,
    schema_version: int = SCHEMA_VERSION,
) -> bytes:
    """Write checkpoint ``seq``: a record with ``payload_raw`` (msgpack) as its payload,
    as a keyframe or as a delta on ``base`` (its seq and decoded bytes). Returns the
    decoded record bytes (the base of a next delta)."""
    record = Checkpoint(
        schema_version=schema_version,
        run_id=run_id or run_dir.name,
        thread_id=None,
        seq=seq,
        step=seq,
        phase=phase,
        timestamp_ms=now_ms(),
        payload=None,
    )
    raw = msgspec.msgpack.encode(record)
    if payload_raw is not None:  # splice raw msgpack in as the payload (nesting a Python
        # list that deep would hit the recursion limit before the file exists)
        assert raw.endswith(b"\xa7payload\xc0")
        raw = raw[:-1] + payload_raw
    if base is None:
        frame = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw))
    else:
        frame = codec.pack_frame(
            codec.KIND_CHECKPOINT,
            codec.compress(raw, base[1]),
            flags=codec.FLAG_DELTA,
            base_seq=base[0],
        )
    (run_dir / f"{seq:012d}.{phase}.ckpt").write_bytes(frame)
    return raw


def bomb_frame(declared: int, *, complete: bool = True) -> bytes:
    """A keyframe body declaring ``declared`` decoded bytes of zeros: a few KB on disk.

    ``complete=False`` stops after the first MiB: the frame still declares ``declared``
    (a reader must refuse it from the declaration alone, so the rest never matters).
    """
    import zstandard  # noqa: PLC0415

    compressor = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=True)
    stream = compressor.compressobj(size=declared)
    zero = bytes(min(declared, 8 << 20))
    parts, left = [], declared if complete else len(zero)
    while left > 0:
        parts.append(stream.compress(zero[: min(left, len(zero))]))
        left -= len(zero)
    parts.append(stream.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK if not complete else 0))
    return codec.pack_frame(codec.KIND_CHECKPOINT, b"".join(parts))


def afk(root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT):
    """``afk-local --root ROOT ARGS`` in a child; CompletedProcess (a hang fails the test)."""
    full = {**os.environ, **ENV, **(env or {})}
    return proc.python(["-m", "afk_local", *args, "--root", str(root)], env=full, timeout=timeout)


MEASURE = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, timeout=120)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sys.stdout.write(json.dumps([peak, proc.returncode, proc.stdout.decode(errors="replace"),
                             proc.stderr.decode(errors="replace")]))
"""


class Measured(NamedTuple):
    """What a child did: its peak RSS in bytes, exit code, stdout and stderr."""

    peak: int
    code: int
    stdout: str
    stderr: str


def measure(*cmd: str) -> Measured:
    """Run ``cmd`` under a fresh parent (so no other child's peak is counted) and take
    its peak RSS from the parent's ``RUSAGE_CHILDREN`` (Linux: ``ru_maxrss`` in KiB)."""
    assert resource
    res = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=TIMEOUT * 2,
    )
    peak, code, out, err = json.loads(res.stdout)
    return Measured(peak * 1024, code, out, err)


def measure_afk(root: Path, *args: str) -> Measured:
    """:func:`measure` of ``afk-local ARGS --root ROOT``."""
    return measure(sys.executable, "-m", "afk_local", *args, "--root", str(root))


def peak_rss(root: Path, *args: str) -> tuple[int, int, str]:
    """Run ``afk-local ARGS --root ROOT`` under a fresh parent; its peak RSS in bytes, its
    exit code and stderr."""
    done = measure_afk(root, *args)
    return done.peak, done.code, done.stderr


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    """The CLI's error: exactly one line on stderr, no traceback."""
    lines = [line for line in res.stderr.splitlines() if not line.startswith("afk-local: warning:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def watch_events(root: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[int, list]:
    """``afk-local watch --once --json``: exit code and events."""
    res = afk(
        root,
        "watch",
        "--once",
        "--json",
        "--interval",
        "0.2",
        "--backoff",
        "0.2",
        "--max-attempts",
        "1",
        *flags,
        env=env,
        timeout=TIMEOUT * 2,
    )
    assert "Traceback" not in res.stderr, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return res.returncode, events


# -- hostile packs ----------------------------------------------------------------------

_PACK_HEADER = struct.Struct("<4sBBHQQIIQQI")


def packed_run(root: Path, run_id: str, n: int = 16) -> Path:
    """A run of ``n`` checkpoints, every one of them in one pack (no loose file, no
    ``latest``): its reads must open the pack. Returns the pack's path."""
    import afk_local  # noqa: PLC0415

    store = afk_local.Store(root)
    with store.create(run_id) as run:
        for i in range(n):
            run.checkpoint("runtime_state", {"i": i, "pad": "x" * 200}, step=i)
    store.pack([run_id], keep_loose=1)
    run_dir = root / "runs" / run_id
    (run_dir / "latest").unlink()
    for loose in run_dir.glob("*.ckpt"):
        loose.unlink()
    store.pack([run_id], keep_loose=1)  # nothing left to pack; merges nothing either
    (pack,) = run_dir.glob("pack-*.pack")
    return pack


def forge_pack_index(pack: Path, edit: Any) -> None:
    """Rewrite ``pack``'s index with ``edit(fields, raw_index)`` and recompute its crc."""
    import zstandard  # noqa: PLC0415

    data = pack.read_bytes()
    fields = list(_PACK_HEADER.unpack(data[: _PACK_HEADER.size]))
    index_at, index_len = fields[8], fields[9]
    raw = bytearray(zstandard.ZstdDecompressor().decompress(data[index_at : index_at + index_len]))
    edit(fields, raw)
    index = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(raw))
    fields[9] = len(index)
    head = _PACK_HEADER.pack(*fields[:-1], 0)[:-4]
    crc = zlib.crc32(index, zlib.crc32(head))
    pack.write_bytes(head + struct.pack("<I", crc) + data[_PACK_HEADER.size : index_at] + index)


def seq_out_of_range(pack: Path, entry: int = 3, seq: int = 1 << 63) -> None:
    """Finding 6 of issue 33: entry ``entry``'s seq set to ``seq`` (crc recomputed)."""

    def edit(fields: list[Any], raw: bytearray) -> None:
        count = fields[6]
        struct.pack_into("<Q", raw, len(raw) - 13 * count + 8 * entry, seq)

    forge_pack_index(pack, edit)


def sparse_index_pack(pack: Path, size: int = pack_format.MAX_PACK_BYTES - 4096) -> None:
    """Finding 7: ``pack`` replaced by a sparse file of ``size`` bytes (a few KB on disk)
    whose header declares an index of almost all of it, with a crc that matches."""
    data = pack.read_bytes()
    fields = list(_PACK_HEADER.unpack(data[: _PACK_HEADER.size]))
    index_at = _PACK_HEADER.size + 64
    fields[7] = 1  # one block
    fields[8], fields[9] = index_at, size - index_at
    head = _PACK_HEADER.pack(*fields[:-1], 0)[:-4]
    crc = zlib.crc32(data[_PACK_HEADER.size : _PACK_HEADER.size + 64], zlib.crc32(head))
    zeros = bytes(1 << 20)  # the index: zeros, as the sparse file reads back
    left = size - index_at
    while left > 0:
        crc = zlib.crc32(zeros[: min(left, len(zeros))], crc)
        left -= len(zeros)
    with open(pack, "wb") as out:
        out.write(head + struct.pack("<I", crc) + data[_PACK_HEADER.size : _PACK_HEADER.size + 64])
        out.truncate(size)


def bomb_pack(pack: Path, blocks: int = 16) -> Path:
    """Finding 7: ``pack`` replaced by ``blocks`` blocks of zstd bombs (each one entry of
    64 MiB of zeros, a few KB packed; ~33 KB in all), every crc valid. Returns its path."""
    parsed = pack.name.split("-")
    first = int(parsed[1])
    entries = [
        pack_format.PackEntry(first + i, "runtime_state", bytes(pack_format.MAX_ENTRY_BYTES))
        for i in range(blocks)
    ]
    name, data = pack_format.encode_pack(entries, run_id=pack.parent.name)
    pack.unlink()
    bomb = pack.parent / name
    bomb.write_bytes(data)
    return bomb
