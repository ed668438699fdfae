"""map_durable on a real local Ray cluster (2 CPUs), with a worker process SIGKILLed mid-task.

The jobs (tests/support/fanout_jobs.py) count what really ran in side-channel
files: one line per execution of the job's body, one per execution of the
journaled step. The store's own records say which attempt each run is on.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fanout_jobs import expected, lines, pair, tally

import afk_local as afk
from afk_local.integrations.fanout import TARGET_TASK_S, FanOutError

# Checked without importing Ray: every xdist worker collects this module, and
# only the one that runs it should pay for the import.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs the ray extra"
)

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray with 2 CPUs on loopback whose workers import tests/support; always shut down.

    Usage statistics are off: Ray would otherwise report to its home server.
    """
    import ray  # noqa: PLC0415 - only where the cluster starts

    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (SUPPORT, os.environ.get("PYTHONPATH")) if p),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
        yield
    finally:
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def items_for(tmp_path, count, **special):
    out = tmp_path / "side"
    out.mkdir(exist_ok=True)
    items = [{"name": f"i{k}", "n": k + 1, "steps": 4, "dir": str(out)} for k in range(count)]
    for index, flags in special.items():
        items[int(index.removeprefix("i"))].update(flags)
    return out, items


def wait_for(path, limit_s=60.0):
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def test_worker_killed_mid_task_resumes_with_effects_once(ray_cluster, tmp_path):
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 5, i0={"hold": True})
    victim = "fanout-tally-000000"
    with ThreadPoolExecutor(1) as pool:
        mapped = pool.submit(map_durable, tally, items, store=root, progress=False)
        job_pid = int(wait_for(out / "i0.pid"))
        # the process running the victim's task is a Ray worker, not this test
        cmdline = Path(f"/proc/{job_pid}/cmdline").read_bytes()
        assert job_pid != os.getpid() and b"ray::" in cmdline, cmdline
        os.kill(job_pid, signal.SIGKILL)
        results = mapped.result(timeout=120)

    assert results == [expected(item) for item in items]
    store = afk.Store(root)
    for k, item in enumerate(items):
        # every journaled effect happened exactly once, across the kill
        assert lines(out / f"{item['name']}.effects") == [str(i) for i in range(item["steps"])]
        assert store.read_meta(f"fanout-tally-{k:06d}").status is afk.RunStatus.COMPLETED
    # the victim visibly resumed: Ray re-ran its task in another worker process
    calls = [line.split() for line in lines(out / "i0.calls")]
    assert [c[0] for c in calls] == ["1", "2"]
    assert int(calls[0][1]) == job_pid != int(calls[1][1])
    assert store.read_meta(victim).attempt == 2

    # called again: the stored results come back and no job body runs
    before = {p.name: p.read_text() for p in out.glob("*.calls")}
    assert map_durable(tally, items, store=root, progress=False) == results
    assert {p.name: p.read_text() for p in out.glob("*.calls")} == before


def test_failed_run_raises_with_its_run_id(ray_cluster, tmp_path):
    root = tmp_path / "store"
    _, items = items_for(tmp_path, 3, i2={"fail": True})
    with pytest.raises(FanOutError) as raised:
        map_durable(tally, items, store=root, progress=False)
    assert list(raised.value.failures) == ["fanout-tally-000002"]
    assert "ValueError: item i2 is broken" in str(raised.value)
    store = afk.Store(root)
    assert store.read_meta("fanout-tally-000002").status is afk.RunStatus.FAILED
    assert store.read_meta("fanout-tally-000001").status is afk.RunStatus.COMPLETED
    assert map_durable(tally, [], store=root) == []


def map_durable(*args, **kwargs):
    from afk_local.integrations.ray import map_durable  # noqa: PLC0415 - imports Ray

    return map_durable(*args, **kwargs)


def test_items_per_task_runs_a_chunk_at_once_and_a_killed_chunk_resumes(ray_cluster, tmp_path):
    """items_per_task=3: two Ray tasks of three runs each, every run on its own thread. The
    worker process running the chunk with the held item is SIGKILLed once the chunk's other
    runs completed: Ray re-runs the chunk in a new worker, the held run resumes (attempt 2)
    and the completed ones return their stored results without running again."""
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 6, i0={"hold": True})
    ids = [f"fanout-tally-{k:06d}" for k in range(6)]
    store = afk.Store(root)
    with ThreadPoolExecutor(1) as pool:
        mapped = pool.submit(
            map_durable, tally, items, store=root, progress=False, items_per_task=3
        )
        job_pid = int(wait_for(out / "i0.pid"))
        cmdline = Path(f"/proc/{job_pid}/cmdline").read_bytes()
        assert job_pid != os.getpid() and b"ray::" in cmdline, cmdline
        deadline = time.monotonic() + 60
        while not all(
            store.exists(r) and store.read_meta(r).status is afk.RunStatus.COMPLETED
            for r in ids[1:3]
        ):
            assert time.monotonic() < deadline, "the chunk's other runs never completed"
            time.sleep(0.05)
        # the chunk's runs ran in the victim's process, on threads beside the held one
        for name in ("i1", "i2"):
            assert [c.split()[1] for c in lines(out / f"{name}.calls")] == [str(job_pid)]
        os.kill(job_pid, signal.SIGKILL)
        results = mapped.result(timeout=120)

    assert results == [expected(item) for item in items]
    for k, item in enumerate(items):
        # every journaled effect happened exactly once, across the kill
        assert lines(out / f"{item['name']}.effects") == [str(i) for i in range(item["steps"])]
        assert store.read_meta(ids[k]).status is afk.RunStatus.COMPLETED
    calls = [line.split() for line in lines(out / "i0.calls")]
    assert [c[0] for c in calls] == ["1", "2"]
    assert int(calls[0][1]) == job_pid != int(calls[1][1])
    assert store.read_meta(ids[0]).attempt == 2
    for name in ("i1", "i2"):  # completed before the kill: not run again by the re-run task
        assert [c.split()[0] for c in lines(out / f"{name}.calls")] == ["1"]

    # called again: the client reads every stored result back, no job body runs
    before = {p.name: p.read_text() for p in out.glob("*.calls")}
    again = map_durable(tally, items, store=root, progress=False, items_per_task=3)
    assert again == results
    assert {p.name: p.read_text() for p in out.glob("*.calls")} == before


def test_items_per_task_names_each_failed_run_and_retries_inside_the_task(ray_cluster, tmp_path):
    root = tmp_path / "store"
    out, items = items_for(tmp_path, 5, i1={"fail": True})
    with pytest.raises(FanOutError) as raised:
        map_durable(
            tally,
            items,
            store=root,
            progress=False,
            run_id=lambda it: it["name"],
            items_per_task=2,
            retries=1,
        )
    assert list(raised.value.failures) == ["i1"]
    assert "ValueError: item i1 is broken" in str(raised.value)
    store = afk.Store(root)
    assert [store.read_meta(f"i{k}").status for k in (0, 2, 3, 4)] == [afk.RunStatus.COMPLETED] * 4
    assert store.read_meta("i1").status is afk.RunStatus.FAILED
    assert store.read_meta("i1").attempt == 2  # retried once, in the task, resumed
    assert lines(out / "i1.effects") == ["0"]  # its finished step replayed, not repeated
    with pytest.raises(ValueError, match="items_per_task must be at least 1, not 0"):
        map_durable(tally, items, store=root, progress=False, items_per_task=0)


def chunking(caplog) -> list[int]:
    """The task sizes the default chunking chose, from map_durable's debug line."""
    found = re.findall(r"(\d+) runs in (\d+) tasks of (\d+)-(\d+) items", caplog.text)
    assert len(found) == 1, caplog.text
    return [int(x) for x in found[0]]


def test_default_chunks_cheap_items_and_keeps_few_or_expensive_ones_one_per_task(
    ray_cluster, tmp_path, caplog
):
    """No items_per_task: 80 cheap runs go out in fewer, larger tasks, with the results
    and run ids of items_per_task=1; four items, or six taking TARGET_TASK_S each: one per task."""
    caplog.set_level(logging.DEBUG, logger="afk_local")
    items = list(range(80))
    chunked = map_durable(pair, items, store=tmp_path / "default", progress=False)
    runs, tasks, smallest, largest = chunking(caplog)
    assert runs == 80 and smallest == 1 and largest > 1 and tasks < 80
    single = map_durable(pair, items, store=tmp_path / "single", progress=False, items_per_task=1)
    assert chunked == single == [[x, x * x] for x in items]
    listed = [
        sorted(r.run_id for r in afk.Store(tmp_path / name).runs())
        for name in ("default", "single")
    ]
    assert listed[0] == listed[1] == [f"fanout-pair-{k:06d}" for k in items]

    caplog.clear()
    assert map_durable(pair, range(4), store=tmp_path / "few", progress=False) == [
        [x, x * x] for x in range(4)
    ]
    assert chunking(caplog) == [4, 4, 1, 1]
    caplog.clear()
    _, slow = items_for(tmp_path, 6)
    for item in slow:
        item.update(steps=1, sleep_s=TARGET_TASK_S)
    results = map_durable(tally, slow, store=tmp_path / "slow", progress=False)
    assert results == [expected(item) for item in slow]
    assert chunking(caplog) == [6, 6, 1, 1]
