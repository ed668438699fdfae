"""map_durable on a real Dask LocalCluster of worker processes, with a worker SIGKILLed mid-run.

The jobs (tests/support/fanout_jobs.py) count what really ran in side-channel
files: one line per execution of the job's body, one per execution of the
journaled step. The store's own records say which attempt each run is on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fanout_jobs import expected, lines, pair, tally

import afk_local as afk
from afk_local.cli.main import main as cli_main
from afk_local.integrations.fanout import TARGET_TASK_S, FanOutError

# Checked without importing Dask: every xdist worker collects this module, and
# only the one that runs it should pay for the import.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None, reason="needs the dask extra"
)


@pytest.fixture(scope="module")
def client():
    """Two worker processes (one thread each) on loopback, shared by this module; always closed."""
    import distributed  # noqa: PLC0415 - only where the cluster starts

    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def items_for(tmp_path, count, **special):
    out = tmp_path / "side"
    out.mkdir(exist_ok=True)
    items = [{"name": f"i{k}", "n": k + 1, "steps": 4, "dir": str(out)} for k in range(count)]
    for index, flags in special.items():
        items[int(index.removeprefix("i"))].update(flags)
    return out, items


def worker_pids(client) -> dict[str, int]:
    """Worker address -> pid, from the scheduler (never asks a worker, which may be dead)."""
    info = client.scheduler_info()["workers"]
    pids = {addr: w.get("pid") for addr, w in info.items()}
    if all(isinstance(p, int) for p in pids.values()):
        return pids
    # Newer distributed keeps the pid on the scheduler's WorkerState but not in its identity.
    return client.run_on_scheduler(
        lambda dask_scheduler: {a: ws.pid for a, ws in dask_scheduler.workers.items()}
    )


def wait_for(path, limit_s=60.0):
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def test_worker_killed_mid_run_resumes_elsewhere_with_effects_once(client, tmp_path, capsys):
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 6, i0={"hold": True})
    victim = "fanout-tally-000000"
    with ThreadPoolExecutor(1) as pool:
        mapped = pool.submit(map_durable_quiet, tally, items, store=root, client=client)
        job_pid = int(wait_for(out / "i0.pid"))
        # the worker processing the victim's task, and its pid, as the scheduler knows them
        busy = [a for a, keys in client.processing().items() if any(victim in k for k in keys)]
        assert len(busy) == 1
        assert worker_pids(client)[busy[0]] == job_pid
        os.kill(job_pid, signal.SIGKILL)
        results = mapped.result(timeout=120)

    assert results == [expected(item) for item in items]
    store = afk.Store(root)
    for k, item in enumerate(items):
        # every journaled effect happened exactly once, across the kill
        assert lines(out / f"{item['name']}.effects") == [str(i) for i in range(item["steps"])]
        meta = store.read_meta(f"fanout-tally-{k:06d}")
        assert meta.status is afk.RunStatus.COMPLETED
    # the victim visibly resumed: its second attempt ran in another process
    calls = [line.split() for line in lines(out / "i0.calls")]
    assert [c[0] for c in calls] == ["1", "2"]
    assert int(calls[0][1]) == job_pid != int(calls[1][1])
    assert store.read_meta(victim).attempt == 2

    # called again: every run had completed, so the stored results come back and
    # no job body runs (the calls files do not grow)
    before = {p.name: p.read_text() for p in out.glob("*.calls")}
    assert map_durable_quiet(tally, items, store=root, client=client) == results
    assert {p.name: p.read_text() for p in out.glob("*.calls")} == before
    # `afk-local runs` lists the fan-out's runs, the victim on its second attempt
    capsys.readouterr()
    assert cli_main(["runs", "--root", str(root), "--json"]) == 0
    listed = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(listed) == [f"fanout-tally-{k:06d}" for k in range(6)]
    assert {r["status"] for r in listed.values()} == {"completed"}
    assert listed[victim]["attempt"] == 2


def test_failed_run_raises_with_its_run_id_and_the_rest_complete(client, tmp_path):
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 3, i1={"fail": True})
    with pytest.raises(FanOutError) as raised:
        map_durable_quiet(tally, items, store=root, client=client, run_id=lambda it: it["name"])
    assert list(raised.value.failures) == ["i1"]
    assert "ValueError: item i1 is broken" in str(raised.value)
    store = afk.Store(root)
    assert store.read_meta("i1").status is afk.RunStatus.FAILED
    assert [store.read_meta(r).status for r in ("i0", "i2")] == [afk.RunStatus.COMPLETED] * 2
    assert map_durable_quiet(tally, [], store=root, client=client) == []

    # with retries, Dask re-runs the task: the failed run resumes (attempt 2) and its
    # finished step is replayed, not repeated
    with pytest.raises(FanOutError):
        map_durable_quiet(
            tally, items, store=root, client=client, run_id=lambda it: it["name"], retries=1
        )
    assert store.read_meta("i1").attempt == 3
    assert lines(out / "i1.effects") == ["0"]
    assert [line.split()[0] for line in lines(out / "i1.calls")] == ["1", "2", "3"]


def map_durable_quiet(*args, **kwargs):
    from afk_local.integrations.dask import map_durable  # noqa: PLC0415 - imports Dask

    return map_durable(*args, progress=False, **kwargs)


def test_no_shared_filesystem_a_killed_workers_run_is_taken_from_the_remote(client, tmp_path):
    """MirroredWorkers: each worker process its own local store, one file:// remote between.

    The replacement worker process has an empty local store: it can only continue the
    victim's run by taking it from the remote, and no effect may run twice.
    """
    remote = pytest.importorskip("afk_local.integrations.remote")
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = remote.file_url(bucket)
    site = remote.MirroredWorkers(url)  # per-process local roots under the temp dir
    out, items = items_for(tmp_path, 4, i0={"hold": True})
    victim = "fanout-tally-000000"
    try:
        with ThreadPoolExecutor(1) as pool:
            mapped = pool.submit(map_durable_quiet, tally, items, store=site, client=client)
            job_pid = int(wait_for(out / "i0.pid"))
            os.kill(job_pid, signal.SIGKILL)
            results = mapped.result(timeout=120)
        assert results == [expected(item) for item in items]
        for item in items:  # every journaled effect exactly once, across the kill
            assert lines(out / f"{item['name']}.effects") == [str(i) for i in range(item["steps"])]
        calls = [line.split() for line in lines(out / "i0.calls")]
        assert [c[0] for c in calls] == ["1", "2"]
        assert int(calls[0][1]) == job_pid != int(calls[1][1])
        # what the remote holds: every run completed, the victim taken once (epoch 2)
        # and continued as its second attempt
        reader = afk.Store(tmp_path / "client")
        for k in range(len(items)):
            report = remote.pull_run(reader, url, f"fanout-tally-{k:06d}")
            assert report.epoch == (2 if k == 0 else 1)
            assert reader.read_meta(f"fanout-tally-{k:06d}").status is afk.RunStatus.COMPLETED
        assert reader.read_meta(victim).attempt == 2
    finally:
        workers = Path(tempfile.gettempdir(), "afk-local-workers")
        for pid in [job_pid, *worker_pids(client).values()]:
            shutil.rmtree(workers / f"{socket.gethostname()}-{pid}", ignore_errors=True)


def test_items_per_task_runs_a_chunk_at_once_and_a_killed_chunk_resumes(client, tmp_path):
    """items_per_task=3: two tasks of three runs each, every run on its own thread. The
    worker running the chunk with the held item is SIGKILLed once the chunk's other runs
    completed: Dask re-runs the chunk, the held run resumes (attempt 2) and the completed
    ones return their stored results without running again."""
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 6, i0={"hold": True})
    ids = [f"fanout-tally-{k:06d}" for k in range(6)]
    store = afk.Store(root)
    with ThreadPoolExecutor(1) as pool:
        mapped = pool.submit(
            map_durable_quiet, tally, items, store=root, client=client, items_per_task=3
        )
        job_pid = int(wait_for(out / "i0.pid"))
        deadline = time.monotonic() + 60
        while not all(
            store.exists(r) and store.read_meta(r).status is afk.RunStatus.COMPLETED
            for r in ids[1:3]
        ):
            assert time.monotonic() < deadline, "the chunk's other runs never completed"
            time.sleep(0.05)
        os.kill(job_pid, signal.SIGKILL)
        results = mapped.result(timeout=120)

    assert results == [expected(item) for item in items]
    for k, item in enumerate(items):
        assert lines(out / f"{item['name']}.effects") == [str(i) for i in range(item["steps"])]
        assert store.read_meta(ids[k]).status is afk.RunStatus.COMPLETED
    calls = [line.split() for line in lines(out / "i0.calls")]
    assert [c[0] for c in calls] == ["1", "2"] and int(calls[1][1]) != job_pid
    for name in ("i1", "i2"):  # completed before the kill: not run again by the re-run task
        assert [c.split()[0] for c in lines(out / f"{name}.calls")] == ["1"]


def test_items_per_task_names_each_failed_run_and_retries_inside_the_task(client, tmp_path):
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 5, i1={"fail": True})
    with pytest.raises(FanOutError) as raised:
        map_durable_quiet(
            tally,
            items,
            store=root,
            client=client,
            run_id=lambda it: it["name"],
            items_per_task=2,
            retries=1,
        )
    assert list(raised.value.failures) == ["i1"]
    assert "ValueError: item i1 is broken" in str(raised.value)
    store = afk.Store(root)
    assert [store.read_meta(f"i{k}").status for k in (0, 2, 3, 4)] == [afk.RunStatus.COMPLETED] * 4
    assert store.read_meta("i1").attempt == 2  # retried once, in the task, resumed
    assert lines(out / "i1.effects") == ["0"]  # its finished step replayed, not repeated
    with pytest.raises(ValueError, match="items_per_task"):
        map_durable_quiet(tally, items, store=root, client=client, items_per_task=0)


def chunking(caplog) -> list[int]:
    """The task sizes the default chunking chose, from map_durable's debug line."""
    found = re.findall(r"(\d+) runs in (\d+) tasks of (\d+)-(\d+) items", caplog.text)
    assert len(found) == 1, caplog.text
    runs, tasks, smallest, largest = map(int, found[0])
    return [runs, tasks, smallest, largest]


def test_default_chunks_many_cheap_items_with_the_results_and_run_ids_of_one_per_task(
    client, tmp_path, caplog
):
    """No items_per_task: 80 cheap runs go out in fewer, larger tasks once the first ones
    showed the items are cheap; the results and run ids are those of items_per_task=1."""
    caplog.set_level(logging.DEBUG, logger="afk_local")
    items = list(range(80))
    chunked = map_durable_quiet(pair, items, store=tmp_path / "default", client=client)
    runs, tasks, smallest, largest = chunking(caplog)
    assert runs == 80 and smallest == 1 and largest > 1 and tasks < 80
    single = map_durable_quiet(
        pair, items, store=tmp_path / "single", client=client, items_per_task=1
    )
    assert chunked == single == [[x, x * x] for x in items]
    listed = [
        sorted(r.run_id for r in afk.Store(tmp_path / name).runs())
        for name in ("default", "single")
    ]
    assert listed[0] == listed[1] == [f"fanout-pair-{k:06d}" for k in items]


def test_default_runs_few_or_expensive_items_one_per_task(client, tmp_path, caplog):
    """Four items (two per worker thread), and six that each take TARGET_TASK_S: one per task."""
    client.wait_for_workers(2, timeout=60)  # one killed by an earlier test may be coming back
    caplog.set_level(logging.DEBUG, logger="afk_local")
    assert map_durable_quiet(pair, range(4), store=tmp_path / "few", client=client) == [
        [x, x * x] for x in range(4)
    ]
    assert chunking(caplog) == [4, 4, 1, 1]
    caplog.clear()
    _, items = items_for(tmp_path, 6)
    for item in items:
        item.update(steps=1, sleep_s=TARGET_TASK_S)
    results = map_durable_quiet(tally, items, store=tmp_path / "slow", client=client)
    assert results == [expected(item) for item in items]
    assert chunking(caplog) == [6, 6, 1, 1]
