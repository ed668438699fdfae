"""Resource bounds and hostile files (storage/codec.py, chain.py, fsio.py; docs/security.md).

Every hostile file is crafted with afk_local's own encoder (valid crc), read by the real
command line in a child process with a timeout; where memory is the attack, the child's
peak RSS is measured (a fresh parent's ``RUSAGE_CHILDREN``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgspec
import pytest
from attacks import afk, bomb_frame, checkpoint_file, one_line_error, peak_rss, plant_meta

import afk_local as afk_api
from afk_local.storage.format.records import MAX_NESTING_DEPTH
from afk_local.storage.rundir.read.chain import MAX_READ_CHAIN, DecodeBudgetError

MiB = 1 << 20


def empty_run(root: Path, run_id: str) -> Path:
    plant_meta(root, run_id, entrypoint=None)
    return root / "runs" / run_id


def test_zstd_bomb_costs_at_most_its_bound(tmp_path: Path) -> None:
    """A 20 KB file declaring 256 MiB (the default bound) of zeros; and one declaring 1 GiB."""
    path = empty_run(tmp_path, "bomb") / "000000000001.runtime_state.ckpt"
    path.write_bytes(bomb_frame(1 << 30, complete=False))
    baseline, code, err = peak_rss(tmp_path, "inspect", "bomb", "1")
    assert code == 2 and "over max_record_bytes=268435456" in err, err  # refused unread
    path.write_bytes(bomb_frame(256 * MiB))
    assert path.stat().st_size < 64 << 10
    peak, code, err = peak_rss(tmp_path, "inspect", "bomb", "1")
    assert code == 2 and "record does not decode" in err, err  # zeros are not a record
    assert 200 * MiB < peak - baseline <= 1.2 * 256 * MiB, (peak, baseline)


def deep(levels: int) -> bytes:
    return b"\x91" * levels + b"\x00"


def test_deep_nesting_is_damage_not_a_crash(tmp_path: Path) -> None:
    run_dir = empty_run(tmp_path, "deep")
    checkpoint_file(run_dir, 1, deep(100_000))  # ~100 KB of nested one-element lists
    res = afk(tmp_path, "inspect", "deep", "1")
    assert res.returncode == 2 and "nests deeper than Python can decode" in one_line_error(res)
    res = afk(tmp_path, "verify")
    assert res.returncode == 1 and "nests deeper" in res.stdout, res.stdout


def test_too_deep_to_read_back_is_refused_at_write_time(tmp_path: Path) -> None:
    store = afk_api.Store(tmp_path)
    ok: object = 0
    for _ in range(MAX_NESTING_DEPTH - 2):  # the record is level 1, its payload level 2
        ok = [ok]
    too_deep: object = ok
    for _ in range(10):
        too_deep = [too_deep]
    with store.create("r") as run:
        run.checkpoint("runtime_state", ok, step=1)
        with pytest.raises(afk_api.RecordTooDeepError, match="deeper than 256 levels"):
            run.checkpoint("runtime_state", too_deep, step=2)
        with pytest.raises(afk_api.RecordTooDeepError):
            run.update_meta(extra={"deep": too_deep})  # run.meta is checked in its bytes
        with pytest.raises(TypeError, match="deeper than 256"):
            run.effects.call("deep", lambda: too_deep)  # its outcome is never acknowledged
        assert run.seq == 1
    assert [f.seq for f in store.open("r").checkpoint_files()] == [1]
    res = afk(tmp_path, "inspect", "r", "--json")  # what was written, the CLI reads back
    assert res.returncode == 0, res.stderr


def chain_run(root: Path, run_id: str, n: int, *, bad_records: bool) -> Path:
    """``n`` checkpoints, each a delta on the one before; with ``bad_records`` every record
    names another run, so each fails *after* its whole chain was decoded."""
    run_dir = empty_run(root, run_id)
    base = None
    for seq in range(1, n + 1):
        raw = checkpoint_file(
            run_dir,
            seq,
            msgspec.msgpack.encode({"i": seq}),
            base=base,
            run_id="someone-else" if bad_records else None,
        )
        base = (seq, raw)
    return run_dir


def test_falling_back_through_a_bad_chain_is_linear(tmp_path: Path) -> None:
    """A 400-deep delta chain of records that all fail: latest() falls back from the newest
    to the oldest. Without a budget that re-decodes chain after chain (~80k frames)."""
    n = 400
    chain_run(tmp_path, "chain", n, bad_records=True)
    reader = afk_api.Store(tmp_path).open("chain")
    with pytest.raises(DecodeBudgetError, match="budget"):
        reader.latest()
    assert reader._chain.frames_decoded <= 2 * MAX_READ_CHAIN + 4 * n
    res = afk(tmp_path, "verify", "chain")
    assert res.returncode == 1 and "does not match its file name and run" in res.stdout


def test_a_chain_longer_than_the_read_cap_is_refused_cheaply(tmp_path: Path) -> None:
    chain_run(tmp_path, "long", MAX_READ_CHAIN + 5, bad_records=False)
    reader = afk_api.Store(tmp_path).open("long")
    newest = reader.checkpoint_files()[-1]
    with pytest.raises(afk_api.CheckpointCorruptionError, match="delta chain longer than 1024"):
        reader.load(newest)
    assert reader._chain.frames_decoded == 0  # refused from the headers alone
    assert reader.load(reader.checkpoint_files()[MAX_READ_CHAIN - 2]).seq == MAX_READ_CHAIN - 1


def test_newer_schema_version_is_reported_for_that_run(tmp_path: Path) -> None:
    store = afk_api.Store(tmp_path)
    with store.create("fine") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    plant_meta(tmp_path, "future-meta", entrypoint=None, schema_version=99)
    checkpoint_file(empty_run(tmp_path, "future-ckpt"), 1, schema_version=99)
    res = afk(tmp_path, "verify", "--json")
    assert res.returncode == 1, res.stderr
    runs = {r["run_id"]: r for r in msgspec.json.decode(res.stdout)["runs"]}
    assert runs["fine"]["problems"] == []
    for run_id in ("future-meta", "future-ckpt"):
        (problem,) = runs[run_id]["problems"]
        assert "schema version 99" in problem["reason"] and "upgrade" in problem["reason"]


FIFO_NAMES = ["run.meta", "000000000001.runtime_state.ckpt", "latest", "effects.log"]


def test_a_fifo_where_a_file_belongs_never_blocks(tmp_path: Path) -> None:
    """One run per file a FIFO replaces; before, opening run.meta, latest or effects.log
    blocked the reader (``runs``, ``verify``, the watcher) forever."""
    store = afk_api.Store(tmp_path)
    for i, name in enumerate(FIFO_NAMES):
        with store.create(f"r{i}") as run:
            run.checkpoint("runtime_state", {"i": 1}, step=1)
            run.effects.call("k", lambda: 1)
        path = store.paths(f"r{i}").dir / name
        path.unlink()
        os.mkfifo(path, 0o600)
    assert afk(tmp_path, "runs", timeout=30).returncode == 0  # blocking would time out
    res = afk(tmp_path, "verify", "--json", timeout=30)
    assert res.returncode == 1, res
    runs = {r["run_id"]: r for r in msgspec.json.decode(res.stdout)["runs"]}
    for i, name in enumerate(FIFO_NAMES):
        reasons = [p["reason"] for p in runs[f"r{i}"]["problems"]]
        assert any("FIFO" in reason for reason in reasons), (name, reasons)


def test_a_stale_temp_directory_never_blocks_reopening(tmp_path: Path) -> None:
    store = afk_api.Store(tmp_path)
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    stale = store.paths("r").dir / ".tmp-000000000002.runtime_state.ckpt.123.abcd"
    (stale / "inner").mkdir(parents=True)
    os.symlink("/", stale / "inner" / "root")  # removing it never follows this
    with store.resume_writer("r") as run:
        run.checkpoint("runtime_state", {"i": 2}, step=2)
    assert not stale.exists() and Path("/").exists()


def test_threads_sharing_a_writer_never_duplicate_or_lose_a_checkpoint(
    tmp_path: Path, trials
) -> None:
    store = afk_api.Store(tmp_path)
    threads, each = 6, trials(25, 200)
    with store.create("r") as run:
        start = threading.Barrier(threads)

        def write(t: int) -> None:
            start.wait()
            for i in range(each):
                run.checkpoint("runtime_state", {"t": t, "i": i}, step=i)

        workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert run.seq == threads * each
    reader = store.open("r")
    history = reader.history()
    assert [c.seq for c in history] == list(range(1, threads * each + 1))
    assert sorted((c.payload["t"], c.payload["i"]) for c in history) == [
        (t, i) for t in range(threads) for i in range(each)
    ]
    assert reader.verify().ok


def test_appending_to_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """The watcher appends attempt logs: a FIFO there must be refused, not written into."""
    from afk_local.storage import fsio  # noqa: PLC0415

    fifo = tmp_path / "attempt-1.log"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(fsio.NotRegularFileError, match="FIFO"):
        fsio.open_append(fifo)
    os.symlink(tmp_path / "elsewhere", tmp_path / "attempt-2.log")
    with pytest.raises(OSError, match="symlink"):
        fsio.open_append(tmp_path / "attempt-2.log")
    assert not (tmp_path / "elsewhere").exists()
