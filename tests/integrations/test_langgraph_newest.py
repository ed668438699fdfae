"""A new process's newest checkpoint: read from ``latest`` alone, and its writes from
where the writes file ended when it was put (``Payload.top``, ``Payload.writes_from``).

Both shortcuts must give exactly what the full index and a full parse of
``langgraph.writes`` give, whatever happened to the thread before: ids put out of order
or twice, several namespaces, writes, deletions that rewrite the writes file, a saver
reopened between writes. Hypothesis drives the histories; an oracle saver with every
shortcut disabled gives the answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import afk_local as afk

if TYPE_CHECKING:
    from afk_local.integrations.langgraph import AfkLocalSaver


@pytest.fixture(autouse=True)
def _needs_langgraph() -> None:
    """The tests need langgraph: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "langgraph", reason="LangGraph not installed: pip install 'afk_local[test-all]'"
    )


NAMESPACES = ("", "sub")
IDS = tuple("bcdefgh")  # few ids: histories put them out of order and twice


def _checkpoint(cid: str, step: int) -> dict[str, Any]:
    return {
        "v": 1,
        "id": cid,
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": {"step": step},
        "channel_versions": {"step": step},
        "versions_seen": {},
        "updated_channels": None,
    }


def _put(
    saver: AfkLocalSaver,
    cid: str,
    step: int,
    *,
    ns: str = "",
    parent: str | None = None,
    run: str | None = None,
) -> Any:
    """Put checkpoint ``cid`` in thread ``t`` (as the child of ``parent``); its config."""
    conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": ns}
    if parent is not None:
        conf["checkpoint_id"] = parent
    metadata: dict[str, Any] = {"source": "loop", "step": step}
    if run is not None:
        metadata["run_id"] = run
    return saver.put({"configurable": conf}, _checkpoint(cid, step), metadata, {})


def _oracle(root: Path) -> AfkLocalSaver:
    """A new saver that builds the index and parses the whole writes file, always."""
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    saver = AfkLocalSaver(root)
    files = saver._threads
    files.newest_cold = lambda thread_id, ns: None  # type: ignore[method-assign]
    files.checkpoint_writes = (  # type: ignore[method-assign]
        lambda run_id, ns, cid, mark=None: files.load_writes(run_id).get((ns, cid), {})
    )
    return saver


def _answer(saver: AfkLocalSaver, thread: str, ns: str) -> Any:
    found = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})
    if found is None:
        return None
    return (
        found.config,
        found.checkpoint["channel_values"],
        found.metadata,
        found.parent_config,
        found.pending_writes,
    )


class _Shortcuts:
    """Counts the answers the two shortcuts gave (so the test knows it exercised them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from afk_local.integrations.langgraph import thread_reads as threads_module  # noqa: PLC0415
        from afk_local.integrations.langgraph import writes as writes_module  # noqa: PLC0415

        self.newest = self.writes = 0
        newest = threads_module.ThreadReads.newest_cold
        after = writes_module.read_writes_after

        def counting_newest(files: Any, thread_id: str, ns: str) -> Any:
            found = newest(files, thread_id, ns)
            self.newest += found is not None and found[2] is not None
            return found

        def counting_after(*args: Any, **kwargs: Any) -> Any:
            found = after(*args, **kwargs)
            self.writes += found is not None
            return found

        monkeypatch.setattr(threads_module.ThreadReads, "newest_cold", counting_newest)
        monkeypatch.setattr(threads_module, "read_writes_after", counting_after)


_OPS = st.sampled_from(["put", "put", "put", "writes", "writes", "delete", "prune", "reopen"])


def test_the_shortcuts_answer_what_the_index_answers(tmp_path: Path, monkeypatch) -> None:
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    shortcuts = _Shortcuts(monkeypatch)
    counter = iter(range(10**6))

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data())
    def history(data: st.DataObject) -> None:
        root = tmp_path / f"store-{next(counter)}"
        saver = AfkLocalSaver(root)
        parents: dict[str, str | None] = dict.fromkeys(NAMESPACES)
        try:
            for step in range(data.draw(st.integers(3, 14), label="length")):
                op = data.draw(_OPS, label="op")
                ns = data.draw(st.sampled_from(NAMESPACES), label="ns")
                if op == "put":
                    cid = data.draw(st.sampled_from(IDS), label="id")
                    run = data.draw(st.sampled_from(["r1", "r2"]), label="run")
                    _put(saver, cid, step, ns=ns, parent=parents[ns], run=run)
                    parents[ns] = cid
                elif op == "writes":
                    listed = list(
                        saver.list({"configurable": {"thread_id": "t", "checkpoint_ns": ns}})
                    )
                    if not listed:
                        continue
                    target = data.draw(st.sampled_from(listed), label="target").config
                    channel = data.draw(st.sampled_from(["ch", "__error__"]), label="channel")
                    task = data.draw(st.sampled_from(["t1", "t2"]), label="task")
                    saver.put_writes(target, [(channel, step)], task)
                elif op == "delete":
                    saver.delete_for_runs([data.draw(st.sampled_from(["r1", "r2"]), label="r")])
                    parents = dict.fromkeys(NAMESPACES)
                elif op == "prune":
                    saver.prune(["t"])
                    parents = dict.fromkeys(NAMESPACES)
                else:
                    saver.close()
                    saver = AfkLocalSaver(root)
                for checked in NAMESPACES:
                    with AfkLocalSaver(root) as fresh, _oracle(root) as oracle:
                        expected = _answer(oracle, "t", checked)
                        assert _answer(fresh, "t", checked) == expected
                        # The writing saver too: it may hold the thread's index.
                        assert _answer(saver, "t", checked) == expected
        finally:
            saver.close()

    history()
    # Histories that never reach a shortcut prove nothing about it: some must. (The
    # writes shortcut needs writes, then a put in the same saver, then a read: 5-20 of
    # the histories reach it; the test below takes it on purpose.)
    assert shortcuts.newest > 60
    assert shortcuts.writes > 0


def test_a_new_process_reads_one_checkpoint_and_only_the_new_writes(
    tmp_path, monkeypatch, count_loads
):
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415
    from afk_local.integrations.langgraph import thread_reads as threads_module  # noqa: PLC0415
    from afk_local.integrations.langgraph import writes as writes_module  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        newest = None
        for i in range(30):
            if newest is not None:
                saver.put_writes(newest, [("ch", i)], f"task-{i}")
            newest = _put(saver, f"{i:04d}", i, parent=f"{i - 1:04d}" if i else None)
        saver.put_writes(newest, [("ch", "last")], "task-last")
    run_dir = afk.Store(tmp_path).paths(thread_run_id("t")).dir
    loads = count_loads()
    read: list[int] = []
    original_pread = writes_module._pread_all

    def counting_pread(fd: int, offset: int, size: int) -> bytes:
        read.append(size)
        return original_pread(fd, offset, size)

    monkeypatch.setattr(writes_module, "_pread_all", counting_pread)
    monkeypatch.setattr(  # neither the index cache nor the directory listing is needed
        threads_module, "read_index_cache", lambda path: pytest.fail("read the index cache")
    )
    monkeypatch.setattr(
        threads_module, "scan_thread_files", lambda *a: pytest.fail("listed the directory")
    )
    with AfkLocalSaver(tmp_path) as fresh:
        found = fresh.get_tuple({"configurable": {"thread_id": "t"}})
    assert found.checkpoint["channel_values"] == {"step": 29}
    assert found.pending_writes == [("task-last", "ch", "last")]
    assert loads == ["000000000030.langgraph.ckpt"]
    whole = (run_dir / "langgraph.writes").stat().st_size
    assert len(read) == 1 and read[0] < whole // 10  # the last old frame and the new one


def test_checkpoints_of_an_unindexable_thread_are_never_marked_top(tmp_path, caplog):
    """The writer marks a checkpoint top only when it knows every id of the thread: when
    an old file cannot be read, it marks none, and a new process uses the index."""
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        for i, cid in enumerate(["0001", "0009"]):
            _put(saver, cid, i)
    run_dir = afk.Store(tmp_path).paths(thread_run_id("t")).dir
    (run_dir / "langgraph.index").unlink()  # the index must decode the files now
    first = run_dir / "000000000001.langgraph.ckpt"
    first.chmod(0o600)
    data = bytearray(first.read_bytes())
    data[-3] ^= 0xFF  # damage the oldest checkpoint's body
    first.write_bytes(bytes(data))
    with AfkLocalSaver(tmp_path) as saver:
        _put(saver, "0005", 2)
        reader = afk.Store(tmp_path).open(thread_run_id("t"))
        newest = reader.latest()
        assert newest is not None and newest.payload.top is False
        assert newest.payload.writes_from is None
    assert "cannot index its checkpoints" in caplog.text
    # The index is asked, and reports the damage.
    with AfkLocalSaver(tmp_path) as fresh, pytest.raises(afk.CheckpointCorruptionError):
        fresh.get_tuple({"configurable": {"thread_id": "t"}})


def test_an_index_cache_that_lost_entries_is_not_trusted_for_the_newest(tmp_path):
    """Power loss takes back the unsynced tail of ``langgraph.index`` (the checkpoint
    files themselves are durable); the next process appends after the gap. A new
    process asking for the newest checkpoint of a namespace must not answer from a
    cache that lacks some of its checkpoints."""
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    cache = afk.Store(tmp_path).paths(thread_run_id("t")).dir / "langgraph.index"
    with AfkLocalSaver(tmp_path) as saver:
        _put(saver, "0001", 1)
        _put(saver, "0002", 2)
        synced = cache.stat().st_size
        _put(saver, "0003", 3)
    with open(cache, "r+b") as fh:
        fh.truncate(synced)  # the power loss: 0003's entry never reached the disk
    with AfkLocalSaver(tmp_path) as saver:
        _put(saver, "0004", 4, ns="sub")  # latest is now a subgraph's checkpoint
    with AfkLocalSaver(tmp_path) as fresh:
        found = fresh.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert found.checkpoint["id"] == "0003"


def test_a_keyed_store_never_indexes_a_thread_to_write_to_it(tmp_path, count_loads):
    """A keyed store's index decodes (and checks) every checkpoint, and its readers never
    trust `top`: a new process's first put must not pay for indexing the thread."""
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    with AfkLocalSaver(afk.Store(tmp_path, key="secret")) as saver:
        for i in range(10):
            _put(saver, f"{i:04d}", i)
    loads = count_loads()
    with AfkLocalSaver(afk.Store(tmp_path, key="secret")) as saver:
        _put(saver, "0010", 10)
    assert loads == []
    with AfkLocalSaver(afk.Store(tmp_path, key="secret")) as fresh:
        found = fresh.get_tuple({"configurable": {"thread_id": "t"}})
    assert found.checkpoint["id"] == "0010"
