"""Runs deleted while they are listed (``afk-local rm`` or gc in another process, or a
thread sharing the Store): a listing skips them, never fails, never calls them damaged."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.errors import RunNotFoundError
from afk_local.storage.rundir.read import loading


def _finished(store: afk.Store, run_id: str) -> None:
    with store.create(run_id) as run:
        run.checkpoint("runtime_state", {"n": 1}, step=1)
        run.finish(1)


@pytest.mark.parametrize("where", ["latest", "load"])
def test_a_run_deleted_while_it_is_read_is_skipped_not_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The run goes just before its newest checkpoint is looked up (``latest``), or
    once it was found and before it is read (``load``): the other runs are listed."""
    store = afk.Store(tmp_path / "s")
    for run_id in ("a", "b", "c"):
        _finished(store, run_id)
    original = getattr(loading.RunLoader, where)

    def deleted_first(self: loading.RunLoader, *args: object) -> object:
        if self.paths.run_id == "b" and self.paths.dir.exists():
            shutil.rmtree(self.paths.dir)
        return original(self, *args)

    monkeypatch.setattr(loading.RunLoader, where, deleted_first)
    listed = afk.Store(tmp_path / "s").runs()
    assert [(i.run_id, i.damage) for i in listed] == [("c", None), ("a", None)]
    monkeypatch.undo()
    with pytest.raises(RunNotFoundError):
        store.read_meta("b")


def test_threads_sharing_a_store_list_while_runs_come_and_go(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = afk.Store(root)
    keep = {f"keep-{n:04d}" for n in range(40)}
    for run_id in sorted(keep):
        _finished(store, run_id)
    shared = afk.Store(root)
    errors: list[BaseException] = []
    stop = threading.Event()

    def churn() -> None:
        writer = afk.Store(root)
        n = 0
        while not stop.is_set():
            _finished(writer, f"tmp-{n:05d}")
            writer.delete(f"tmp-{n:05d}")
            n += 1

    def lister(kind: str) -> None:
        try:
            for _ in range(50):
                if kind == "sweep":
                    shared.interrupted()
                    continue
                listed = shared.runs() if kind == "runs" else list(shared.iter_runs())
                assert keep <= {i.run_id for i in listed}
                assert [i.run_id for i in listed if i.damage is not None] == []
        except BaseException as exc:
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch every few bytecodes: more interleavings
    try:
        writer = threading.Thread(target=churn)
        writer.start()
        threads = [threading.Thread(target=lister, args=(k,)) for k in ("runs", "iter", "sweep")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.set()
        writer.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == []
