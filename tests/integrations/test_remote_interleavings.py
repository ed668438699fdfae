"""The take protocol in every interleaving of the old owner's steps with the taker's.

Owner A (store a, epoch 1, effects mirrored synchronously) runs its steps one by one
with the uploader its mirror thread uses (``RunUploader``: the same upload calls, the
meta read before the files):

    checkpoint, intent upload, lease check, effect, outcome upload, meta upload

The mirror's check before each batch may lie long before the batch's uploads, so the
worst case is explored: no upload step checks, only the check after the intent does.

Taker B (store b) is the real :func:`pull_run` with ``take=True``; the bucket it
talks to pauses it at each step of the protocol (lease create, the listing after it,
bases create) and at its resume, and runs the A steps this interleaving puts there.
A step that finds a newer lease stops A for good (A is fenced). Every interleaving
of the 6 A steps with B's 4 is run against a fresh ``file://`` bucket; in each, the
effect runs on at most one machine (B runs it only if its copy has no intent for
it), and a copy B finds completed holds the right result. Two mutants of the protocol
are caught: B listing before it creates its lease, and A skipping its check after the
intent upload.

Tampered remotes (issue 40): A pins each journal upload in its lease renewal, as the
mirror does with ``sync_effects``, and an adversary deletes the segment holding A's
intent right after A uploaded it (before A's check). Whatever the interleaving, the
effect still runs at most once: B either refuses the take (``RemoteIntegrityError``; it
publishes nothing and never runs the effect) or lists the intent. Two more mutants are
caught: A not pinning its upload, and B not reading A's renewal again between its lease
and its listing. (An adversary that also puts back A's renewal from before the pin
rolls the remote back as a whole to an earlier consistent state, which no reader can
tell from that state: docs/remote.md states this limit.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import remote_helpers

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")

from afk_local.integrations.remote import pull as pull_module  # noqa: E402
from afk_local.integrations.remote.lease import renew  # noqa: E402
from afk_local.integrations.remote.upload import (  # noqa: E402
    RunUploader,
    durable_journal_end,
)
from afk_local.storage.rundir.mirror import FENCED_NAME as MARKER  # noqa: E402

A_STEPS = ("checkpoint", "intent", "check", "effect", "outcome", "meta")
B_STEPS = ("lease", "list", "bases", "resume")
RESULT = 42


def interleavings() -> Iterator[tuple[int, ...]]:
    """For each interleaving, how many A steps run before B step i (i = 0..3); the
    rest run after B's resume."""
    yield from itertools.combinations_with_replacement(range(len(A_STEPS) + 1), len(B_STEPS))


@dataclass
class World:
    """One trial: the bucket, both stores, and what ran where."""

    url: str
    a: afk.Store
    b: afk.Store
    ran: list[str] = field(default_factory=list)
    fenced: bool = False
    done: int = 0
    tamper: str = ""
    """"" (none) or "delete" (the intent's segment, right after its upload)."""
    pin: bool = True


class OwnerA:
    """A's writer (no mirror thread: its uploads are the steps below)."""

    def __init__(self, world: World, *, check_after_intent: bool) -> None:
        self.world = world
        self.check_after_intent = check_after_intent
        self.writer = world.a.resume_writer("r")
        self.paths = world.a.paths("r")
        self.uploader = RunUploader(
            remote.Bucket(world.url), self.paths, remote.store_id(world.a.root)
        )
        self.uploader.acquire()
        self.uploader.scan_remote()
        self._renew()  # the holder renewed before this interleaving began

    def step(self, name: str) -> None:
        if self.world.fenced:
            return
        try:
            getattr(self, f"_{name}")()
        except afk.LeaseLostError:
            self.world.fenced = True
            self.writer.close()

    # The mirror's check before each batch may lie long before its uploads, so the
    # uploads here do not check: only the check step (after the intent) does.

    def _checkpoint(self) -> None:
        seq = self.writer.checkpoint("runtime_state", {"stage": "before"}, step=2).seq
        self.uploader.upload_file(self.writer.paths.checkpoint(seq, "runtime_state").name)

    def _intent(self) -> None:
        self.writer.effects.record_intent("e1", name="charge", input_hash="h", idempotency_key="i")
        before = self.uploader.journal_uploaded
        self.uploader.upload_journal(durable_journal_end(self.paths))
        if self.world.pin:
            self._renew()  # the mirror's pin with sync_effects
        if self.world.tamper:
            bucket = remote.Bucket(self.world.url)
            segment = f"r/e000000000001/effects/{before:016d}.seg"
            assert bucket.exists(segment)
            remote_helpers.overwrite(self.world.url, segment, None)

    def _renew(self) -> None:
        renew(
            remote.Bucket(self.world.url),
            "r",
            1,
            sync_effects=True,
            lease_s=30,
            journal_end=self.uploader.journal_uploaded,
            head_seq=0,
        )

    def _check(self) -> None:
        if self.check_after_intent:
            self.uploader.check_lease()

    def _effect(self) -> None:
        self.world.ran.append("a")

    def _outcome(self) -> None:
        self.writer.effects.record_outcome("e1", status="ok", result=RESULT)
        self.uploader.upload_journal(durable_journal_end(self.paths))

    def _meta(self) -> None:
        terminal = self.writer.finish({"total": RESULT}, step=3)
        meta = self.uploader.read_meta()  # read before the batch's files, as the mirror does
        self.uploader.upload_journal(durable_journal_end(self.paths))
        for seq in range(1, terminal.seq + 1):
            for path in self.paths.dir.glob(f"{seq:012d}.*.ckpt"):
                self.uploader.upload_file(path.name)
        self.uploader.upload_meta(meta)
        self.writer.close()


class PausingBucket(remote.Bucket):
    """B's bucket: runs the A steps due before each of B's protocol steps."""

    def __init__(self, url: str, before: Callable[[str], None]) -> None:
        super().__init__(url)
        self.before = before
        self.leased = False
        self.listed = False

    def create(self, key: str, data: bytes) -> bool:
        if key.endswith(".lease"):
            self.before("lease")
            self.leased = True
        elif key.endswith(".bases"):
            self.before("bases")
        return super().create(key, data)

    def list_objects(self, prefix: str, *, limit: int):  # type: ignore[no-untyped-def]
        if self.leased and not self.listed:
            self.listed = True
            self.before("list")
        return super().list_objects(prefix, limit=limit)


def setup(tmp_path: Path) -> World:
    world = World(
        remote.file_url(tmp_path / "bucket"),
        afk.Store(tmp_path / "a"),
        afk.Store(tmp_path / "b"),
    )
    with world.a.create("r") as run:
        run.checkpoint("runtime_state", {"stage": "start"}, step=1)
    remote.push_run(world.a, world.url, "r")
    return world


def trial(
    tmp_path: Path,
    cut: tuple[int, ...],
    *,
    check_after_intent: bool = True,
    tamper: str = "",
    pin: bool = True,
) -> list[str]:
    """Run one interleaving; returns the violations found (empty: it held)."""
    world = setup(tmp_path)
    world.tamper, world.pin = tamper, pin
    owner = OwnerA(world, check_after_intent=check_after_intent)

    def run_a_until(count: int) -> None:
        while world.done < count:
            owner.step(A_STEPS[world.done])
            world.done += 1

    slots = dict(zip(B_STEPS, cut, strict=True))
    bucket = PausingBucket(world.url, lambda step: run_a_until(slots[step]))
    try:
        pull_module.pull_run(world.b, bucket, "r", take=True)
    except remote.RemoteIntegrityError:
        # Refused: B published nothing and runs nothing; A goes on (fenced or not).
        run_a_until(len(A_STEPS))
        problems = [] if not (world.b.runs_dir / "r").exists() else ["refused yet published"]
        if world.ran.count("a") > 1:
            problems.append(f"the effect ran twice: {world.ran}")
        return [f"cut {cut}: {p}" for p in problems]
    run_a_until(slots["resume"])
    problems = []
    copy = world.b.open("r")
    states = {e.kind for e in copy.effects() if e.key == "e1"}
    if copy.meta.status is afk.RunStatus.COMPLETED:
        result = copy.resume_state().result
        if result != {"total": RESULT}:
            problems.append(f"completed with result {result!r}")
        if "outcome" not in states:
            problems.append("completed without the effect's outcome")
    elif not states:
        world.ran.append("b")  # no intent on the remote: B's resume runs the effect
    run_a_until(len(A_STEPS))
    if world.ran.count("a") + world.ran.count("b") > 1:
        problems.append(f"the effect ran on both machines: {world.ran}")
    if world.fenced:
        if not (world.a.paths("r").dir / MARKER).exists():
            problems.append("A saw the newer epoch but its copy is not marked fenced")
        with pytest.raises(afk.LeaseLostError, match="fenced"):
            world.a.resume_writer("r")
    return [f"cut {cut}: {p}" for p in problems]


def explore(
    tmp_path: Path, cuts: list[tuple[int, ...]], *, first: bool = False, **options: Any
) -> list[str]:
    """The violations over ``cuts`` (with ``first``, stop at the first interleaving
    that has one)."""
    found: list[str] = []
    for index, cut in enumerate(cuts):
        found += trial(tmp_path / str(index), cut, **options)
        if first and found:
            break
    return found


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol is what is explored here, not durability: skip the fsyncs (x2 faster)."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


def test_every_interleaving_of_owner_and_taker_runs_the_effect_at_most_once(
    tmp_path: Path, trials: Callable[[int, int], int]
) -> None:
    cuts = list(interleavings())
    assert len(cuts) == 210  # C(10, 4)
    # All of them with --torture; every other one in the default run (~5 s).
    assert explore(tmp_path, cuts[:: trials(2, 1)]) == []


def test_mutant_taker_that_lists_before_its_lease_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pre-lease listing stands in for the one after the lease: the old order.
    first: list[object] = []
    real_read = pull_module.read_remote_run

    def read_once(*args: object) -> object:
        found = real_read(*args)  # type: ignore[arg-type]
        if not first:
            first.append(found)
        return found

    monkeypatch.setattr(pull_module, "read_remote_run", read_once)
    monkeypatch.setattr(pull_module, "settled_remote", lambda *args: first[0])
    # Without A's pins: with them, B's second read of A's renewal refuses the stale
    # listing (a second line of defence, explored above with tampered remotes).
    found = explore(tmp_path, list(interleavings())[::-1], first=True, pin=False)
    assert any("both machines" in p for p in found), found


def test_mutant_owner_without_a_check_after_the_intent_is_caught(tmp_path: Path) -> None:
    found = explore(tmp_path, list(interleavings())[::-1], first=True, check_after_intent=False)
    assert any("both machines" in p for p in found), found


# -- tampered remotes (issue 40) ------------------------------------------------------------


def test_every_interleaving_with_the_intent_deleted_runs_the_effect_at_most_once(
    tmp_path: Path, trials: Callable[[int, int], int]
) -> None:
    cuts = list(interleavings())
    assert explore(tmp_path, cuts[:: trials(3, 1)], tamper="delete") == []


def test_mutant_owner_that_does_not_pin_its_upload_is_caught(tmp_path: Path) -> None:
    found = explore(tmp_path, list(interleavings())[::-1], first=True, tamper="delete", pin=False)
    assert any("both machines" in p for p in found), found


def test_mutant_taker_that_does_not_read_the_renewal_again_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull_module, "recheck_pins", lambda *args: None)
    found = explore(tmp_path, list(interleavings())[::-1], first=True, tamper="delete")
    assert any("both machines" in p for p in found), found
