"""The durable jobs the explorer records and resumes, and the probe they report to.

Each job is an ordinary ``@durable`` function. While it is recorded it tells
the probe (the recording's :class:`~afk_local.testing.crashsim.trace.Session`)
what it was promised: the checkpoints a ``sync`` checkpoint or a flush
acknowledged, the outcomes a journaled call returned. Its side effects
(:func:`perform`, :func:`decline`) report every execution with the idempotency
key they were handed, in the recording and in every resume, so the checker can
count how often each effect really ran.

Effect results are padded to ~1.5 KB so that ``effects.log`` crosses page
boundaries and a crash can tear it at one.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any, Protocol

from afk_local.runner.run.durable_function import durable
from afk_local.runner.run.run_context import RunContext

PADDING = "effect result padding " * 70
"""Makes each journaled outcome ~1.5 KB."""


class Probe(Protocol):
    """Where a job reports promises and side effects (the recording, or a resume's ledger)."""

    def checkpoints_acked(self, run_id: str, upto: int | None = None) -> None:
        """Checkpoints of ``run_id`` up to ``upto`` were acknowledged."""

    def outcomes_acked(self, run_id: str, keys: list[str] | None = None) -> None:
        """The outcomes of ``keys`` of ``run_id`` were acknowledged."""

    def effect_called(self, idempotency_key: str, label: str) -> None:
        """A side effect ran, handed ``idempotency_key``."""


class EffectLedger:
    """A probe for resumes: ignores promises, counts side effects per idempotency key."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def checkpoints_acked(self, run_id: str, upto: int | None = None) -> None:
        """Nothing to do: a resume is checked by what it returns and leaves on disk."""

    def outcomes_acked(self, run_id: str, keys: list[str] | None = None) -> None:
        """Nothing to do, as above."""

    def effect_called(self, idempotency_key: str, label: str) -> None:
        """Count one execution."""
        with self._lock:
            self.calls.append((idempotency_key, label))


_probe: list[Probe] = [EffectLedger()]


def probe() -> Probe:
    """The probe jobs report to now."""
    return _probe[0]


def use_probe(new: Probe) -> Probe:
    """Make jobs report to ``new``; returns the previous probe."""
    previous, _probe[0] = _probe[0], new
    return previous


def perform(label: str, n: int, *, idempotency_key: str) -> dict[str, Any]:
    """A side effect that succeeds (think: send an email); returns a padded receipt."""
    probe().effect_called(idempotency_key, label)
    return {"label": label, "n": n, "padding": PADDING}


def decline(label: str, *, idempotency_key: str) -> None:
    """A side effect that fails (think: a declined card); journaled as an error outcome."""
    probe().effect_called(idempotency_key, label)
    raise ValueError(f"{label}: declined")


def _checkpoint(ctx: RunContext) -> None:
    ctx.checkpoint()
    if ctx.writer.durability == "sync":
        probe().checkpoints_acked(ctx.run_id, ctx.writer.run.seq)


@durable(durability="sync")
def count_job(ctx: RunContext, n: int) -> dict[str, int]:
    """``sync`` checkpoints: a growing state (so most checkpoints are deltas), one per item."""
    items: list[str] = ctx.state.setdefault("items", [])
    while len(items) < n:
        items.append(f"item {len(items)} " * 30)
        _checkpoint(ctx)
    return {"count": len(items)}


@durable(durability="exit")
def count_job_at_exit(ctx: RunContext, n: int) -> dict[str, int]:
    """The same loop in ``exit`` mode: its checkpoints are written together when it ends."""
    items: list[str] = ctx.state.setdefault("items", [])
    while len(items) < n:
        items.append(f"item {len(items)} " * 30)
        ctx.checkpoint()
    return {"count": len(items)}


@durable(durability="sync")
def ledger_job(ctx: RunContext) -> dict[str, Any]:
    """Journaled calls: one not idempotent (in doubt after a crash: raise), idempotent ones
    (in doubt: retry with the same key) and one that fails (an error outcome, run again)."""
    charged = ctx.step("charge", perform, "charge", 1)
    probe().outcomes_acked(ctx.run_id, ["charge#1"])
    ctx.state["charged"] = charged["n"]
    _checkpoint(ctx)
    try:
        ctx.step("refund", decline, "refund")
    except ValueError:
        ctx.state["refund"] = "declined"
    probe().outcomes_acked(ctx.run_id, ["refund#1"])
    mailed = ctx.step("email", perform, "email", 2, idempotent=True)
    notified = ctx.step("notify", perform, "notify", 3, idempotent=True)
    probe().outcomes_acked(ctx.run_id, ["email#1", "notify#1"])
    _checkpoint(ctx)
    return {"charged": charged["n"], "mailed": mailed["n"], "notified": notified["n"]}


@durable(durability="sync")
def one_step_job(ctx: RunContext, n: int) -> dict[str, Any]:
    """The smallest durable run: one journaled call, not idempotent, then its result (the
    run's creation, its intent, outcome and terminal checkpoint, nothing else)."""
    sent = ctx.step("send", perform, "send", n)
    probe().outcomes_acked(ctx.run_id, ["send#1"])
    return {"sent": sent["n"]}


@durable(durability="sync")
def sleepy_job(ctx: RunContext, hours: int) -> str:
    """A checkpoint, then a durable sleep long enough to park the run (status
    ``sleeping`` until its wake time: the attempt ends with ``RunSleeping``)."""
    ctx.state["before"] = True
    _checkpoint(ctx)
    ctx.sleep(hours * 3600, park_after=0)
    return "woke"


@durable(durability="sync")
def approval_job(ctx: RunContext, amount: int) -> dict[str, Any]:
    """A checkpoint, then a pause for a person's answer; the answer is tagged on the run
    and checkpointed, then returned (answered with ``afk.resume(..., input=...)``)."""
    ctx.state["asked"] = amount
    _checkpoint(ctx)
    answer = ctx.pause({"approve": amount})
    ctx.state["answer"] = answer
    _checkpoint(ctx)
    return {"amount": amount, "answer": answer}


@durable(durability="sync")
def tagged_job(ctx: RunContext, n: int) -> dict[str, Any]:
    """Tags set by the job as it goes (each a rewrite of ``run.meta``), checkpoints between."""
    ctx.tags["phase"] = "first"
    items: list[int] = ctx.state.setdefault("items", [])
    while len(items) < n:
        items.append(len(items))
        _checkpoint(ctx)
        ctx.tags.update_all({"phase": f"after {len(items)}", "model": "small"})
    return {"count": len(items)}


@durable(durability="sync")
def metered_job(ctx: RunContext, n: int) -> dict[str, Any]:
    """A metric point per item, each carried by the item's checkpoint, the state new random
    bytes each time (the metrics-gc workload's store writes keyframes only, so that gc
    deletes without rewriting any)."""
    items: list[int] = ctx.state.setdefault("items", [])
    while len(items) < n:
        items.append(len(items))
        ctx.state["noise"] = secrets.token_hex(256)
        ctx.metric("item", float(len(items)))
        _checkpoint(ctx)
    return {"count": len(items)}


def _journal_in_threads(
    ctx: RunContext, keys: list[str]
) -> tuple[list[threading.Thread], dict[str, Any], list[BaseException]]:
    """Start one thread per key, each journaling one call: their fsyncs are shared."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def fetch(key: str) -> None:
        try:
            results[key] = ctx.effects.call(
                key, perform, (key, int(key.split(":")[1])), idempotent=True
            )
        except BaseException as exc:  # raised again in the job's thread
            errors.append(exc)

    threads = [threading.Thread(target=fetch, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    return threads, results, errors


@durable(durability="async")
def batch_job(ctx: RunContext, rounds: int, width: int) -> dict[str, Any]:
    """``async`` write-behind with journal group commit: each round queues checkpoints while
    ``width`` threads journal one call each (their fsyncs are shared), then flushes."""
    done: list[int] = ctx.state.setdefault("done", [])
    fetched: list[int] = []
    for round_ in range(rounds):
        keys = [f"fetch:{round_ * width + i}" for i in range(width)]
        threads, results, errors = _journal_in_threads(ctx, keys)
        for i in range(3):  # queued meanwhile, written (or coalesced) by the writer thread
            if round_ * 3 + i not in done:
                done.append(round_ * 3 + i)
                ctx.checkpoint()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        probe().outcomes_acked(ctx.run_id, keys)
        fetched += [results[key]["n"] for key in keys]
        ctx.writer.flush()
        probe().checkpoints_acked(ctx.run_id, ctx.writer.run.seq)
    return {"fetched": fetched, "done": len(done)}


__all__ = [
    "PADDING",
    "EffectLedger",
    "Probe",
    "approval_job",
    "batch_job",
    "count_job",
    "count_job_at_exit",
    "decline",
    "ledger_job",
    "metered_job",
    "one_step_job",
    "perform",
    "probe",
    "sleepy_job",
    "tagged_job",
    "use_probe",
]
