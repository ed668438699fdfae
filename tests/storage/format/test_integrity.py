"""Tamper evidence (DESIGN §9, docs/format.md "Tamper evidence"): keyed stores sign every
record; edits, deletions, reordering, records from other runs and rollbacks are caught."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proc import run

import afk_local as afk
from afk_local.journal.journal import Journal
from afk_local.storage.format import codec
from afk_local.storage.format.frames import SIGNED_FRAME
from afk_local.storage.format.integrity import KEY_ENV, LINKS_KEY, MAC_SIZE, Signer
from afk_local.storage.format.layout import parse_checkpoint_name
from afk_local.storage.format.records import Checkpoint, Effect
from afk_local.storage.ops.export import export_records, import_run
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.read.reader import RunReader

KEY = "integrity test key"
HEAD = struct.Struct("<4sBBQQI")
FRAME = struct.Struct("<II")


def keyed(root: Path, key: str | bytes = KEY) -> afk.Store:
    return afk.Store(root, key=key)


def payload(i: int) -> dict[str, Any]:
    return {"i": i, "messages": [f"message {n} " * 10 for n in range(i)]}


def write_run(store: afk.Store, run_id: str, n: int = 6) -> list[Path]:
    """A run of ``n`` runtime_state checkpoints (deltas after the first) and two effects."""
    with store.create(run_id) as run:
        for i in range(1, n + 1):
            run.checkpoint("runtime_state", payload(i), step=i)
            if i == 2:
                run.effects.call("a", lambda: "A")
                run.effects.call("b", lambda: "B")
    return files(store, run_id)


def keyframe_run(store: afk.Store, run_id: str, n: int = 5) -> list[Path]:
    """A run of ``n`` checkpoints of different phases: all keyframes, none depends on another."""
    with store.create(run_id) as run:
        for i in range(1, n + 1):
            run.checkpoint(f"p{i}", {"i": i}, step=i)
    return files(store, run_id)


def files(store: afk.Store, run_id: str) -> list[Path]:
    return sorted(store.paths(run_id).dir.glob("*.ckpt"))


def problems(store: afk.Store, run_id: str) -> dict[str, str]:
    """File name -> reason for every problem verify() reports (the meta may be bad too)."""
    report = store.open(run_id, lazy=True).verify()
    return {os.path.basename(p.path): p.reason for p in report.problems}


def load_raises(store: afk.Store, run_id: str, path: Path, match: str) -> None:
    reader = RunReader(store.paths(run_id), record_codec=store.codec)
    file = next(f for f in reader.checkpoint_files() if f.name == path.name)
    with pytest.raises(afk.CheckpointCorruptionError, match=match) as info:
        reader.load(file)
    assert path.name in str(info.value)


def reframe(path: Path, edit: Any) -> None:
    """Replace a file's record by ``edit(record)``, keeping its MAC and fixing its crc:
    what an attacker without the key can do."""
    header, _ = codec.unpack_frame(path.read_bytes(), str(path), expect_kind=codec.KIND_CHECKPOINT)
    unkeyed = afk.Store(path.parents[2]).open(path.parent.name)  # decodes deltas too
    file = parse_checkpoint_name(path.name)
    assert file is not None
    raw = unkeyed.record_bytes(file)[0]
    new_raw = msgspec.msgpack.encode(edit(msgspec.msgpack.decode(raw, type=Checkpoint)))
    path.write_bytes(
        codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(new_raw), mac=header.mac)
    )


# -- round trip ------------------------------------------------------------------------


def test_keyed_round_trip_signs_every_file_and_record(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    assert store.keyed and "keyed" in repr(store) and KEY not in repr(store.codec.signer)
    paths = write_run(store, "r")
    with store.resume_writer("r") as run:
        run.finish({"done": True})
    reader = store.open("r")
    assert reader.latest().payload["terminal_result"] == {"done": True}
    assert [c.payload for c in reader.history()[:6]] == [payload(i) for i in range(1, 7)]
    assert [e.key for e in reader.effects()] == ["a", "a", "b", "b"]
    report = reader.verify()
    assert report.ok and report.notes == [], report
    # Every checkpoint and the meta carry flag bit 1 and a 32-byte trailer; deltas stay deltas.
    flags = []
    for path in [*paths, store.paths("r").meta]:
        data = path.read_bytes()
        _, _, flag, _, body_len, _ = HEAD.unpack_from(data)
        assert flag & codec.FLAG_SIGNED and len(data) == 26 + body_len + MAC_SIZE
        flags.append(flag)
    assert any(f & codec.FLAG_DELTA for f in flags)
    # Every journal frame has the signed bit and a MAC after its msgpack bytes.
    data = store.paths("r").journal.read_bytes()
    pos = 0
    while pos < len(data):
        length, crc = FRAME.unpack_from(data, pos)
        assert length & SIGNED_FRAME
        size = (length & (SIGNED_FRAME - 1)) + MAC_SIZE
        assert zlib.crc32(data[pos + 8 : pos + 8 + size]) == crc
        pos += 8 + size
    # Resuming with the key replays the journal and continues the chain.
    with store.resume_writer("r") as run:
        assert run.effects.call("a", lambda: "other") == "A"
    assert store.open("r").verify().ok


def test_unkeyed_files_are_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key: the format of today, byte for byte; the keyed file is that plus flag and MAC."""
    monkeypatch.setattr(
        "afk_local.storage.rundir.write.checkpointing.now_ms", lambda: 1_700_000_000_000
    )
    monkeypatch.setattr("afk_local.journal.appending.now_ms", lambda: 1_700_000_000_000)
    plain, signed = afk.Store(tmp_path / "plain"), keyed(tmp_path / "signed")
    for store in (plain, signed):
        write_run(store, "r")
    plain_dir, signed_dir = plain.paths("r").dir, signed.paths("r").dir
    for path in files(plain, "r"):
        data = path.read_bytes()
        header, body = codec.unpack_frame(data, str(path), expect_kind=codec.KIND_CHECKPOINT)
        # Exactly the pre-signature layout: header (flags 0 or 1) + crc + body, nothing after.
        assert header.mac is None and header.flags in (0, codec.FLAG_DELTA)
        head = HEAD.pack(b"AFK1", 1, header.flags, header.base_seq, len(body), 0)[:22]
        assert data == head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body
        # The keyed file differs only by flag bit 1 (crc over the header follows) and the MAC.
        other = (signed_dir / path.name).read_bytes()
        unsigned = bytearray(other[:-MAC_SIZE])
        unsigned[5] &= ~codec.FLAG_SIGNED
        crc = zlib.crc32(bytes(unsigned[26:]), zlib.crc32(bytes(unsigned[:22])))
        unsigned[22:26] = struct.pack("<I", crc)
        assert bytes(unsigned) == data
    # The journal: length | crc32(msgpack) | msgpack(Effect), nothing else.
    journal = plain.paths("r").journal.read_bytes()
    expected = b""
    for effect in plain.open("r").effects():
        body = msgspec.msgpack.encode(effect)
        expected += FRAME.pack(len(body), zlib.crc32(body)) + body
    assert journal == expected
    assert not any(f.read_bytes()[5] & codec.FLAG_SIGNED for f in [plain_dir / "run.meta"])
    assert plain.open("r").verify().notes == []


def test_key_from_the_environment_reaches_runner_and_state_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)

    @afk.durable(store=str(tmp_path / "jobs"))
    def job(ctx: afk.RunContext, n: int) -> int:
        for i in ctx.iterate(range(n)):
            ctx.state["total"] = ctx.state.get("total", 0) + ctx.step("add", lambda i=i: i)
        return int(ctx.state["total"])

    assert job.run(4, run_id="j") == 6
    ckpt = afk.StateCheckpoint(tmp_path / "simple")
    ckpt.save({"x": 1})
    assert ckpt.load() == {"x": 1}
    for root, run_id in ((tmp_path / "jobs", "j"), (ckpt.store.root, None)):
        store = afk.Store(root)
        assert store.keyed
        run_id = run_id or store.run_ids()[0]
        assert store.open(run_id).verify().ok
        assert problems(keyed(root, "another key"), run_id)  # really signed with KEY
        monkeypatch.delenv(KEY_ENV)
        assert "signatures not checked" in " ".join(afk.Store(root).open(run_id).verify().notes)
        monkeypatch.setenv(KEY_ENV, KEY)


def test_empty_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="empty key"):
        afk.Store(tmp_path, key=b"")
    monkeypatch.setenv(KEY_ENV, "")
    assert not afk.Store(tmp_path).keyed  # an empty variable means no key
    assert repr(Signer(b"secret")) == "Signer(key=<hidden>)"


# -- attacks on checkpoints ------------------------------------------------------------


def test_edited_record_with_recomputed_crc_is_detected(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    paths = write_run(store, "r")
    edit = lambda c: msgspec.structs.replace(c, payload={"i": 999})  # noqa: E731
    # The newest one: latest() falls back to the newest valid one, and says what it skipped.
    reframe(paths[-1], edit)
    assert "HMAC mismatch" in problems(store, "r")[paths[-1].name]
    reader = store.open("r")
    assert reader.latest().seq == len(paths) - 1
    assert reader.skipped and "HMAC mismatch" in reader.skipped[0].reason
    with pytest.raises(afk.CheckpointCorruptionError, match="HMAC mismatch"):
        reader.resume_state()
    assert reader.resume_state(on_corrupt="fallback").checkpoint.seq == len(paths) - 1
    # One in the middle (a delta base: the deltas on it no longer decode either).
    reframe(paths[2], edit)
    assert "HMAC mismatch" in problems(store, "r")[paths[2].name]
    load_raises(store, "r", paths[2], "HMAC mismatch")


def test_stripped_signature_is_an_unsigned_record(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    paths = write_run(store, "r")
    data = bytearray(paths[1].read_bytes()[:-MAC_SIZE])
    data[5] &= ~codec.FLAG_SIGNED
    data[22:26] = struct.pack("<I", zlib.crc32(bytes(data[26:]), zlib.crc32(bytes(data[:22]))))
    paths[1].write_bytes(bytes(data))
    assert "unsigned record in a keyed store" in problems(store, "r")[paths[1].name]
    load_raises(store, "r", paths[1], "unsigned record in a keyed store")
    # A store without the key may read the run, but not write into it...
    with pytest.raises(afk.KeyRequiredError, match="AFK_LOCAL_KEY"):
        afk.Store(tmp_path).resume_writer("r")
    # ...and an unsigned run.meta (written by other means) is refused too.
    meta = store.read_meta("r")
    store.paths("r").meta.write_bytes(codec.encode_meta(codec.RecordCodec(), meta))
    assert "unsigned record in a keyed store" in problems(store, "r")["run.meta"]


def test_record_copied_from_another_run_is_detected(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    mine, theirs = keyframe_run(store, "mine"), keyframe_run(store, "theirs")
    shutil.copyfile(theirs[2], mine[2])  # same seq, same phase: renamed to fit
    found = problems(store, "mine")
    assert "HMAC mismatch" in found[mine[2].name]
    load_raises(store, "mine", mine[2], "HMAC mismatch")
    # The meta of another run does not pass either.
    shutil.copyfile(store.paths("theirs").meta, store.paths("mine").meta)
    assert "HMAC mismatch" in problems(store, "mine")["run.meta"]
    with pytest.raises(afk.CheckpointCorruptionError, match="HMAC mismatch"):
        store.open("mine")


def test_swapped_records_are_detected(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    paths = keyframe_run(store, "r")
    a, b = paths[2].read_bytes(), paths[3].read_bytes()
    paths[2].write_bytes(b)
    paths[3].write_bytes(a)
    found = problems(store, "r")
    assert "HMAC mismatch" in found[paths[2].name] and "HMAC mismatch" in found[paths[3].name]
    load_raises(store, "r", paths[3], "HMAC mismatch")


def test_deleted_middle_record_is_detected(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    paths = keyframe_run(store, "r")  # no delta depends on the deleted file
    paths[2].unlink()
    found = problems(store, "r")
    assert list(found) == [paths[3].name]
    assert "HMAC mismatch" in found[paths[3].name] and "missing" in found[paths[3].name]
    load_raises(store, "r", paths[3], "missing")
    assert store.open("r").latest().seq == 5  # the newest record itself is sound


def test_rolled_back_record_is_detected(tmp_path: Path) -> None:
    """Seq 3 is written twice (the first write never acknowledged: a crash took it back,
    head record and all); restoring the older version is caught by the record after it."""
    store = keyed(tmp_path)
    with store.create("r") as run:
        for i in range(1, 3):
            run.checkpoint(f"p{i}", {"i": i}, step=i)
    head = store.heads.path("r")
    head_before_three = head.read_bytes()
    with store.resume_writer("r") as run:
        run.checkpoint("p3", {"i": 3}, step=3)
    old_three = files(store, "r")[2]
    saved = old_three.read_bytes()
    old_three.unlink()
    head.write_bytes(head_before_three)  # as if seq 3 had never been acknowledged
    with store.resume_writer("r") as run:
        run.checkpoint("p3", {"i": "3 again"}, step=3)
        run.checkpoint("p4", {"i": 4}, step=4)
    old_three.write_bytes(saved)
    assert store.open("r").get(3).payload == {"i": 3}  # itself a validly signed record...
    found = problems(store, "r")
    assert list(found) == ["000000000004.p4.ckpt"]  # ...but the chain after it breaks
    load_raises(store, "r", store.paths("r").dir / "000000000004.p4.ckpt", "HMAC mismatch")


def test_wrong_key_flags_every_file(tmp_path: Path) -> None:
    paths = write_run(keyed(tmp_path), "r")
    wrong = keyed(tmp_path, b"not the key")
    found = problems(wrong, "r")
    assert set(found) == {p.name for p in paths} | {"run.meta", "effects.log"}
    assert all("HMAC mismatch" in reason for reason in found.values())
    with pytest.raises(afk.CheckpointCorruptionError, match="HMAC mismatch"):
        wrong.open("r")


def test_cli_verify_with_the_wrong_key_lists_every_damaged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from afk_local.cli.main import main  # noqa: PLC0415 - the command line, in process

    keyframe_run(keyed(tmp_path), "r", 2)
    monkeypatch.setenv(KEY_ENV, KEY)
    assert main(["verify", "--root", str(tmp_path)]) == 0
    monkeypatch.setenv(KEY_ENV, "another key")
    capsys.readouterr()
    assert main(["verify", "--root", str(tmp_path), "--json"]) == 1
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    damaged = {os.path.basename(p["path"]) for p in run["problems"]}
    assert damaged == {"run.meta", "000000000001.p1.ckpt", "000000000002.p2.ckpt"}
    assert all("HMAC mismatch" in p["reason"] for p in run["problems"])


def test_unkeyed_store_reads_signed_runs_and_notes_it(tmp_path: Path) -> None:
    write_run(keyed(tmp_path), "r")
    plain = afk.Store(tmp_path)
    reader = plain.open("r")
    assert reader.latest().payload == payload(6)
    assert len(reader.effects()) == 4
    report = reader.verify()
    assert report.ok
    assert any("signatures not checked" in n for n in report.notes), report.notes
    # A store without the key may not write into a keyed store...
    with pytest.raises(afk.KeyRequiredError, match="the store is keyed"):
        write_run(plain, "plain")
    # ...and a keyed store refuses an unkeyed run copied in: every record is unsigned.
    write_run(afk.Store(tmp_path / "elsewhere"), "plain")
    shutil.copytree(tmp_path / "elsewhere" / "runs" / "plain", tmp_path / "runs" / "plain")
    found = problems(keyed(tmp_path), "plain")
    assert found and all("unsigned record in a keyed store" in r for r in found.values())


def test_truncating_the_newest_records_is_caught_by_the_head_record(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    keyframe_run(store, "r", 4)
    head = store.heads.path("r")
    files(store, "r")[-1].unlink()
    store.paths("r").latest.unlink()
    found = problems(store, "r")
    assert list(found) == ["r"] and "rolled back" in found["r"], found
    with pytest.raises(afk.RunRolledBackError, match="newest on disk is 3"):
        store.resume_writer("r")
    # Without its head record (kept outside the store) nothing inside the run can tell.
    head.unlink()
    assert store.open("r").verify().ok


# -- attacks on the journal ------------------------------------------------------------


def frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        length, _ = FRAME.unpack_from(data, pos)
        size = 8 + (length & (SIGNED_FRAME - 1)) + (MAC_SIZE if length & SIGNED_FRAME else 0)
        out.append(data[pos : pos + size])
        pos += size
    return out


def journal_store(tmp_path: Path, count: int = 4) -> tuple[afk.Store, Path]:
    store = keyed(tmp_path)
    with store.create("r") as run:
        for i in range(count):
            run.effects.call(f"k{i}", lambda i=i: i * 10)
    return store, store.paths("r").journal


def assert_journal_refused(store: afk.Store, match: str) -> None:
    found = problems(store, "r")
    # The records' own MACs catch it; the head record (the run dir) sees it too.
    assert set(found) <= {"effects.log", "r"} and match in found["effects.log"], found
    with pytest.raises(afk.EffectLogCorruptionError, match=match):
        store.open("r").effects()
    head = store.heads.path("r")
    saved = head.read_bytes()
    head.unlink()  # the MACs alone, without the head record:
    with pytest.raises(afk.EffectLogCorruptionError, match=match), store.resume_writer("r") as run:
        run.effects  # opening the journal checks it
    head.write_bytes(saved)


def test_journal_deleted_edited_or_reordered_record_is_detected(tmp_path: Path) -> None:
    store, path = journal_store(tmp_path)
    original = path.read_bytes()
    parts = frames(original)
    assert len(parts) == 8
    path.write_bytes(b"".join(parts[:3] + parts[4:]))  # a middle record deleted
    assert_journal_refused(store, "HMAC mismatch")
    path.write_bytes(b"".join([parts[0], parts[2], parts[1], *parts[3:]]))  # two swapped
    assert_journal_refused(store, "HMAC mismatch")
    # An edit with the crc recomputed: outcome of k1 now says 999.
    edited = msgspec.msgpack.decode(parts[3][8:-MAC_SIZE], type=Effect)
    body = msgspec.msgpack.encode(msgspec.structs.replace(edited, result=999))
    mac = parts[3][-MAC_SIZE:]
    forged = FRAME.pack(len(body) | SIGNED_FRAME, zlib.crc32(mac, zlib.crc32(body))) + body + mac
    path.write_bytes(b"".join([*parts[:3], forged, *parts[4:]]))
    assert_journal_refused(store, "HMAC mismatch")
    # A record without a signature.
    body = parts[3][8:-MAC_SIZE]
    path.write_bytes(b"".join([*parts[:3], FRAME.pack(len(body), zlib.crc32(body)) + body]))
    assert_journal_refused(store, "unsigned record in a keyed store")
    path.write_bytes(original)
    assert store.open("r").verify().ok


def test_journal_record_from_another_run_is_detected(tmp_path: Path) -> None:
    store, path = journal_store(tmp_path)
    with store.create("other") as run:
        for i in range(4):
            run.effects.call(f"k{i}", lambda i=i: i * 10)  # the same records, another run
    path.write_bytes(store.paths("other").journal.read_bytes())
    assert_journal_refused(store, "HMAC mismatch")


def test_keyed_journal_torn_tail_is_still_a_torn_tail(tmp_path: Path) -> None:
    store, path = journal_store(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data + data[: len(frames(data)[0]) - 5])  # a crash cut the last append
    reader = store.open("r")
    assert len(reader.effects()) == 8
    with store.resume_writer("r") as run:
        assert run.effects.torn_tail is not None
        assert run.effects.call("k9", lambda: 90) == 90
    assert store.open("r").verify().ok


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(min_value=3, max_value=8),
    mutation=st.sampled_from(["delete", "swap", "duplicate", "move_first"]),
    data=st.data(),
)
def test_journal_any_single_reordering_or_deletion_is_detected(
    tmp_path_factory: pytest.TempPathFactory, count: int, mutation: str, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("journal")
    path = root / "effects.log"
    signed = codec.RecordCodec(signer=Signer(KEY))
    with Journal(path, "r", writable=True, record_codec=signed) as journal:
        for i in range(count):
            journal.record_intent(f"k{i}", name="f", input_hash="h", idempotency_key="i")
    parts = frames(path.read_bytes())
    i = data.draw(st.integers(min_value=0, max_value=count - 2))  # the last one: a truncation
    if mutation == "delete":
        del parts[i]
    elif mutation == "swap":
        parts[i], parts[i + 1] = parts[i + 1], parts[i]
    elif mutation == "duplicate":
        parts.insert(i + 1, parts[i])
    else:
        parts.append(parts.pop(0))
    path.write_bytes(b"".join(parts))
    with pytest.raises(afk.EffectLogCorruptionError, match="HMAC mismatch"):
        Journal(path, "r", writable=False, record_codec=signed).close()


# -- gc, fork, import, LangGraph with a key ------------------------------------------


def test_gc_on_a_keyed_store_verifies_and_resumes(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    with store.create("r") as run:
        for i in range(1, 13):
            run.checkpoint("runtime_state", payload(i), step=i)
            run.checkpoint("post_llm", {"i": i}, step=i)
    before = {p.name: p.read_bytes() for p in files(store, "r")}
    report = store.gc(RetentionPolicy(keep_runtime_states=2))
    assert not report.errors and report.compacted[0].deleted_files > 0
    assert report.compacted[0].rewritten_files > 0  # a kept delta lost its base
    reader = store.open("r")
    assert reader.verify().ok, reader.verify().problems
    assert LINKS_KEY in reader.meta.extra
    assert reader.latest().payload == {"i": 12}
    with store.resume_writer("r") as run:
        run.checkpoint("runtime_state", payload(13), step=13)
    assert store.open("r").verify().ok
    # A rewritten keyframe kept its MAC; restoring the pre-gc delta fails (its base is gone).
    run_dir = store.paths("r").dir
    rewritten = [
        n for n, b in before.items() if (run_dir / n).exists() and (run_dir / n).read_bytes() != b
    ]
    assert rewritten
    kept_bytes = (run_dir / rewritten[0]).read_bytes()
    (run_dir / rewritten[0]).write_bytes(before[rewritten[0]])
    assert rewritten[0] in problems(store, "r")
    (run_dir / rewritten[0]).write_bytes(kept_bytes)
    assert store.open("r").verify().ok


def test_meta_rolled_back_to_before_gc_is_detected(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    with store.create("r") as run:
        for i in range(1, 9):
            run.checkpoint("runtime_state", payload(i), step=i)
            run.checkpoint("post_llm", {"i": i}, step=i)
    old_meta = store.paths("r").meta.read_bytes()
    store.gc(RetentionPolicy(keep_runtime_states=2))
    assert store.open("r").verify().ok
    store.paths("r").meta.write_bytes(old_meta)  # validly signed, but without the chain links
    found = problems(store, "r")
    assert found and all("missing" in reason for reason in found.values())


def test_gc_without_the_key_leaves_signed_runs_alone(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    with store.create("r") as run:
        for i in range(1, 8):
            run.checkpoint("runtime_state", payload(i), step=i)
    names = [p.name for p in files(store, "r")]
    report = afk.Store(tmp_path).gc(RetentionPolicy(keep_runtime_states=1))
    assert any("signed" in e and "AFK_LOCAL_KEY" in e for e in report.errors), report.errors
    assert [p.name for p in files(store, "r")] == names
    assert store.open("r").verify().ok


def test_fork_on_a_keyed_store_verifies_and_resumes(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    write_run(store, "src")
    store.fork("src", 3, "fork")
    reader = store.open("fork")
    assert reader.verify().ok, reader.verify().problems
    assert reader.latest().payload == payload(3)
    with store.resume_writer("fork") as run:
        run.checkpoint("runtime_state", {"fork": 4}, step=4)
    assert store.open("fork").verify().ok
    # A fork of the fork, then gc of the source: everything still verifies.
    store.fork("fork", 4, "grandchild")
    store.gc(RetentionPolicy(keep_runtime_states=1, keep_latest_step=False))
    for run_id in ("src", "fork", "grandchild"):
        assert store.open(run_id).verify().ok, run_id
    # The source's later checkpoint copied into the fork is refused: the fork shares
    # the source's records only up to seq 3.
    src4 = store.paths("src").dir / "000000000004.runtime_state.ckpt"
    fork4 = store.paths("fork").dir / "000000000004.runtime_state.ckpt"
    if src4.exists():
        shutil.copyfile(src4, fork4)
        assert "HMAC mismatch" in problems(store, "fork")[fork4.name]


def test_fork_refuses_a_later_source_record_copied_in(tmp_path: Path) -> None:
    store = keyed(tmp_path)
    keyframe_run(store, "src")
    store.fork("src", 3, "fork")
    src4 = store.paths("src").dir / "000000000004.p4.ckpt"
    shutil.copyfile(src4, store.paths("fork").dir / src4.name)  # chains onto the shared 3
    found = problems(store, "fork")
    assert "HMAC mismatch" in found[src4.name]


def test_import_into_a_keyed_store_signs_the_run(tmp_path: Path) -> None:
    plain = afk.Store(tmp_path / "plain")
    with plain.create("r") as run:
        for i in range(1, 9):
            run.checkpoint("runtime_state", payload(i), step=i)
            run.checkpoint("post_llm", {"i": i}, step=i)
        run.effects.call("e", lambda: 1)
    plain.gc(RetentionPolicy(keep_runtime_states=2))  # gaps in the seqs
    text = "\n".join(json.dumps(r) for r in export_records(plain.open("r")))
    store = keyed(tmp_path / "signed")
    import_run(store, text)
    reader = store.open("r")
    assert reader.verify().ok and reader.verify().notes == []
    assert reader.latest().payload == {"i": 8}
    with store.resume_writer("r") as run:
        run.checkpoint("runtime_state", payload(9), step=9)
        assert run.effects.call("e", lambda: 2) == 1
    assert store.open("r").verify().ok


def test_langgraph_delete_on_a_keyed_store_keeps_the_thread_verifiable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("langgraph")
    from afk_local.integrations.langgraph import (  # noqa: PLC0415 - an optional extra
        AfkLocalSaver,
        thread_run_id,
    )

    store = keyed(tmp_path)
    with AfkLocalSaver(store) as saver:
        parent = None
        for i in range(10):
            conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": ""}
            if parent:
                conf["checkpoint_id"] = parent
            cid = f"{i:04d}"
            checkpoint = {
                "v": 1, "id": cid, "ts": "2025-01-01T00:00:00+00:00",
                "channel_values": {"x": "y" * 500 + str(i)}, "channel_versions": {"x": 1},
                "versions_seen": {}, "updated_channels": None,
            }  # fmt: skip
            meta = {"source": "loop", "step": i, "run_id": "odd" if i % 2 else "even"}
            saver.put({"configurable": conf}, checkpoint, meta, {"x": 1})
            parent = cid
        saver.delete_for_runs(["odd"])
        assert store.open(thread_run_id("t")).verify().ok
        listed = [t.metadata for t in saver.list({"configurable": {"thread_id": "t"}})]
    assert store.open(thread_run_id("t")).verify().ok

    # The index cache is not signed: a keyed saver in a new process decodes every file.
    def unsigned_cache(path: Path) -> dict[str, Any]:
        raise AssertionError(f"a keyed store read the index cache {path}")

    for where in ("index", "thread_reads"):  # the index build and the cold get_tuple
        monkeypatch.setattr(
            f"afk_local.integrations.langgraph.{where}.read_index_cache", unsigned_cache
        )
    with AfkLocalSaver(keyed(tmp_path)) as fresh:
        assert [t.metadata for t in fresh.list({"configurable": {"thread_id": "t"}})] == listed
        fresh.prune(["t"])
        assert len(list(fresh.list({"configurable": {"thread_id": "t"}}))) == 1
    assert store.open(thread_run_id("t")).verify().ok


# -- crashes ---------------------------------------------------------------------------

# A short scripted run (its kill points, one child each, must stay a few seconds): the
# chain crosses a reopen in both the checkpoints and the journal.
SCRIPTED = r"""
import sys, afk_local as afk
from afk_local.testing import kill_at_io_call
root, kill_at = sys.argv[1], int(sys.argv[2])
switch = kill_at_io_call(kill_at)
store = afk.Store(root)
assert store.keyed
run = store.create("r")
run.checkpoint("runtime_state", {"seq": 1}, step=1)
print(1, flush=True)
run.effects.call("e", lambda: "done")
print("effect", flush=True)
run.close()
run = store.resume_writer("r")
run.checkpoint("runtime_state", {"seq": 2}, step=2)
print(2, flush=True)
run.effects.call("f", lambda: "done")
print("calls", switch.calls, flush=True)
"""


def test_keyed_sigkill_at_durable_io_calls(tmp_path: Path, trials: Any) -> None:
    """SIGKILL a keyed run at random durable I/O calls (all of them with --torture); each
    crash leaves a run that verifies, and resuming continues both chains."""
    env = {KEY_ENV: KEY}
    full = run(SCRIPTED, str(tmp_path / "count"), "0", env=env)
    assert full.returncode == 0, full.stderr
    total = int(full.stdout.split()[-1])
    points = list(range(1, total + 1))
    sample = trials(8, total)
    for kill_at in sorted(random.Random(20240611).sample(points, min(sample, total))):
        root = tmp_path / f"k{kill_at}"
        result = run(SCRIPTED, str(root), str(kill_at), env=env)
        assert result.returncode == -9, (kill_at, result.stderr)
        lines = result.stdout.split()
        acked = max((int(x) for x in lines if x.isdigit()), default=0)
        store = afk.Store(root, key=KEY)
        if not store.exists("r"):
            assert acked == 0
            continue
        reader = store.open("r")
        latest = reader.latest()
        assert (latest.seq if latest else 0) >= acked, kill_at
        assert reader.verify().ok, (kill_at, reader.verify().problems)
        if "effect" in lines:
            assert reader.effects()[1].result == "done"
        # Resuming continues the chain; everything still verifies.
        with store.resume_writer("r") as writer:
            writer.checkpoint("runtime_state", {"seq": writer.seq + 1}, step=99)
            writer.effects.call("after", lambda: 1)
        assert store.open("r").verify().ok, kill_at
