"""What the Dask and Ray fan-outs share (integrations.fanout), without any engine.

Run ids, what travels to workers (never a key), the task a worker runs, the
progress fallback, and the import guards of the two engine modules.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import textwrap

import proc
import pytest
from fanout_jobs import expected, lines, pair, tally

import afk_local as afk
from afk_local.integrations.fanout import (
    MAX_ITEMS_PER_TASK,
    TARGET_TASK_S,
    ChunkOutcomes,
    ChunkPlanner,
    FanOutError,
    FanOutProgress,
    RunFailed,
    SharedDirectory,
    default_run_id,
    fanout_run_ids,
    portable_job,
    run_task,
    run_timed_tasks,
    task_chunks,
    worker_store,
)
from afk_local.integrations.fanout_results import client_store, completed_results


def test_default_run_ids_are_valid_deterministic_and_prefixed():
    ids = fanout_run_ids(tally, [1, 2, 3], None)
    assert ids == ["fanout-tally-000000", "fanout-tally-000001", "fanout-tally-000002"]
    assert fanout_run_ids(tally, [7, 8, 9], None) == ids  # found again by a second call
    assert default_run_id("<lambda> x/../y", 3) == "fanout-lambda-x-..-y-000003"
    assert default_run_id("é" * 300, 1) == "fanout-job-000001"
    long = default_run_id("a" * 300, 123456)
    assert len(long) <= 128 and long.endswith("-123456")


def test_custom_run_ids_are_validated_and_must_be_unique():
    assert fanout_run_ids(tally, ["a", "b"], lambda x: f"resize-{x}") == ["resize-a", "resize-b"]
    with pytest.raises(afk.InvalidRunIdError):
        fanout_run_ids(tally, ["../x"], lambda x: x)
    with pytest.raises(ValueError, match="items 0 and 2 both map to run id 'same-a'"):
        fanout_run_ids(tally, ["a", "b", "a"], lambda x: f"same-{x}")


def test_only_durable_jobs_fan_out():
    with pytest.raises(TypeError, match=r"@afk\.durable"):
        portable_job(len)
    assert portable_job(tally.with_store("/somewhere")).store is None


def test_a_keyed_store_never_sends_its_key(tmp_path, monkeypatch):
    secret = "fan-out-secret-key-0123456789"
    site = worker_store(afk.Store(tmp_path / "store", key=secret, lock_timeout=2.5))
    assert isinstance(site, SharedDirectory) and site.keyed
    data = pickle.dumps(site)
    assert secret.encode() not in data
    on_worker = pickle.loads(data)
    assert on_worker.options["lock_timeout"] == 2.5
    with pytest.raises(afk.AfkLocalError, match="never sends keys"):
        on_worker.open()  # this "worker" has no $AFK_LOCAL_KEY
    monkeypatch.setenv("AFK_LOCAL_KEY", secret)
    assert on_worker.open().keyed
    with pytest.raises(TypeError, match="never sent to workers"):
        SharedDirectory(tmp_path, key=secret)


def test_a_relative_root_becomes_absolute_for_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert worker_store("store").root == str(tmp_path / "store")
    assert worker_store(afk.Store("store")).root == str(tmp_path / "store")


def test_the_task_runs_resumes_and_settles_a_run(tmp_path):
    site = pickle.loads(pickle.dumps(worker_store(tmp_path / "store")))
    (tmp_path / "side").mkdir()
    item = {"name": "a", "n": 3, "steps": 3, "dir": str(tmp_path / "side")}
    assert run_task(portable_job(tally), site, item, "fanout-tally-000000") == expected(item)
    assert run_task(portable_job(tally), site, item, "fanout-tally-000000") == expected(item)
    assert len(lines(tmp_path / "side" / "a.calls")) == 1  # the second task ran nothing

    broken = dict(item, name="b", fail=True)
    with pytest.raises(RunFailed) as raised:
        run_task(portable_job(tally), site, broken, "fanout-tally-000001")
    assert raised.value.run_id == "fanout-tally-000001"
    assert "ValueError: item b is broken" in str(raised.value)
    again = pickle.loads(pickle.dumps(raised.value))  # how the engine sends it back
    assert (again.run_id, again.error_type, again.message) == (
        "fanout-tally-000001",
        "ValueError",
        "item b is broken",
    )
    assert "Traceback" in again.traceback_text
    message = str(FanOutError({"fanout-tally-000001": "ValueError: item b is broken"}, 2))
    assert message.startswith("1 of 2 fan-out runs did not complete: fanout-tally-000001")


def test_a_task_returns_its_result_as_the_store_keeps_it(tmp_path):
    site = worker_store(tmp_path / "store")
    # a tuple comes back as the list a completed run's stored result is, on every call
    assert run_task(portable_job(pair), site, 3, "pair-3") == [3, 9]
    assert run_task(portable_job(pair), site, 3, "pair-3") == [3, 9]


def test_completed_runs_are_read_back_on_the_client_and_nothing_else(tmp_path):
    root = tmp_path / "store"
    store = afk.Store(root)
    (tmp_path / "side").mkdir()
    items = [
        {"name": n, "n": 2, "steps": 2, "dir": str(tmp_path / "side")} for n in ("a", "b", "c")
    ]
    ids = fanout_run_ids(tally, items, None)
    job = portable_job(tally)
    run_task(job, worker_store(root), items[0], ids[0])
    with pytest.raises(RunFailed):
        run_task(job, worker_store(root), dict(items[1], fail=True), ids[1])
    # item 0 completed with this item; item 1 failed (another argument too); item 2 never ran
    assert completed_results(store, job, items, ids) == {0: expected(items[0])}
    # the same id with another item, or another job, is its task's to report
    other = [dict(items[0], n=5)]
    assert completed_results(store, job, other, ids[:1]) == {}
    assert completed_results(store, portable_job(pair), items[:1], ids[:1]) == {}
    # what the client can open: a Store as given, a directory, a SharedDirectory
    assert client_store(store) is store
    assert client_store(root).root == root
    assert client_store(worker_store(root)).root == root.absolute()


def test_a_call_over_completed_runs_needs_no_engine(tmp_path):
    """No Dask client exists and Ray is not running: a finished fan-out still returns."""
    pytest.importorskip("distributed")
    pytest.importorskip("ray")
    root = tmp_path / "store"
    for x in (1, 2):
        run_task(portable_job(pair), worker_store(root), x, default_run_id("pair", x - 1))
    script = textwrap.dedent(
        f"""
        import ray
        from fanout_jobs import pair
        from afk_local.integrations import dask, ray as on_ray
        assert dask.map_durable(pair, [1, 2], store={str(root)!r}, progress=False) == [
            [1, 1], [2, 4]]
        assert on_ray.map_durable(pair, [1, 2], store={str(root)!r}, progress=False) == [
            [1, 1], [2, 4]]
        assert not ray.is_initialized()
        print("ok")
        """
    )
    done = proc.run(script, env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_items_per_task_cuts_the_runs_left_into_chunks_and_refuses_below_one():
    assert task_chunks([0, 2, 3, 4, 7], 2) == [[0, 2], [3, 4], [7]]
    assert task_chunks([5, 6], 8) == [[5, 6]]
    assert task_chunks([], 3) == []
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"items_per_task must be at least 1, not {bad}"):
            task_chunks([1], bad)


def test_chunk_outcomes_name_each_run_that_did_not_complete():
    ids = ["r-0", "r-1", "r-2", "r-3", "r-4"]
    outcomes = ChunkOutcomes(ids, [[1, 2], [3, 4]], "map_durable tally", progress=False)
    assert outcomes.bar.done == 1  # run 0 had completed: in no chunk
    outcomes.lost([3, 4], "WorkerCrashedError: gone")  # tasks finish in any order
    outcomes.settled([1, 2], [(True, 10), (False, RunFailed("r-2", "ValueError", "bad"))])
    assert outcomes.results == {1: 10}
    with pytest.raises(FanOutError) as raised:
        outcomes.completed()
    assert list(raised.value.failures.items()) == [  # in item order
        ("r-2", "ValueError: bad"),
        ("r-3", "WorkerCrashedError: gone"),
        ("r-4", "WorkerCrashedError: gone"),
    ]
    assert (outcomes.bar.done, outcomes.bar.failed) == (5, 3)
    fine = ChunkOutcomes(ids[:2], [[0, 1]], "map_durable tally", progress=False)
    fine.settled([0, 1], [(True, [1, 2]), (True, None)])
    assert fine.completed() == {0: [1, 2], 1: None}


def test_progress_without_tqdm_logs_lines(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails as if not installed
    caplog.set_level(logging.INFO, logger="afk_local")
    bar = FanOutProgress(3, "map_durable tally")
    for failed in (False, True, False):
        bar.update(failed=failed)
    bar.close()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "map_durable tally: 3 runs submitted"
    assert messages[-1] == "map_durable tally: 3/3 runs finished, 1 failed"


def test_engines_are_optional():
    """Without an engine the core and fanout import; the engine module names its extra."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["distributed"] = sys.modules["ray"] = None  # as if not installed
        import afk_local, afk_local.integrations.fanout
        for name, extra in (("dask", "afk_local[dask]"), ("ray", "afk_local[ray]")):
            try:
                __import__("afk_local.integrations." + name)
            except ImportError as exc:
                assert extra in str(exc), exc
            else:
                raise AssertionError(name + " imported without its engine")
        print("ok")
        """
    )
    done = proc.run(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def drain(planner, seconds_per_item):
    """Take every chunk, the engine's way: ``window`` in flight, one observed per new take."""
    in_flight = []
    while (chunk := planner.take()) is not None or in_flight:
        if chunk is not None:
            in_flight.append(chunk)
            if len(in_flight) < planner.window:
                continue
        done = in_flight.pop(0)
        planner.observe(len(done), seconds_per_item * len(done))
    return planner.sizes


def test_planner_grows_tasks_for_cheap_items_and_keeps_every_item_once_in_order():
    planner = ChunkPlanner(list(range(0, 400, 2)), slots=2)
    sizes = drain(planner, 0.002)
    assert sizes[: planner.window] == [1] * planner.window  # small first tasks
    assert max(sizes) > 8 and max(sizes) <= MAX_ITEMS_PER_TASK
    assert sum(sizes) == 200 and len(sizes) < 60
    # two tasks per slot remain to the end: the last ones are small again
    assert sizes[-1] == 1
    replay = ChunkPlanner(list(range(0, 400, 2)), slots=2)
    taken = []
    while (chunk := replay.take()) is not None:
        taken += chunk
        replay.observe(len(chunk), 0.002 * len(chunk))
    assert taken == list(range(0, 400, 2))


def test_planner_keeps_one_item_per_task_for_expensive_items_or_few_items():
    assert set(drain(ChunkPlanner(range(200), slots=2), TARGET_TASK_S)) == {1}
    assert drain(ChunkPlanner(range(4), slots=2), 0.0001) == [1, 1, 1, 1]
    assert ChunkPlanner([], slots=4).take() is None


def test_run_timed_tasks_gives_each_runs_outcome_and_the_seconds_it_took(tmp_path):
    job, site = portable_job(pair), worker_store(tmp_path)
    for items in ([3], [4, 5]):
        seconds, outcomes = run_timed_tasks(job, site, items, [f"r-{x}" for x in items])
        assert seconds >= 0 and outcomes == [(True, [x, x * x]) for x in items]
