"""The replay check in this process: ``afk_local.testing.replay``, kept runs, patches,
and ``job.run`` refusing to resume a run its code no longer reproduces (issue 41)."""

from __future__ import annotations

import asyncio
import pickle
import signal
from pathlib import Path

import proc
import pytest
import replay_jobs
import time_jobs
from proc import SUPPORT

import afk_local as afk
import afk_local.testing
from afk_local.errors import ReplayDivergence
from afk_local.testing import run_and_kill

ITEMS = ["a", "b", "c"]


@pytest.fixture
def code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``code("v2")``: the version of replay_jobs' code this process runs from now on."""
    monkeypatch.setenv("REPLAY_SIDE", str(tmp_path / "side.txt"))

    def switch(version: str) -> None:
        monkeypatch.setenv("REPLAY_CODE", version)

    switch("v1")
    return switch


def side(tmp_path: Path) -> list[str]:
    path = tmp_path / "side.txt"
    return path.read_text("utf-8").splitlines() if path.exists() else []


def killed_after_two_charges(tmp_path: Path, store: afk.Store) -> None:
    child = proc.spawn(
        "import sys, replay_jobs\n"
        "replay_jobs.checkout.with_store(sys.argv[1]).run(['a', 'b', 'c'], run_id='r1')",
        str(store.root),
        env={
            "PYTHONPATH": str(SUPPORT),
            "REPLAY_CODE": "v1",
            "REPLAY_SIDE": str(tmp_path / "side.txt"),
            "REPLAY_STALL_AT": "CHARGED b",
        },
    )
    proc.kill_at_line(child, "CHARGED b")


def test_testing_replay_passes_on_v1_and_raises_on_a_renamed_step(
    afk_store: afk.Store, tmp_path: Path, code
) -> None:
    job = replay_jobs.checkout.with_store(afk_store)
    assert job.run(ITEMS, run_id="r1") == ["receipt-a", "receipt-b", "receipt-c"]
    report = afk_local.testing.replay(afk_store, "r1")
    assert report.ok and report.replayed == 3 and report.recorded == 3
    code("renamed")
    with pytest.raises(ReplayDivergence) as caught:
        afk_local.testing.replay(afk_store, "r1")
    found = caught.value
    assert (found.position, found.key, found.kind) == (1, "charge#1", "step")
    assert found.recorded == "charge('a', 10)" and found.asked == "bill('a', 10)"
    assert len(side(tmp_path)) == 3  # replays called no step function


def test_a_finished_run_must_give_its_result_again(
    afk_store: afk.Store, tmp_path: Path, code
) -> None:
    @afk.durable(store=afk_store, on_code_change="replay")
    def total(ctx: afk.RunContext) -> int:
        return ctx.step("n", lambda: 2) + 1

    total.run(run_id="t")
    assert afk_local.testing.replay(afk_store, "t").ok

    @afk.durable(store=afk_store, on_code_change="replay")
    def total_now(ctx: afk.RunContext) -> int:
        return ctx.step("n", lambda: 2) + 2

    with pytest.raises(ReplayDivergence) as caught:
        afk_local.testing.replay(afk_store, "t", job=total_now)
    assert caught.value.kind == "result"
    assert "the result 3" in caught.value.recorded and "the result 4" in caught.value.asked


def test_a_step_the_code_no_longer_makes_is_a_divergence(afk_store: afk.Store, code) -> None:
    @afk.durable(store=afk_store, on_code_change="replay")
    def two(ctx: afk.RunContext) -> None:
        ctx.step("first", lambda: 1)
        ctx.step("second", lambda x: x, "kept")

    @afk.durable(store=afk_store, on_code_change="replay")
    def one(ctx: afk.RunContext) -> None:
        ctx.step("first", lambda: 1)

    two.run(run_id="m")
    with pytest.raises(ReplayDivergence) as caught:
        afk_local.testing.replay(afk_store, "m", job=one)
    assert (caught.value.kind, caught.value.position) == ("missing", 2)
    assert caught.value.recorded == "second('kept')"


def test_replay_divergence_pickles_with_its_fields() -> None:
    error = ReplayDivergence("r", 2, "charge#2", "charge('b', 10)", "bill('b', 10)", refused=True)
    back = pickle.loads(pickle.dumps(error))
    assert (back.run_id, back.position, back.key, back.recorded, back.asked, back.refused) == (
        "r", 2, "charge#2", "charge('b', 10)", "bill('b', 10)", True,
    )  # fmt: skip
    assert str(back) == str(error) and "afk-local replay r" in str(back)


def test_job_run_refuses_to_resume_under_diverging_code(
    afk_store: afk.Store, tmp_path: Path, code
) -> None:
    killed_after_two_charges(tmp_path, afk_store)
    code("v2")
    with pytest.raises(ReplayDivergence) as caught:
        replay_jobs.checkout.with_store(afk_store).run(run_id="r1")
    assert caught.value.refused and "\n" not in str(caught.value)
    assert side(tmp_path) == ["charge a 10", "charge b 10"]
    assert afk_store.read_meta("r1").attempt == 1
    code("v2-patched")
    assert replay_jobs.checkout.with_store(afk_store).run(run_id="r1") == [
        "receipt-a", "receipt-b", "receipt-c",
    ]  # fmt: skip
    assert side(tmp_path) == ["charge a 10", "charge b 10", "fee c", "charge c 10"]
    # once no run needs the old branch the patch is deprecated: this run still does
    code("v3-deprecated")
    with pytest.raises(ReplayDivergence) as caught:
        afk_local.testing.replay(afk_store, "r1")
    assert caught.value.kind == "patch" and "'fee'" in caught.value.recorded


def test_a_kept_run_replays_as_a_regression_test(
    afk_store: afk.Store, tmp_path: Path, code
) -> None:
    replay_jobs.checkout.with_store(afk_store).run(ITEMS, run_id="order-1")
    fixtures = tmp_path / "recorded"
    kept = afk_local.testing.keep_run(afk_store, "order-1", fixtures)
    assert not (kept / "owner.lock").exists()
    fresh = afk.Store(tmp_path / "fresh")
    assert afk_local.testing.replay_recorded(kept, fresh).ok
    code("argchanged")
    with pytest.raises(ReplayDivergence) as caught:
        afk_local.testing.replay(fresh, "order-1")
    assert caught.value.asked == "charge('a', 20)"
    assert len(side(tmp_path)) == 3


def test_replay_stops_where_a_resume_would_go_live(afk_store: afk.Store) -> None:
    """A loop with a pause: the replay serves the finished items and stops at the pause."""

    @afk.durable(store=afk_store, on_code_change="replay")
    def review(ctx: afk.RunContext) -> list[str]:
        seen = ctx.state.setdefault("seen", [])
        for i in ctx.iterate(range(2)):
            seen.append(ctx.step("fetch", lambda i: f"doc{i}", i))
        answer = ctx.pause("ok?")
        return [*seen, ctx.step("publish", lambda a: a, answer)]

    with pytest.raises(afk.RunPaused):
        review.run(run_id="p")
    report = afk_local.testing.replay(afk_store, "p")
    assert report.ok and report.replayed == 2
    assert report.frontier is not None and "@pause" in report.frontier
    # the check a resume runs first lets the answer through
    assert afk.resume("p", store=afk_store, input="yes") == ["doc0", "doc1", "yes"]


def test_patch_ids_are_checked(afk_store: afk.Store) -> None:
    @afk.durable(store=afk_store, on_code_change="replay")
    def bad(ctx: afk.RunContext) -> bool:
        return ctx.patched("a/b")

    with pytest.raises(ValueError, match="patch id"):
        bad.run(run_id="bad")


def test_an_async_job_is_checked_before_it_resumes(afk_store: afk.Store) -> None:
    """The check of an ``async def`` job runs from inside the caller's event loop."""
    calls: list[str] = []
    code = {"greeting": "hello", "fail": True}

    async def send(text: str) -> str:
        calls.append(text)
        return text.upper()

    @afk.durable(store=afk_store, on_code_change="replay")
    async def mail(ctx: afk.RunContext) -> list[str]:
        first = await ctx.astep("send", send, code["greeting"])
        if code["fail"]:
            raise RuntimeError("down")
        return [first, await ctx.astep("send", send, "bye")]

    with pytest.raises(RuntimeError, match="down"):
        asyncio.run(mail.arun(run_id="am"))
    code.update(greeting="hi", fail=False)
    with pytest.raises(ReplayDivergence) as caught:
        asyncio.run(mail.arun(run_id="am"))
    assert caught.value.kind == "arguments" and caught.value.asked == "send('hi')"
    assert calls == ["hello"]
    code["greeting"] = "hello"
    assert asyncio.run(mail.arun(run_id="am")) == ["HELLO", "BYE"]
    assert calls == ["hello", "bye"]


def test_a_retried_step_killed_in_its_second_try_replays_without_a_divergence(
    afk_store: afk.Store, tmp_path: Path
) -> None:
    """A resume asks only the backoff owed after the newest try (it counts the tries from
    the step's record), so the backoff recorded between tries 1 and 2 is behind the step,
    not a call the code no longer makes."""
    counter = tmp_path / "calls"
    job = time_jobs.retried_idempotent.with_store(afk_store)
    killed = run_and_kill(job, str(counter), 2, at=None, store=afk_store, run_id="r")
    assert killed.returncode == -signal.SIGKILL and counter.read_text() == "2"
    afk_local.testing.replay(afk_store, "r")  # no ReplayDivergence
    assert counter.read_text() == "2"  # the replay called nothing


def test_a_job_whose_source_changed_is_checked_before_it_resumes_by_default(
    afk_store: afk.Store,
) -> None:
    """Without ``on_code_change``: the check runs when the job's code fingerprint changed
    (and only then), so an edited job refuses before any effect instead of paying a fee
    for the items the run had passed; an unchanged job resumes without the check."""
    effects: list[str] = []

    def charge(item: str) -> str:
        if item == "c" and not any(e.startswith("charge c") for e in effects):
            effects.append("charge c (failed)")
            raise RuntimeError("card declined")
        effects.append(f"charge {item}")
        return f"receipt-{item}"

    def fee(item: str) -> int:
        effects.append(f"fee {item}")
        return 1

    def v1(ctx: afk.RunContext, items: list[str]) -> list[str]:
        return [ctx.step("charge", charge, item) for item in ctx.iterate(items)]

    def v2(ctx: afk.RunContext, items: list[str]) -> list[str]:
        receipts = []
        for item in ctx.iterate(items):
            ctx.step("fee", fee, item)
            receipts.append(ctx.step("charge", charge, item))
        return receipts

    v2.__qualname__ = v1.__qualname__  # the same job (entrypoint), edited
    job_v1 = afk.durable(store=afk_store)(v1)
    job_v2 = afk.durable(store=afk_store)(v2)
    with pytest.raises(RuntimeError, match="card declined"):
        job_v1.run(ITEMS, run_id="edited")
    assert effects == ["charge a", "charge b", "charge c (failed)"]

    with pytest.warns(afk.CodeChangedWarning), pytest.raises(ReplayDivergence) as caught:
        job_v2.run(run_id="edited")
    assert caught.value.refused and "fee" in str(caught.value) and "\n" not in str(caught.value)
    assert effects == ["charge a", "charge b", "charge c (failed)"]  # nothing ran
    assert afk_store.read_meta("edited").attempt == 1

    job_v1.run(run_id="edited")  # the unchanged code resumes: the check does not run
    assert afk_store.read_meta("edited").status == "completed"
    assert effects == ["charge a", "charge b", "charge c (failed)", "charge c"]
