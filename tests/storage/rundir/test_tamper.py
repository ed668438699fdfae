"""Nine at-rest attacks on a run, with and without a key (docs/security.md, guarantees.md).

Each attacker can write the store's files but not read the key. With a key all nine are
detected by ``verify()`` — truncation and whole-run rollback through the run's head
record, kept outside the store. Without a key only what the table below says is
detected: the test holds docs/guarantees.md to it.
"""

from __future__ import annotations

import shutil
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

import afk_local as afk
from afk_local.storage.format import codec
from afk_local.storage.format.frames import SIGNED_FRAME
from afk_local.storage.format.integrity import MAC_SIZE

KEY = "tamper test key"
FRAME = struct.Struct("<II")


def build(store: afk.Store, run_id: str, n: int = 4) -> None:
    """Checkpoints of phases p1..pn (keyframes: no file depends on another), 3 effects."""
    with store.create(run_id) as run:
        for i in range(1, n + 1):
            run.checkpoint(f"p{i}", {"i": i, "secret": f"value {i}"}, step=i)
            if i == 2:
                for key in ("a", "b", "c"):
                    run.effects.call(key, lambda key=key: key.upper())


def ckpt(store: afk.Store, run_id: str, seq: int) -> Path:
    return next(store.paths(run_id).dir.glob(f"{seq:012d}.*.ckpt"))


def frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        length, _ = FRAME.unpack_from(data, pos)
        size = 8 + (length & (SIGNED_FRAME - 1)) + (MAC_SIZE if length & SIGNED_FRAME else 0)
        out.append(data[pos : pos + size])
        pos += size
    return out


# -- the attacks --------------------------------------------------------------------------


def edit_record(store: afk.Store, tmp: Path) -> None:
    """1. Edit a checkpoint's payload, recompute the crc, keep whatever MAC it had."""
    path = ckpt(store, "r", 3)
    header, body = codec.unpack_frame(path.read_bytes(), str(path), expect_kind=1)
    record = msgspec.msgpack.decode(codec.decompress(body, "", base=None, max_bytes=1 << 20))
    record["payload"]["secret"] = "edited"
    raw = msgspec.msgpack.encode(record)
    path.write_bytes(codec.pack_frame(1, codec.compress(raw), mac=header.mac))


def strip_signature(store: afk.Store, tmp: Path) -> None:
    """2. Remove a checkpoint's MAC and its flag, crc recomputed (keyed stores only)."""
    path = ckpt(store, "r", 3)
    _, body = codec.unpack_frame(path.read_bytes(), str(path), expect_kind=1)
    path.write_bytes(codec.pack_frame(1, body))


def copy_from_another_run(store: afk.Store, tmp: Path) -> None:
    """3. Put another run's checkpoint 3 (same name) in place of this run's."""
    build(store, "other")
    shutil.copyfile(ckpt(store, "other", 3), ckpt(store, "r", 3))


def swap_records(store: afk.Store, tmp: Path) -> None:
    """4. Swap the contents of checkpoints 2 and 3."""
    a, b = ckpt(store, "r", 2), ckpt(store, "r", 3)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)


def delete_middle(store: afk.Store, tmp: Path) -> None:
    """5. Delete checkpoint 2 while later ones exist."""
    ckpt(store, "r", 2).unlink()


def older_version(store: afk.Store, tmp: Path) -> None:
    """6. Put back an older version of checkpoint 3: one a crash took back before it was
    acknowledged (so the head never named it), then written again differently."""
    raise NotImplementedError  # built by its own run, see ATTACKS


def journal_record(store: afk.Store, tmp: Path) -> None:
    """7. Delete a journal record in the middle of effects.log."""
    path = store.paths("r").journal
    parts = frames(path.read_bytes())
    path.write_bytes(b"".join(parts[:2] + parts[3:]))


def truncate(store: afk.Store, tmp: Path) -> None:
    """8. Drop the newest checkpoint (and latest) and the newest journal records."""
    ckpt(store, "r", 4).unlink()
    store.paths("r").latest.unlink()
    path = store.paths("r").journal
    parts = frames(path.read_bytes())
    path.write_bytes(b"".join(parts[:-2]))


def snapshot_rollback(store: afk.Store, tmp: Path) -> None:
    """9. Put back an older copy of the whole run directory (taken after checkpoint 2)."""
    run_dir = store.paths("r").dir
    shutil.rmtree(run_dir)
    with tarfile.open(tmp / "snapshot.tar") as tar:
        tar.extractall(run_dir.parent, filter="tar")


ATTACKS: list[tuple[str, Callable[[afk.Store, Path], None], bool]] = [
    # (name, attack, detected without a key)
    ("edit", edit_record, False),
    ("strip", strip_signature, False),
    ("copy", copy_from_another_run, True),  # the record names another run...
    ("swap", swap_records, True),  # ...or another seq: caught unless the attacker edits it too
    ("delete", delete_middle, False),
    ("older", older_version, False),
    ("journal", journal_record, False),
    ("truncate", truncate, False),
    ("snapshot", snapshot_rollback, False),
]


def attacked_run(store: afk.Store, name: str, attack, tmp: Path) -> None:
    if name == "older":
        with store.create("r") as run:
            run.checkpoint("p1", {"i": 1}, step=1)
            run.checkpoint("p2", {"i": 2}, step=2)
        head = store.heads.path("r") if store.heads else None
        before = head.read_bytes() if head else b""
        with store.resume_writer("r") as run:
            run.checkpoint("p3", {"i": 3}, step=3)
        three = ckpt(store, "r", 3)
        saved = three.read_bytes()
        three.unlink()  # as if a crash took it back before the write was acknowledged
        if head:
            head.write_bytes(before)
        with store.resume_writer("r") as run:
            run.checkpoint("p3", {"i": "3 again"}, step=3)
            run.checkpoint("p4", {"i": 4}, step=4)
        three.write_bytes(saved)  # the attack
        return
    if name == "snapshot":
        build(store, "r", 2)
        with tarfile.open(tmp / "snapshot.tar", "w") as tar:
            tar.add(store.paths("r").dir, arcname="r")
        with store.resume_writer("r") as run:
            run.checkpoint("p3", {"i": 3}, step=3)
            run.effects.call("d", lambda: "D")
    else:
        build(store, "r")
    attack(store, tmp)


@pytest.mark.parametrize(("name", "attack", "unkeyed"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_every_at_rest_attack_is_detected_with_a_key(tmp_path: Path, name, attack, unkeyed) -> None:
    store = afk.Store(tmp_path / "keyed", key=KEY)
    attacked_run(store, name, attack, tmp_path)
    report = store.open("r", lazy=True).verify()
    assert not report.ok, (name, report)
    if name in ("truncate", "snapshot"):  # only the head record can tell
        assert any("rolled back" in p.reason for p in report.problems), report
        with pytest.raises(afk.RunRolledBackError):
            store.resume_writer("r")


@pytest.mark.parametrize(("name", "attack", "unkeyed"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_what_is_detected_without_a_key(tmp_path: Path, name, attack, unkeyed) -> None:
    if name == "strip":
        pytest.skip("nothing is signed without a key")
    store = afk.Store(tmp_path / "plain")
    attacked_run(store, name, attack, tmp_path)
    assert store.open("r", lazy=True).verify().ok is not unkeyed


def test_accidental_damage_is_detected_without_a_key(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    build(store, "r")
    path = ckpt(store, "r", 3)
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01  # one flipped bit, crc not recomputed
    path.write_bytes(bytes(data))
    (problem,) = store.open("r", lazy=True).verify().problems
    assert "crc32 mismatch" in problem.reason
