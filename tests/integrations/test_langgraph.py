"""AfkLocalSaver: LangGraph's published conformance suite, real graphs, and the files on disk.

Skipped as a whole when LangGraph is not installed (``pip install 'afk_local[test-all]'``
installs it), so the core suite runs without the extra.
"""

from __future__ import annotations

import asyncio
import operator
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import pytest
from proc import REPO

import afk_local as afk
from afk_local.storage import fsio
from afk_local.storage.format.layout import scan_checkpoints
from afk_local.storage.ops.retention import read_file_facts

if TYPE_CHECKING:
    from afk_local.integrations.langgraph import AfkLocalSaver


@pytest.fixture(autouse=True)
def _needs_langgraph() -> None:
    """The tests need langgraph: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "langgraph", reason="LangGraph not installed: pip install 'afk_local[test-all]'"
    )


ALL8 = {
    "put",
    "put_writes",
    "get_tuple",
    "list",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
}


# -- the published conformance suite ---------------------------------------------


def _conformance_factory(conformance: Any, root: Path) -> Any:
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    counter = iter(range(1000))

    @conformance.checkpointer_test(name="AfkLocalSaver")
    async def afk_saver():  # called once per capability: a fresh store each time
        saver = AfkLocalSaver(root / f"store-{next(counter)}")
        try:
            yield saver
        finally:
            saver.close()

    return afk_saver


def test_conformance_suite_passes_all_eight_capabilities(tmp_path, capsys):
    conformance = pytest.importorskip(
        "langgraph.checkpoint.conformance",
        reason="langgraph-checkpoint-conformance not installed: pip install 'afk_local[test-all]'",
    )
    from langgraph.checkpoint.conformance.report import ProgressCallbacks  # noqa: PLC0415

    factory = _conformance_factory(conformance, tmp_path)
    report = asyncio.run(conformance.validate(factory, progress=ProgressCallbacks.verbose()))
    with capsys.disabled():  # show the report in the test output, like `pytest -s`
        report.print_report()
    detected = {name for name, result in report.results.items() if result.detected}
    assert detected == ALL8, f"not detected: {ALL8 - detected}"
    # passed_all() ignores capabilities it did not detect: check each of the 8 by name.
    failed = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert not failed, failed
    assert report.passed_all()


# -- real graphs --------------------------------------------------------------------


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


def _build(saver: AfkLocalSaver, *, ask: bool = True) -> Any:
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415
    from langgraph.types import interrupt  # noqa: PLC0415

    sub = StateGraph(State)
    sub.add_node("inner", lambda s: {"log": ["inner"], "n": s["n"] + 1})
    sub.add_edge(START, "inner")

    graph = StateGraph(State)
    graph.add_node("a", lambda s: {"log": ["a"], "n": s["n"] + 1})
    graph.add_node("b1", lambda s: {"log": ["b1"]})  # b1 and b2 run in parallel
    graph.add_node("b2", lambda s: {"log": ["b2"]})
    graph.add_node("sub", sub.compile())  # checkpoints under namespace "sub:<task id>"

    def question(state: State) -> dict[str, Any]:
        answer = interrupt("continue?")
        return {"log": [f"ask:{answer}"]}

    graph.add_node("ask", question)
    graph.add_edge(START, "a")
    graph.add_edge("a", "b1")
    graph.add_edge("a", "b2")
    graph.add_edge(["b1", "b2"], "sub")
    if ask:
        graph.add_edge("sub", "ask")
        graph.add_edge("ask", END)
    else:
        graph.add_edge("sub", END)
    return graph.compile(checkpointer=saver)


def _reference_result(answer: str) -> dict[str, Any]:
    """The same graph on LangGraph's InMemorySaver, without any restart."""
    from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415
    from langgraph.types import Command  # noqa: PLC0415

    graph = _build(InMemorySaver())
    config = {"configurable": {"thread_id": "reference"}}
    graph.invoke({"log": [], "n": 0}, config)
    return graph.invoke(Command(resume=answer), config)


def test_graph_interrupt_then_resume_from_a_new_saver(tmp_path):
    from langgraph.types import Command  # noqa: PLC0415

    from afk_local.integrations.langgraph import PHASE, WRITES_NAME, AfkLocalSaver, thread_run_id  # noqa: PLC0415

    config = {"configurable": {"thread_id": "t/1:x ü"}}  # unsafe characters on purpose
    with AfkLocalSaver.from_path(tmp_path) as saver:
        out = _build(saver).invoke({"log": [], "n": 0}, config, durability="sync")
        assert "__interrupt__" in out
    with AfkLocalSaver.from_path(tmp_path) as saver:
        graph = _build(saver)
        out = graph.invoke(Command(resume="yes"), config, durability="sync")
        assert out == _reference_result("yes")
        history = list(graph.get_state_history(config))
        ids = [h.config["configurable"]["checkpoint_id"] for h in history]
        assert len(ids) >= 5
        assert ids == sorted(ids, reverse=True)
        graph.update_state(config, {"log": ["manual"]})
        assert graph.get_state(config).values["log"][-1] == "manual"

    run_id = thread_run_id("t/1:x ü")
    store = afk.Store(tmp_path)
    meta = store.read_meta(run_id)
    assert meta.thread_id == "t/1:x ü"
    assert meta.status is afk.RunStatus.PAUSED  # idle: nobody holds it, nothing to resume
    assert not store.interrupted()
    reader = store.open(run_id)
    assert reader.verify().ok
    phases = {f.phase for f in reader.checkpoint_files()}
    assert phases == {PHASE}
    assert (reader.paths.dir / WRITES_NAME).is_file()


def test_subgraph_namespaces_are_listed_apart(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    config = {"configurable": {"thread_id": "ns"}}
    with AfkLocalSaver(tmp_path) as saver:
        _build(saver, ask=False).invoke({"log": [], "n": 0}, config, durability="sync")
        everything = list(saver.list(config))
        root_only = list(saver.list({"configurable": {"thread_id": "ns", "checkpoint_ns": ""}}))
        namespaces = {t.config["configurable"]["checkpoint_ns"] for t in everything}
        assert "" in namespaces
        assert any(ns.startswith("sub:") for ns in namespaces)
        assert 0 < len(root_only) < len(everything)
        ids = [t.config["configurable"]["checkpoint_id"] for t in everything]
        assert ids == sorted(ids, reverse=True)
        assert len(list(saver.list(None))) == len(everything)
        two = list(saver.list(config, filter={"source": "loop"}, limit=2))
        assert len(two) == 2
        assert all(t.metadata["source"] == "loop" for t in two)


def test_async_graph(tmp_path):
    from langgraph.types import Command  # noqa: PLC0415

    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    async def scenario() -> None:
        async with AfkLocalSaver(tmp_path) as saver:
            graph = _build(saver)
            config = {"configurable": {"thread_id": "async-1"}}
            await graph.ainvoke({"log": [], "n": 0}, config, durability="sync")
            out = await graph.ainvoke(Command(resume="ok"), config, durability="sync")
            assert out["log"][-1] == "ask:ok"
            assert [h async for h in graph.aget_state_history(config)]

    asyncio.run(scenario())


# -- the saver's own contract -------------------------------------------------------


def _checkpoint(cid: str, values: dict[str, Any]) -> dict[str, Any]:
    return {
        "v": 1,
        "id": cid,
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": values,
        "channel_versions": {k: 1 for k in values},
        "versions_seen": {},
        "updated_channels": None,
    }


def _put(saver: AfkLocalSaver, thread: str, cid: str, parent: str | None, **values: Any):
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent:
        conf["checkpoint_id"] = parent
    return saver.put(
        {"configurable": conf}, _checkpoint(cid, values), {"source": "loop", "step": 0}, {}
    )


def test_concurrent_put_writes_from_threads(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        config = _put(saver, "t", "0001", None, x=1)

        def task(i: int) -> None:
            saver.put_writes(config, [("ch", i), ("other", -i)], f"task-{i:02d}")

        workers = [threading.Thread(target=task, args=(i,)) for i in range(16)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        pending = saver.get_tuple(config).pending_writes
    assert len(pending) == 32
    assert {(t, c, v) for t, c, v in pending if c == "ch"} == {
        (f"task-{i:02d}", "ch", i) for i in range(16)
    }
    with AfkLocalSaver(tmp_path) as reopened:  # and all of it is on disk
        assert len(reopened.get_tuple(config).pending_writes) == 32


def test_get_next_version_accepts_int_and_str(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    saver = AfkLocalSaver(tmp_path)
    first = saver.get_next_version(None, None)
    assert first.startswith("0" * 31 + "1.")
    assert saver.get_next_version(first, None).startswith("0" * 31 + "2.")
    assert saver.get_next_version(7, None).startswith("0" * 31 + "8.")


def test_pickled_values_are_refused(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    class PickleSerde:
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return ("pickle", b"\x80\x04N.")

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return None

    with AfkLocalSaver(tmp_path, serde=PickleSerde()) as writer:
        _put(writer, "t", "0001", None, x=1)
    with AfkLocalSaver(tmp_path) as reader, pytest.raises(ValueError, match="pickle"):
        reader.get_tuple({"configurable": {"thread_id": "t"}})


def test_unknown_prune_strategy_raises(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver, pytest.raises(ValueError, match="strategy"):
        saver.prune(["t"], strategy="keep_oldest")


def test_second_saver_on_a_thread_in_use_is_refused(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as first:
        _put(first, "t", "0001", None, x=1)
        with AfkLocalSaver(tmp_path) as second:
            assert second.get_tuple({"configurable": {"thread_id": "t"}}) is not None  # reads
            with pytest.raises(afk.RunLockedError):
                _put(second, "t", "0002", "0001", x=2)


def test_growing_thread_is_delta_compressed_and_prune_keeps_a_decodable_latest(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    messages: list[str] = []
    with AfkLocalSaver(tmp_path) as saver:
        parent = None
        for i in range(40):
            messages.append(f"message {i}: " + "lorem ipsum dolor sit amet " * 20)
            cid = f"{i:04d}"
            _put(saver, "chat", cid, parent, messages=list(messages))
            parent = cid
        run_dir = afk.Store(tmp_path).paths(thread_run_id("chat")).dir
        sizes = [p.stat().st_size for p in sorted(run_dir.glob("*.ckpt"))]
        raw_last = len(("".join(messages)).encode())
        assert sizes[-1] < raw_last / 20  # the newest file is a small delta
        saver.prune(["chat"])
        (kept,) = list(saver.list({"configurable": {"thread_id": "chat"}}))
        assert kept.checkpoint["channel_values"]["messages"] == messages
        assert len(list(run_dir.glob("*.ckpt"))) == 1
    assert afk.Store(tmp_path).open(thread_run_id("chat")).verify().ok


@pytest.mark.parametrize("key", [None, "secret"])
def test_prune_deletes_each_delta_durably_before_its_base(tmp_path, key):
    """Unlinks under one directory fsync may persist in any order: a crash could keep a
    delta and lose its base (keyed: its signed predecessor). Same rule as gc's compaction,
    found by the crash-state explorer (afk_local.testing.crashsim)."""
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    with AfkLocalSaver(afk.Store(tmp_path, key=key)) as saver:
        parent = None
        for i in range(12):
            cid = f"{i:04d}"
            _put(saver, "chat", cid, parent, messages=[f"message {j} " * 30 for j in range(i)])
            parent = cid
        run_dir = afk.Store(tmp_path).paths(thread_run_id("chat")).dir
        facts = {f.name: f for f in read_file_facts(run_dir, scan_checkpoints(run_dir))}
        by_seq = {f.seq: f for f in facts.values()}
        calls: list[tuple[str, str]] = []
        previous = fsio.set_io_hook(lambda op, path: calls.append((op, path)))
        try:
            saver.prune(["chat"])
        finally:
            fsio.set_io_hook(previous)
    unlinked = {os.path.basename(p): i for i, (op, p) in enumerate(calls) if op == "unlink"}
    syncs = [
        i
        for i, (op, p) in enumerate(calls)
        if op == "fsync" and os.path.normpath(p) == os.path.normpath(run_dir)
    ]
    pairs = 0
    for name, at in unlinked.items():
        if name not in facts:
            continue
        for seq in [facts[name].base_seq] + ([facts[name].seq - 1] if key else []):
            if seq in by_seq and by_seq[seq].name in unlinked:
                pairs += 1
                assert any(at < s < unlinked[by_seq[seq].name] for s in syncs), (name, seq)
    assert pairs >= 5
    assert afk.Store(tmp_path, key=key).open(thread_run_id("chat")).verify().ok


def test_delete_for_runs_keeps_other_checkpoints_decodable(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        parent = None
        for i in range(10):
            conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": ""}
            if parent:
                conf["checkpoint_id"] = parent
            cid = f"{i:04d}"
            saver.put(
                {"configurable": conf},
                _checkpoint(cid, {"x": "y" * 500 + str(i)}),
                {"source": "loop", "step": i, "run_id": "odd" if i % 2 else "even"},
                {},
            )
            parent = cid
        saver.delete_for_runs(["odd"])
        left = list(saver.list({"configurable": {"thread_id": "t"}}))
        assert [t.config["configurable"]["checkpoint_id"] for t in left] == [
            f"{i:04d}" for i in (8, 6, 4, 2, 0)
        ]
        assert [t.checkpoint["channel_values"]["x"][-1] for t in left] == list("86420")


def test_a_packed_thread_reads_the_same_and_a_new_process_decodes_one_file(tmp_path, count_loads):
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    latest = {"configurable": {"thread_id": "t"}}
    with AfkLocalSaver(afk.Store(tmp_path, pack_loose_limit=6)) as saver:
        parent = None
        for i in range(40):
            _put(saver, "t", f"{i:04d}", parent, x=i, text="words " * i)
            parent = f"{i:04d}"
            if i % 7 == 0:
                saver.put_writes(
                    {"configurable": {"thread_id": "t", "checkpoint_id": parent}},
                    [("ch", i)],
                    f"task-{i}",
                )
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(latest)]
        assert listed == [f"{i:04d}" for i in reversed(range(40))]
    run_dir = afk.Store(tmp_path).paths(thread_run_id("t")).dir
    assert any(p.suffix == ".pack" for p in run_dir.iterdir())
    assert len(scan_checkpoints(run_dir)) <= 12
    loads = count_loads()
    with AfkLocalSaver(tmp_path) as fresh:
        assert fresh.get_tuple(latest).checkpoint["channel_values"]["x"] == 39
        assert len(loads) == 1  # ids came from the trusted cache: no other file decoded
        packed = {"configurable": {"thread_id": "t", "checkpoint_id": "0007"}}
        found = fresh.get_tuple(packed)
        assert found.checkpoint["channel_values"]["x"] == 7
        assert found.pending_writes == [("task-7", "ch", 7)]
        fresh.prune(["t"])  # deletes packed checkpoints: packs are rewritten without them
        assert [t.checkpoint["channel_values"]["x"] for t in fresh.list(latest)] == [39]
    assert afk.Store(tmp_path).open(thread_run_id("t")).verify().ok


def test_a_reused_name_is_never_taken_for_its_old_content(tmp_path):
    """delete_for_runs deletes the newest checkpoint; the next put reuses its name, and a
    crash loses that put's (unsynced) cache entry: the durable tombstone keeps a new
    process from trusting the old entry of that name."""
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        parent = None
        for i in range(5):
            conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": ""}
            if parent:
                conf["checkpoint_id"] = parent
            saver.put(
                {"configurable": conf},
                _checkpoint(f"{i:04d}", {"x": i}),
                {"source": "loop", "step": i, "run_id": "doomed" if i == 4 else "kept"},
                {},
            )
            parent = f"{i:04d}"
        saver.delete_for_runs(["doomed"])
        cache = afk.Store(tmp_path).paths(thread_run_id("t")).dir / "langgraph.index"
        size = cache.stat().st_size
        _put(saver, "t", "0099", "0003", x=99)  # takes the deleted checkpoint's name
    with open(cache, "r+b") as fh:
        fh.truncate(size)  # the crash: the new entry never reached the disk
    with AfkLocalSaver(tmp_path) as fresh:
        latest = fresh.get_tuple({"configurable": {"thread_id": "t"}})
        assert latest.checkpoint["id"] == "0099"
        listed = [t.checkpoint["id"] for t in fresh.list({"configurable": {"thread_id": "t"}})]
        assert listed == ["0099", "0003", "0002", "0001", "0000"]


def test_torn_writes_tail_is_ignored_then_cut(tmp_path):
    from afk_local.integrations.langgraph import WRITES_NAME, AfkLocalSaver, thread_run_id  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        config = _put(saver, "t", "0001", None, x=1)
        saver.put_writes(config, [("ch", "kept")], "task-1")
    path = afk.Store(tmp_path).paths(thread_run_id("t")).dir / WRITES_NAME
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(good[: len(good) // 2])  # a crash mid-append
    with AfkLocalSaver(tmp_path) as saver:
        assert saver.get_tuple(config).pending_writes == [("task-1", "ch", "kept")]
        saver.put_writes(config, [("ch", "second")], "task-2")
        pending = saver.get_tuple(config).pending_writes
        assert pending == [("task-1", "ch", "kept"), ("task-2", "ch", "second")]
    # Damage followed by good frames is corruption, not a torn tail.
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with AfkLocalSaver(tmp_path) as saver, pytest.raises(afk.CheckpointCorruptionError):
        saver.get_tuple(config)


def test_missing_extra_message():
    code = (
        "import sys; sys.modules['langgraph'] = None\n"
        "try:\n    import afk_local.integrations.langgraph\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'afk_local[langgraph]'" in out.stdout


def test_example_langgraph_resume_runs(tmp_path):
    env = dict(os.environ, AFK_LOCAL_ROOT=str(tmp_path / "store"))
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "langgraph_resume.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "killed" in out.stdout
    assert "resumed" in out.stdout
    assert "matches an uninterrupted run: True" in out.stdout


def test_store_gc_keeps_langgraph_history(tmp_path):
    from afk_local.integrations.langgraph import AfkLocalSaver  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        parent = None
        for i in range(12):
            _put(saver, "kept", f"{i:04d}", parent, x=i)
            parent = f"{i:04d}"
    report = afk.Store(tmp_path).gc()
    assert not report.errors
    with AfkLocalSaver(tmp_path) as saver:
        assert len(list(saver.list({"configurable": {"thread_id": "kept"}}))) == 12


def test_index_cache_spares_a_new_process_from_decoding_every_file(tmp_path, count_loads):
    from afk_local.integrations.langgraph import AfkLocalSaver, thread_run_id  # noqa: PLC0415

    with AfkLocalSaver(tmp_path) as saver:
        parent = None
        for i in range(20):
            _put(saver, "t", f"{i:04d}", parent, x=i)
            parent = f"{i:04d}"
        saver.prune(["other"])  # unknown thread: no-op
    loads = count_loads()
    latest = {"configurable": {"thread_id": "t"}}
    with AfkLocalSaver(tmp_path) as fresh:
        assert fresh.get_tuple(latest).checkpoint["channel_values"] == {"x": 19}
    assert len(loads) == 1  # only the checkpoint returned; ids came from langgraph.index

    # A damaged cache only costs time: every file is decoded instead.
    run_dir = afk.Store(tmp_path).paths(thread_run_id("t")).dir
    (run_dir / "langgraph.index").write_bytes(b"\x00garbage" * 10)
    loads.clear()
    with AfkLocalSaver(tmp_path) as fresh:
        assert fresh.get_tuple(latest).checkpoint["channel_values"] == {"x": 19}
        assert len(list(fresh.list(latest))) == 20
        fresh.prune(["t"])  # rewrites the latest file as a keyframe: its cache entry goes stale
    assert len(loads) > 20
    with AfkLocalSaver(tmp_path) as fresh:
        (only,) = list(fresh.list(latest))
        assert only.checkpoint["channel_values"] == {"x": 19}
        _put(fresh, "t", "0020", "0019", x=20)
        assert fresh.get_tuple(latest).checkpoint["channel_values"] == {"x": 20}
