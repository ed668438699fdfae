"""Side effects under real SIGKILLs: performed once, or reported in doubt, never lost.

A child process performs N "side effects" through ``Journal.call``: each appends
a line ``<key> <idempotency key>`` to an outside file that the journal knows
nothing about. The parent SIGKILLs it at random moments and starts new
processes until one finishes, then compares the outside file with the journal.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from proc import kill_after, run, spawn

from afk_local.journal.journal import Journal
from afk_local.journal.replay import idempotency_key

RUN_ID = "crash-run"

CHILD = r"""
import os, signal, sys, time, random
from afk_local import EffectInDoubtError
from afk_local.journal.journal import Journal
path, outside, n, policy, seed, retry_keys, die_at = sys.argv[1:8]
rng = random.Random(int(seed))
retry = set(retry_keys.split(",")) if retry_keys else set()
journal = Journal(path, "crash-run", writable=True)

def effect(i, *, idempotency_key):
    if die_at == f"before:e{i}":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(rng.random() * 0.003)
    fd = os.open(outside, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"e{i} {idempotency_key}\n".encode())
    os.close(fd)
    if die_at == f"after:e{i}":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(rng.random() * 0.003)
    return i * i

for i in range(int(n)):
    key = f"e{i}"
    try:
        result = journal.call(key, effect, (i,), idempotent=(policy == "retry"),
                              in_doubt="retry" if key in retry else None)
    except EffectInDoubtError:
        print(f"INDOUBT {key}", flush=True)
        sys.exit(3)
    print(f"ACK {key} {result}", flush=True)
print("DONE", flush=True)
"""


def outside_lines(outside: Path) -> list[tuple[str, str]]:
    if not outside.exists():
        return []
    lines = outside.read_text().splitlines()
    return [(line.split()[0], line.split()[1]) for line in lines]


def check_invariants(path: Path, outside: Path, acked: set[str]) -> None:
    """What must hold after any process, killed or not."""
    with Journal(path, RUN_ID, writable=False) as journal:
        for key in acked:  # acknowledged means durable outcome
            state = journal.lookup(key)
            assert state is not None and state.status == "ok", key
        for key, idem in outside_lines(outside):  # every performed effect has a trace
            state = journal.lookup(key)
            assert state is not None and state.intent is not None, f"{key} left no trace"
            assert idem == idempotency_key(RUN_ID, key)


def check_done(path: Path, outside: Path, n: int, policy: str) -> Counter[str]:
    performed = Counter(key for key, _ in outside_lines(outside))
    with Journal(path, RUN_ID, writable=False) as journal:
        assert journal.in_doubt() == []
        for i in range(n):
            state = journal.lookup(f"e{i}")
            assert state is not None and state.outcome is not None
            assert state.outcome.status == "ok" and state.outcome.result == i * i
            if policy == "raise" or state.attempts == 1:
                # an effect whose (only) intent got an outcome ran exactly once
                assert performed[f"e{i}"] == 1, (f"e{i}", performed[f"e{i}"], state.attempts)
            else:
                # in doubt and retried with the same idempotency key: at most once per attempt
                assert 1 <= performed[f"e{i}"] <= state.attempts
    return performed


def resolve_in_doubt(path: Path, outside: Path, key: str, retry: set[str]) -> None:
    """What an operator does with an in-doubt effect: look at the outside system."""
    with Journal(path, RUN_ID, writable=True) as journal:
        state = journal.lookup(key)
        assert state is not None and state.in_doubt
        done = [k for k, _ in outside_lines(outside)].count(key)
        assert done in (0, 1)
        if done:  # it happened: record what it returned, so resume replays it
            i = int(key[1:])
            journal.record_outcome(key, status="ok", result=i * i)
        else:  # it did not: let the next attempt call it again
            retry.add(key)


def drive(tmp: Path, n: int, policy: str, seed: int, kills: list[dict[str, float]]) -> int:
    """Run children (killed per ``kills``, then to the end) until the work is done.

    Returns how many times an effect was found in doubt (killed inside the call).
    """
    path, outside = tmp / "effects.log", tmp / "outside.txt"
    retry: set[str] = set()
    acked: set[str] = set()
    in_doubt = 0
    for attempt in range(len(kills) + 2 * n + 2):
        # The operator's "retry" answers one in-doubt question: if that attempt dies
        # inside the effect again, the next process asks again.
        args = (str(path), str(outside), str(n), policy, str(seed + attempt), ",".join(retry), "")
        retry.clear()
        child = spawn(CHILD, *args)
        killed = kill_after(child, **kills[attempt]) if attempt < len(kills) else kill_after(child)
        acked |= {line.split()[1] for line in killed.lines if line.startswith("ACK")}
        check_invariants(path, outside, acked)
        if killed.lines and killed.lines[-1] == "DONE":
            check_done(path, outside, n, policy)
            with Journal(path, RUN_ID, writable=False) as journal:
                retried = sum(journal.lookup(k).attempts - 1 for k in journal.keys())  # type: ignore[union-attr]  # noqa: SIM118
            return in_doubt if policy == "raise" else retried
        if killed.lines and killed.lines[-1].startswith("INDOUBT"):
            assert policy == "raise", killed.lines
            assert killed.returncode in (3, -9)  # a scheduled kill may land after the print
            resolve_in_doubt(path, outside, killed.lines[-1].split()[1], retry)
            in_doubt += 1
        else:
            assert killed.returncode == -9, killed.stderr
    raise AssertionError("the children never finished")


def test_random_sigkills_perform_each_effect_once_or_report_it(tmp_path: Path, trials) -> None:
    rng = random.Random(20261121)
    n = 8
    in_doubt = 0
    for trial in range(trials(25, 500)):
        policy = ("raise", "retry")[trial % 2]
        kills: list[dict[str, float]] = []
        for _ in range(rng.randint(1, 2)):
            if rng.random() < 0.5:
                kills.append({"acks": rng.randint(0, n - 1)})
            else:
                kills.append({"seconds": rng.uniform(0.08, 0.2)})
        tmp = tmp_path / f"t{trial}"
        tmp.mkdir()
        in_doubt += drive(tmp, n, policy, rng.randrange(1 << 30), kills)
    # The kills really landed inside calls (about one per trial), not only between them.
    assert in_doubt >= 1


@pytest.mark.parametrize("policy", ["raise", "retry"])
@pytest.mark.parametrize("moment", ["before", "after"])
def test_kill_between_intent_and_outcome(tmp_path: Path, policy: str, moment: str) -> None:
    """The child SIGKILLs itself inside effect e2, before or after it touched the outside."""
    path, outside = tmp_path / "effects.log", tmp_path / "outside.txt"
    result = run(CHILD, str(path), str(outside), "4", policy, "1", "", f"{moment}:e2")
    assert result.returncode == -9
    assert result.stdout.split("\n")[:2] == ["ACK e0 0", "ACK e1 1"]
    with Journal(path, RUN_ID, writable=False) as journal:
        assert [s.key for s in journal.in_doubt()] == ["e2"]
    result = run(CHILD, str(path), str(outside), "4", policy, "2", "", "")
    performed = Counter(key for key, _ in outside_lines(outside))
    if policy == "raise":
        assert result.returncode == 3 and result.stdout.strip() == "ACK e0 0\nACK e1 1\nINDOUBT e2"
        assert performed["e2"] == (1 if moment == "after" else 0)
        assert "e3" not in performed
        return
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("DONE")
    # performed again with the same idempotency key: twice if the first one got through
    assert performed == Counter({"e0": 1, "e1": 1, "e2": 2 if moment == "after" else 1, "e3": 1})
    assert {idem for key, idem in outside_lines(outside) if key == "e2"} == {
        idempotency_key(RUN_ID, "e2")
    }
    assert "in doubt" in result.stderr  # the retry is logged, not silent
