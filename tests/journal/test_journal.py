"""The effect journal (afk_local/journal/journal.py): format, torn tails, replay, threads."""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from pathlib import Path

import msgspec
import proc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import payloads

import afk_local as afk
from afk_local.journal.journal import Journal
from afk_local.journal.replay import ReplayedError, idempotency_key, input_hash
from afk_local.storage import fsio
from afk_local.storage.format.frames import FRAME_HEADER_SIZE
from afk_local.storage.format.records import Effect, ErrorInfo


def frame_sizes(path: Path) -> list[int]:
    """Offsets where each frame of a sound journal file starts, plus the end."""
    data = path.read_bytes()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack_from("<I", data, pos)
        pos += FRAME_HEADER_SIZE + length
    assert pos == len(data)
    return [*offsets, pos]


def view(journal: Journal) -> dict[str, tuple[object, ...]]:
    """What the index says about every key, in comparable form."""
    result = {}
    for key in journal.keys():  # noqa: SIM118 - a Journal is not a dict
        state = journal.lookup(key)
        assert state is not None
        result[key] = (state.intent, state.outcome, state.in_doubt, state.attempts)
    return result


# -- the property tests -----------------------------------------------------------

keys = st.sampled_from(["a", "b", "c", "tool:1", "ü/ß"])
intents = st.builds(
    lambda key, name, step: ("intent", key, name, step),
    keys,
    st.text(max_size=8),
    st.integers(0, 2**31),
)
outcomes = st.builds(
    lambda key, ok, result: ("outcome", key, ok, result), keys, st.booleans(), payloads
)


def write_ops(journal: Journal, ops: list[tuple[object, ...]]) -> list[Effect]:
    """Append ``ops``; those out of a key's order are refused, nothing written (skipped)."""
    written = []
    for op in ops:
        try:
            written.append(write_op(journal, op))
        except ValueError as exc:
            assert "out of order" not in str(exc) and "refused, nothing was written" in str(exc)
    return written


def write_op(journal: Journal, op: tuple[object, ...]) -> Effect:
    if op[0] == "intent":
        _, key, name, step = op
        return journal.record_intent(
            str(key),
            name=str(name),
            input_hash=input_hash(str(name), (step,), {}),
            idempotency_key=idempotency_key(journal.run_id, str(key)),
            step=int(step),  # type: ignore[call-overload]
        )
    _, key, ok, result = op
    if ok:
        return journal.record_outcome(str(key), status="ok", result=result)
    info = ErrorInfo(type="ValueError", message=repr(result))
    return journal.record_outcome(str(key), status="error", error=info)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(intents | outcomes, max_size=25), data=st.data())
def test_reopen_gives_the_same_view_and_any_truncation_a_prefix(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[object, ...]], data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("j") / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        written = write_ops(journal, ops)
        before = view(journal)
        assert len(journal) == len(written)
    with Journal(path, "r", writable=False) as reopened:
        assert reopened.torn_tail is None
        assert list(reopened.records()) == written
        assert view(reopened) == before

    bounds = frame_sizes(path)
    full = path.read_bytes()
    cut = data.draw(st.integers(0, len(full)), label="cut")
    path.write_bytes(full[:cut])
    whole = sum(1 for end in bounds[1:] if end <= cut)
    boundary = bounds[whole]
    with Journal(path, "r", writable=False) as reader:  # read-only: reported, left alone
        assert list(reader.records()) == written[:whole]
        assert (reader.torn_tail is None) == (cut == boundary)
        if reader.torn_tail is not None:
            assert reader.torn_tail.offset == boundary
            assert reader.torn_tail.dropped_bytes == cut - boundary
    assert path.stat().st_size == cut
    with Journal(path, "r", writable=True) as repaired:  # writable: truncated to the boundary
        assert list(repaired.records()) == written[:whole]
        assert path.stat().st_size == boundary
        repaired.record_intent("after", name="n", input_hash="h", idempotency_key="k")
    with Journal(path, "r", writable=False) as again:
        assert again.torn_tail is None
        assert [r.key for r in again.records()] == [r.key for r in written[:whole]] + ["after"]


def test_every_truncation_offset_of_one_file(tmp_path: Path) -> None:
    """Exhaustive over every byte offset of a small journal (read-only opens)."""
    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        written = write_ops(
            journal,
            [("intent", "a", "f", 1), ("outcome", "a", True, {"x": [1, 2]}),
             ("intent", "b", "g", 2), ("outcome", "b", False, "boom"), ("intent", "c", "h", 3)],
        )  # fmt: skip
    bounds = frame_sizes(path)
    full = path.read_bytes()
    cut_path = tmp_path / "cut.log"
    for cut in range(len(full) + 1):
        cut_path.write_bytes(full[:cut])
        with Journal(cut_path, "r", writable=False) as reader:
            whole = sum(1 for end in bounds[1:] if end <= cut)
            assert list(reader.records()) == written[:whole], cut
            assert len(reader) == whole


def test_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    # After a power loss some filesystems show the grown size with zeros in it.
    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        journal.record_intent("a", name="f", input_hash="h", idempotency_key="k")
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(bytes(100))
    with Journal(path, "r", writable=True) as journal:
        assert journal.torn_tail is not None
        assert journal.torn_tail.offset == size
        assert journal.torn_tail.dropped_bytes == 100
        assert journal.keys() == ["a"]
    assert path.stat().st_size == size


# -- corruption -------------------------------------------------------------------


def three_records(path: Path) -> list[int]:
    with Journal(path, "r", writable=True) as journal:
        for key in ("a", "b", "c"):
            journal.record_intent(key, name="f", input_hash="h", idempotency_key="k")
    return frame_sizes(path)


@pytest.mark.parametrize("where", ["body", "crc", "length"])
def test_corrupt_middle_frame_raises_naming_the_offset(tmp_path: Path, where: str) -> None:
    path = tmp_path / "effects.log"
    bounds = three_records(path)
    data = bytearray(path.read_bytes())
    at = {"body": bounds[1] + FRAME_HEADER_SIZE + 3, "crc": bounds[1] + 4, "length": bounds[1]}
    data[at[where]] ^= 0x40
    path.write_bytes(bytes(data))
    for writable in (False, True):
        with pytest.raises(afk.EffectLogCorruptionError) as caught:
            Journal(path, "run-x", writable=writable)
        assert caught.value.offset == bounds[1]
        assert f"byte {bounds[1]}" in str(caught.value)
        assert "run-x" in str(caught.value)
    assert path.read_bytes() == bytes(data)  # nothing truncated


def test_corrupt_last_frame_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    bounds = three_records(path)
    data = bytearray(path.read_bytes())
    data[bounds[2] + FRAME_HEADER_SIZE + 3] ^= 0x01
    path.write_bytes(bytes(data))
    with Journal(path, "r", writable=False) as journal:
        assert journal.torn_tail is not None
        assert journal.torn_tail.offset == bounds[2]
        assert "crc32" in journal.torn_tail.reason
        assert journal.keys() == ["a", "b"]


def test_valid_crc_but_not_an_effect_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    body = msgspec.msgpack.encode({"hello": 1})
    path.write_bytes(struct.pack("<II", len(body), zlib.crc32(body)) + body)
    with pytest.raises(afk.EffectLogCorruptionError) as caught:
        Journal(path, "r", writable=False)
    assert caught.value.offset == 0


def test_frame_length_bound(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True, max_frame_bytes=200) as journal:
        with pytest.raises(ValueError, match="max_frame_bytes"):
            journal.record_outcome("a", status="ok", result="x" * 500)
        assert path.stat().st_size == 0  # refused before writing
        journal.append(Effect(kind="intent", key="a", timestamp_ms=1))  # still writable
    # a huge declared length is refused without reading (and here: a torn tail)
    with open(path, "ab") as fh:
        fh.write(struct.pack("<II", 1 << 31, 0) + b"\x00" * 16)
    with Journal(path, "r", writable=False) as journal:
        assert journal.torn_tail is not None
        assert "outside 1..67108864" in journal.torn_tail.reason


# -- replay logic -----------------------------------------------------------------


def test_call_records_then_replays(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    calls: list[tuple[int, str]] = []

    def charge(amount: int, *, idempotency_key: str) -> dict[str, object]:
        calls.append((amount, idempotency_key))
        return {"charged": amount, "pair": (1, 2)}

    with Journal(path, "run-1", writable=True) as journal:
        first = journal.call("pay", charge, (5,))
        assert first == {"charged": 5, "pair": (1, 2)}
        assert journal.replayed_count == 0
    with Journal(path, "run-1", writable=True) as journal:
        again = journal.call("pay", charge, (5,))
        assert again == {"charged": 5, "pair": [1, 2]}  # as msgpack gives it back
        assert journal.replayed_count == 1
        state = journal.lookup("pay")
        assert state is not None and state.status == "ok" and not state.in_doubt
        assert state.intent is not None and state.intent.name == "charge"
        assert state.outcome is not None and state.outcome.output_hash
    assert calls == [(5, idempotency_key("run-1", "pay"))]


def test_result_type_converts_replayed_results(tmp_path: Path) -> None:
    class Point(msgspec.Struct):
        x: int
        y: int

    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        assert journal.call("p", lambda: Point(1, 2), result_type=Point) == Point(1, 2)
    with Journal(path, "r", writable=True) as journal:
        assert journal.call("p", lambda: Point(9, 9), result_type=Point) == Point(1, 2)


def test_recorded_errors_replay_as_the_same_type_and_message(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"

    class QuotaError(Exception):
        pass

    def failing(kind: str) -> None:
        raise (KeyError("missing") if kind == "key" else QuotaError("over quota"))

    with Journal(path, "r", writable=True) as journal:
        with pytest.raises(KeyError):
            journal.call("k", failing, ("key",))
        with pytest.raises(QuotaError):
            journal.call("q", failing, ("quota",))
    with Journal(path, "r", writable=True) as journal:
        with pytest.raises(KeyError) as key_error:
            journal.call("k", failing, ("key",))
        assert isinstance(key_error.value, ReplayedError)
        assert type(key_error.value).__name__ == "KeyError"
        assert str(key_error.value) == str(KeyError("missing"))
        with pytest.raises(ReplayedError) as quota:
            journal.call("q", failing, ("quota",))
        assert type(quota.value).__name__ == "QuotaError"
        assert str(quota.value) == "over quota"
        assert quota.value.info.traceback and "QuotaError" in quota.value.info.traceback
        assert journal.replayed_count == 2
        # retry_errors runs it again; a success then sticks
        assert journal.call("q", lambda kind: "fine", ("quota",), name="failing",
                            retry_errors=True) == "fine"  # fmt: skip
    with Journal(path, "r", writable=True) as journal:
        assert journal.call("q", failing, ("quota",)) == "fine"
        assert journal.lookup("q").attempts == 2  # type: ignore[union-attr]


def test_mismatched_input_raises_showing_both(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-m", writable=True) as journal:
        journal.call("mail", lambda to: None, ("a@x",), name="send_mail")
        with pytest.raises(afk.EffectMismatchError) as caught:
            journal.call("mail", lambda to: None, ("b@x",), name="send_mail")
        message = str(caught.value)
        # both calls in words, not as digests, and what to do about it
        assert "send_mail('a@x')" in message and "send_mail('b@x')" in message
        assert input_hash("send_mail", ("a@x",), {}) not in message
        assert "afk-local replay run-m" in message and "ctx.patched" in message
        with pytest.raises(afk.EffectMismatchError):
            journal.call("mail", lambda to: None, ("a@x",), name="other_name")


def test_an_intent_keeps_its_arguments_in_words_bounded(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-w", writable=True) as journal:
        journal.call("big", lambda text, n: None, ("x" * 10_000,), {"n": 3}, name="put")
        intent = journal.lookup("big").intent  # type: ignore[union-attr]
    assert intent is not None and intent.args_text.endswith("n=3")
    assert intent.args_text.startswith("'xxx") and len(intent.args_text) <= 200


def test_a_journal_without_argument_text_still_says_which_call(tmp_path: Path) -> None:
    """Journals written before intents kept their arguments: the digest stands in."""
    path = tmp_path / "effects.log"
    with Journal(path, "run-o", writable=True) as journal:
        digest = input_hash("send_mail", ("a@x",), {})
        journal.record_intent("mail", name="send_mail", input_hash=digest, idempotency_key="k")
        journal.record_outcome("mail", status="ok", result=None)
        with pytest.raises(afk.EffectMismatchError) as caught:
            journal.call("mail", lambda to: None, ("b@x",), name="send_mail")
    message = str(caught.value)
    assert "send_mail(arguments not recorded; input hash " + digest[:12] in message
    assert "send_mail('b@x')" in message


def in_doubt_journal(path: Path) -> None:
    with Journal(path, "run-d", writable=True) as journal:
        journal.record_intent(
            "e", name="effect", input_hash=input_hash("effect", (), {}), idempotency_key="x"
        )


def test_in_doubt_policies(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    in_doubt_journal(path)
    seen: list[str] = []

    def effect(idempotency_key: str) -> str:
        seen.append(idempotency_key)
        return "done"

    with Journal(path, "run-d", writable=True) as journal:
        assert [s.key for s in journal.in_doubt()] == ["e"]
        with pytest.raises(afk.EffectInDoubtError) as caught:  # the explicit override
            journal.call("e", effect, idempotent=False)
        with pytest.raises(afk.EffectInDoubtError):  # no key: nothing drops a duplicate
            journal.call("e", lambda: "done", name="effect")
        assert caught.value.idempotency_key == idempotency_key("run-d", "e")
        decisions: list[object] = []

        def ask(state: object) -> str:
            decisions.append(state)
            return "raise"

        with pytest.raises(afk.EffectInDoubtError):
            journal.call("e", effect, in_doubt=ask)
        assert len(decisions) == 1
        assert seen == []
        assert journal.call("e", effect) == "done"  # it takes the key: retried with it
        assert seen == [idempotency_key("run-d", "e")]
        assert journal.in_doubt() == []
        assert journal.call("e", effect) == "done"  # now replayed
        assert seen == [idempotency_key("run-d", "e")]


def test_a_call_given_its_key_in_kwargs_is_retried_and_true_retries_any(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-d", writable=True) as journal:
        journal.record_intent(
            "k",
            name="effect",
            input_hash=input_hash("effect", (), {"idempotency_key": "mine"}),
            idempotency_key="x",
        )
        assert journal.call(
            "k", lambda **kw: kw, name="effect", kwargs={"idempotency_key": "mine"}
        ) == {"idempotency_key": "mine"}
    in_doubt_journal(path2 := tmp_path / "other.log")
    with Journal(path2, "run-d", writable=True) as journal:
        assert journal.call("e", lambda: 3, name="effect", idempotent=True) == 3


def test_in_doubt_callback_may_retry(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    in_doubt_journal(path)
    with Journal(path, "run-d", writable=True) as journal:
        result = journal.call(
            "e", lambda: 7, name="effect", in_doubt=lambda s: "retry" if s.in_doubt else "raise"
        )
        assert result == 7


def test_base_exceptions_leave_the_call_in_doubt(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"

    def interrupted() -> None:
        raise KeyboardInterrupt

    with Journal(path, "r", writable=True) as journal:
        with pytest.raises(KeyboardInterrupt):
            journal.call("k", interrupted)
        state = journal.lookup("k")
        assert state is not None and state.in_doubt


def test_unencodable_result_stays_in_doubt(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        with pytest.raises(TypeError, match="stays in doubt"):
            journal.call("k", object)
        assert [s.key for s in journal.in_doubt()] == ["k"]


def test_input_hash_is_canonical() -> None:
    assert input_hash("f", (1, "a"), {"x": 1, "y": 2}) == input_hash(
        "f", [1, "a"], {"y": 2, "x": 1}
    )
    assert input_hash("f", (1,), {}) != input_hash("g", (1,), {})
    assert input_hash("f", ({"b": 1, "a": 2},), {}) == input_hash("f", ({"a": 2, "b": 1},), {})
    assert len(input_hash("f", (), {})) == 32


def test_idempotency_key_is_stable_and_distinct() -> None:
    key = idempotency_key("run", "k")
    assert key == idempotency_key("run", "k")
    assert key.startswith("afk-") and key[4:].isalnum()
    assert len({key, idempotency_key("run", "k2"), idempotency_key("run2", "k")}) == 3


# -- durability and threads -------------------------------------------------------


def test_eight_threads_lose_nothing_and_group_commit(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    fsyncs = 0
    lock = threading.Lock()

    def hook(operation: str, target: str) -> None:
        nonlocal fsyncs
        if operation == "fsync" and target == str(path):
            with lock:
                fsyncs += 1
            time.sleep(0.0005)  # a slow disk: lets the other threads queue up

    threads_n, per_thread = 8, 1000
    journal = Journal(path, "r", writable=True)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(per_thread):
                journal.append(
                    Effect(kind="intent", key=f"t{t}-{i}", timestamp_ms=i, name=f"worker{t}" * 3)
                )
        except BaseException as exc:
            errors.append(exc)

    previous = fsio.set_io_hook(hook)
    try:
        workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        fsio.set_io_hook(previous)
        journal.close()
    assert errors == []
    total = threads_n * per_thread
    assert fsyncs < total / 2, f"{fsyncs} fsyncs for {total} records: no group commit"
    with Journal(path, "r", writable=False) as reopened:
        assert reopened.torn_tail is None
        assert len(reopened) == total
        last = dict.fromkeys(range(threads_n), -1)
        for record in reopened.records():
            t, i = (int(part) for part in record.key[1:].split("-"))
            assert i == last[t] + 1  # each thread's records whole and in its order
            assert record.name == f"worker{t}" * 3
            last[t] = i
        assert all(i == per_thread - 1 for i in last.values())


def test_failed_fsync_is_never_retried_and_refuses_appends(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    journal = Journal(path, "run-f", writable=True)
    ops: list[str] = []

    def hook(operation: str, target: str) -> None:
        ops.append(operation)
        if operation == "fsync":
            raise OSError(5, "Input/output error")

    previous = fsio.set_io_hook(hook)
    try:
        with pytest.raises(afk.WriterFailedError):
            journal.record_intent("a", name="f", input_hash="h", idempotency_key="k")
        with pytest.raises(afk.WriterFailedError):
            journal.record_intent("b", name="f", input_hash="h", idempotency_key="k")
        calls: list[int] = []
        with pytest.raises(afk.WriterFailedError):
            journal.call("c", lambda: calls.append(1))
        assert calls == []  # no intent, no call
    finally:
        fsio.set_io_hook(previous)
    # the failed fsync, then only the cut of what it did not make durable: never a retry
    assert ops == ["write", "fsync", "truncate", "fsync"]
    assert path.stat().st_size == 0
    assert journal.lookup("a") is None  # never acknowledged, never indexed
    journal.close()


def test_outcomes_are_read_lazily(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    big = "x" * 100_000
    with Journal(path, "r", writable=True) as journal:
        journal.call("big", lambda: big)
    with Journal(path, "r", writable=False) as journal:
        state = journal.lookup("big")
        assert state is not None
        assert state._outcome is None  # the index holds offsets only, nothing read yet
        assert state.outcome is not None and state.outcome.result == big


def test_read_only_open_of_missing_file_is_empty(tmp_path: Path) -> None:
    with Journal(tmp_path / "none.log", "r", writable=False) as journal:
        assert len(journal) == 0 and list(journal.records()) == [] and journal.keys() == []
    assert not (tmp_path / "none.log").exists()
    with pytest.raises(ValueError, match="read-only"):
        Journal(tmp_path / "none.log", "r", writable=False).append(
            Effect(kind="intent", key="a", timestamp_ms=1)
        )


def test_new_journal_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    Journal(path, "r", writable=True).close()
    assert path.stat().st_mode & 0o777 == 0o600


# -- wiring into runs -------------------------------------------------------------


def test_run_writer_and_reader_effects(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("job") as run:
        assert run.effects is run.effects
        assert run.effects.call("k", lambda: 41 + 1, name="answer") == 42
        journal = run.effects
    assert journal.closed  # closed with the writer
    reader = store.open("job")
    assert [(e.kind, e.key) for e in reader.effects()] == [("intent", "k"), ("outcome", "k")]
    report = reader.verify()
    assert report.ok, report.problems
    with store.resume_writer("job") as run:
        assert run.effects.call("k", lambda: 0, name="answer") == 42
        assert run.effects.replayed_count == 1


def test_verify_reports_torn_tail_in_doubt_and_corruption(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("job") as run:
        run.effects.call("done", lambda: 1)
        run.effects.record_intent("open", name="f", input_hash="h", idempotency_key="k")
        path = run.paths.journal
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\x10\x00\x00")
    report = store.open("job").verify()
    assert report.ok
    assert any(f"torn tail ignored at offset {size}" in note for note in report.notes)
    assert any("1 effect(s) in doubt" in note and "'open'" in note for note in report.notes)
    assert path.stat().st_size == size + 3  # verify never writes

    data = bytearray(path.read_bytes()[:size])
    data[FRAME_HEADER_SIZE + 2] ^= 0xFF  # first frame's body
    path.write_bytes(bytes(data))
    report = store.open("job").verify()
    assert not report.ok
    assert any(p.path == str(path) and "byte 0" in p.reason for p in report.problems)
    with pytest.raises(afk.EffectLogCorruptionError):
        store.open("job").effects()


def test_frame_bytes_are_exactly_length_crc_msgpack(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        record = journal.record_intent("a", name="f", input_hash="h", idempotency_key="k")
    data = path.read_bytes()
    body = msgspec.msgpack.encode(record)
    assert data == struct.pack("<II", len(body), zlib.crc32(body)) + body
    assert os.path.getsize(path) == FRAME_HEADER_SIZE + len(body)


def test_replayed_builtins_that_need_more_than_a_message(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"

    def decode() -> str:
        return b"\xff".decode()

    with Journal(path, "r", writable=True) as journal, pytest.raises(UnicodeDecodeError) as first:
        journal.call("d", decode)
    with Journal(path, "r", writable=True) as journal, pytest.raises(ReplayedError) as replayed:
        journal.call("d", decode)
    assert type(replayed.value).__name__ == "UnicodeDecodeError"
    assert str(replayed.value) == str(first.value)


def test_state_stays_live_after_later_records(tmp_path: Path) -> None:
    with Journal(tmp_path / "effects.log", "r", writable=True) as journal:
        journal.record_intent("k", name="f", input_hash="h1", idempotency_key="i")
        state = journal.lookup("k")
        assert state is not None and state.in_doubt and state.intent is not None
        journal.record_outcome("k", status="ok", result=1)
        assert not state.in_doubt and state.outcome is not None and state.outcome.result == 1
        journal.record_intent("k", name="f", input_hash="h2", idempotency_key="i")
        assert state.in_doubt and state.outcome is None
        assert state.intent is not None and state.intent.input_hash == "h2"


# The outcome's fsync fails with EIO (the disk lost the page); the process lives on.
EIO_CHILD = r"""
import sys, afk_local as afk
from afk_local.storage import fsio
store = afk.Store(sys.argv[1])
calls = 0
def charge():
    global calls
    calls += 1
    return "receipt"
def eio_on_the_second_journal_fsync(operation, path):
    global calls
    if operation == "fsync" and path.endswith("effects.log") and calls:
        raise OSError(5, "Input/output error")
with store.create("r") as run:
    fsio.set_io_hook(eio_on_the_second_journal_fsync)
    try:
        run.effects.call("charge", charge)
    except afk.WriterFailedError as exc:
        print("failed", calls, flush=True)
"""


def test_an_outcome_whose_fsync_failed_is_never_seen_as_recorded(tmp_path: Path) -> None:
    """fsyncgate: after EIO the page cache still holds the bytes; nobody may take them as done."""
    store = afk.Store(tmp_path / "store")
    done = proc.run(EIO_CHILD, str(store.root))
    assert done.returncode == 0 and done.stdout.split() == ["failed", "1"], done.stderr
    # Another process opens the run: the call ran, but its outcome never became durable,
    # so it is in doubt (a person checks) rather than replayed as done.
    with store.resume_writer("r") as run:
        state = run.effects.lookup("charge")
        assert state is not None and state.in_doubt, state
        with pytest.raises(afk.EffectInDoubtError):
            run.effects.call("charge", lambda: "again", name="charge")
    assert [e.kind for e in store.open("r").effects()] == ["intent"]


def test_two_threads_calling_one_key_execute_it_once(tmp_path: Path, trials) -> None:
    """Both callers get the one result; the second waits for the first and replays it."""
    for trial in range(trials(50, 2000)):
        journal = Journal(tmp_path / f"effects-{trial}.log", "r", writable=True)
        calls: list[int] = []
        barrier = threading.Barrier(2)
        results: list[object] = []

        def effect(trial: int = trial) -> int:
            calls.append(1)
            if trial % 2:
                time.sleep(0.002)  # half the trials: the second caller arrives mid-call
            return trial

        def caller() -> None:
            barrier.wait()
            try:
                results.append(journal.call("charge", effect))
            except Exception as exc:
                results.append(exc)

        threads = [threading.Thread(target=caller) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        journal.close()
        assert (len(calls), results) == (1, [trial, trial]), f"trial {trial}"


# -- frames swapped (issue 40, item 7b: an unkeyed journal has no chain) ------------------


def swap_frames(path: Path, i: int, j: int) -> None:
    """Exchange frames ``i`` < ``j`` of an unkeyed journal (each keeps its own crc)."""
    bounds = frame_sizes(path)
    data = path.read_bytes()
    frames = [data[bounds[k] : bounds[k + 1]] for k in range(len(bounds) - 1)]
    frames[i], frames[j] = frames[j], frames[i]
    path.write_bytes(b"".join(frames))


def test_an_outcome_swapped_before_its_intent_is_corruption_not_an_effect_in_doubt(
    tmp_path: Path,
) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-x", writable=True) as journal:
        journal.record_intent("a", name="f", input_hash="h", idempotency_key="i")
        journal.record_outcome("a", status="ok", result=1)
        journal.record_outcome("patch:x", status="ok", result=True)  # an outcome-only key
    swap_frames(path, 0, 1)
    # Before: accepted, and the done call "a" read as in doubt (its intent came last).
    for writable in (False, True):
        with pytest.raises(afk.EffectLogCorruptionError, match="out of order") as caught:
            Journal(path, "run-x", writable=writable)
        assert caught.value.offset == frame_sizes(path)[1]


def test_a_retried_calls_outcome_swapped_with_its_next_intent_is_corruption(
    tmp_path: Path,
) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-x", writable=True) as journal:
        journal.record_intent("a", name="f", input_hash="h", idempotency_key="i")
        journal.record_outcome("a", status="error", error=ErrorInfo(type="E", message="m"))
        journal.record_intent("a", name="f", input_hash="h", idempotency_key="i")
        journal.record_outcome("a", status="ok", result=1)
    swap_frames(path, 1, 2)  # intent, intent, error, ok: two outcomes for one intent
    with pytest.raises(afk.EffectLogCorruptionError, match="second outcome"):
        Journal(path, "run-x", writable=False)


def test_a_record_out_of_its_keys_order_is_refused_before_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-x", writable=True) as journal:
        journal.record_intent("a", name="f", input_hash="h", idempotency_key="i")
        journal.record_outcome("a", status="ok", result=1)
        with pytest.raises(ValueError, match="second outcome"):
            journal.record_outcome("a", status="ok", result=2)
        journal.record_outcome("limit@x", status="ok", result={})
        with pytest.raises(ValueError, match="nothing was written"):
            journal.record_intent("limit@x", name="f", input_hash="h", idempotency_key="i")
        size = path.stat().st_size
    with Journal(path, "run-x", writable=False) as reader:
        assert len(reader) == 3 and path.stat().st_size == size


def test_records_written_in_order_by_every_writer_path_open_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "run-x", writable=True) as journal:
        journal.record_outcome("limit@a", status="ok", result={})  # outcome-only keys
        journal.record_outcome("patch:p", status="ok", result=True)
        journal.record_intent("b", name="f", input_hash="h", idempotency_key="i")
        journal.record_intent("b", name="f", input_hash="h", idempotency_key="i")  # a retry
        journal.record_outcome("b", status="ok", result=2)
        journal.record_intent("b", name="f", input_hash="h", idempotency_key="i")  # unsettle
    with Journal(path, "run-x", writable=False) as journal:
        assert [s.key for s in journal.in_doubt()] == ["b"]
