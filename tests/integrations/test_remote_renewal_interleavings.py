"""The take protocol with the holder's lease renewals on a clock: every interleaving of a
holder's steps, renewal ticks and pauses longer than the lease with a taker's steps, and
an adversary who deletes or replays lease objects (issue 40).

Time is virtual: one clock stands for the holder's monotonic clock, the taker's and the
remote's timestamps (the renewer's and the take's ``time.monotonic``, the lease module's
``now_ms`` and the bucket's ``.alive`` stamps), so a pause is a step that moves it on
``PAUSE_S`` (longer than the lease and its margins) wherever the interleaving puts it, on
either side.

Holder A (store a, epoch 2: it took the run from store z, so its epoch has bases) runs
the real :class:`~afk_local.integrations.remote.renewer.LeaseRenewer` (its ``tick`` is
the timer's work) and uploads with the real ``RunUploader``; its journal append is gated
as the mirror gates it: it waits while the renewer is not fresh (the wait moves the clock
on to the renewer's next tick) and, with the background mirror, until the batch that
uploads this session's meta is done. Taker B is the real ``pull_run(take=True)``
(without ``--force``), paused at its first read of the renewal, its re-read, its lease
create, its listing and its bases create, and before its resume.

Scenarios (each run in every interleaving with ``--torture``, sampled by default):

- ``pause``: A is paused past its lease at any point, then renews (a revival) and goes
  on; background and ``sync_effects``.
- ``replay``: the released renewal A's earlier session wrote (genuine) is put back at
  any point of A's new session.
- ``delete``: A's lease or bases object is deleted at any point.

In each, the effect runs on at most one machine (B runs it only when its copy has no
intent for it), and a copy B finds completed holds the right result. The mutants a
correct explorer must catch: a renewer that skips the self-fencing check, a holder
without the revival wait, a taker without its re-read before the create, a background
gate that does not wait for the session's first batch, and a taker that accepts a
release whatever the remote holds.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import remote_helpers

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")

from afk_local.integrations.remote import lease as lease_module  # noqa: E402
from afk_local.integrations.remote import pull as pull_module  # noqa: E402
from afk_local.integrations.remote import renewer as renewer_module  # noqa: E402
from afk_local.integrations.remote import take as take_module  # noqa: E402
from afk_local.integrations.remote.layout import alive_key, bases_key, lease_key  # noqa: E402
from afk_local.integrations.remote.renewer import LeaseRenewer  # noqa: E402
from afk_local.integrations.remote.upload import (  # noqa: E402
    RunUploader,
    durable_journal_end,
    local_files,
)

LEASE_S = 30.0
PAUSE_S = 60.0
"""Longer than the lease, its margin and the timestamp resolution (39 s)."""
RESULT = 42
B_STEPS = ("read", "reread", "lease", "list", "bases", "resume")
SCENARIOS = {
    "pause": ("pause", "tick", "intent", "effect", "upload", "meta"),
    "replay": ("acquire", "tick", "wait", "replay", "intent", "effect", "meta"),
    "delete": ("tick", "delete", "intent", "effect", "upload", "meta"),
}


class Clock:
    """The one virtual clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def monotonic(self) -> float:
        return self.now

    def ms(self) -> int:
        return int(self.now * 1000)


class ClockedBucket(remote.Bucket):
    """A ``file://`` bucket whose ``.alive`` objects are stamped by the virtual clock; with
    ``before``, B's bucket: it runs the A steps due before each of B's protocol steps."""

    def __init__(
        self,
        url: str,
        clock: Clock,
        stamps: dict[str, int],
        before: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(url)
        self.clock, self.stamps, self.before = clock, stamps, before
        self.reads = 0
        self.leased = self.listed = False

    def _hook(self, step: str) -> None:
        if self.before is not None:
            self.before(step)

    def replace(self, key: str, data: bytes) -> None:
        super().replace(key, data)
        self.stamps[key] = self.clock.ms()

    def modified_ms(self, key: str) -> int | None:
        if key.endswith(".alive"):
            if not self.leased:
                self.reads += 1
                self._hook("read" if self.reads == 1 else "reread")
            elif not self.listed:
                self.listed = True
                self._hook("list")  # the read after the lease comes right before the listing
            found = super().modified_ms(key)
            return None if found is None else self.stamps.get(key, found)
        return super().modified_ms(key)

    def create(self, key: str, data: bytes) -> bool:
        if key.endswith(".lease"):
            self._hook("lease")
            self.leased = True
        elif key.endswith(".bases"):
            self._hook("bases")
        return super().create(key, data)

    def list_objects(self, prefix: str, *, limit: int):  # type: ignore[no-untyped-def]
        if self.leased and not self.listed:
            self.listed = True
            self._hook("list")
        return super().list_objects(prefix, limit=limit)


@dataclass
class World:
    """One trial."""

    url: str
    clock: Clock
    a: afk.Store
    b: afk.Store
    sync: bool
    stamps: dict[str, int] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    stopped: str = ""
    """Why A stopped ("" while it runs): fenced, or the chain broken."""
    released: bytes = b""
    """The released renewal A's earlier session wrote."""
    deleted: str = "lease"


class OwnerA:
    """A's session: its writer, uploader and renewer, driven step by step."""

    def __init__(self, world: World, *, batched: bool, session_gate: bool = True) -> None:
        self.world = world
        self.session_gate = session_gate
        self.writer = world.a.resume_writer("r")
        self.paths = world.a.paths("r")
        bucket = ClockedBucket(world.url, world.clock, world.stamps)
        self.uploader = RunUploader(bucket, self.paths, remote.store_id(world.a.root))
        self.uploaded_seq = 0
        self.batched = False
        self.renewer = LeaseRenewer(
            self.uploader,
            lease_s=LEASE_S,
            retry_for_s=60,
            sync_effects=world.sync,
            cond=threading.Condition(),
            failed=lambda: bool(world.stopped),
            fail=lambda exc: None,
            uploaded_seq=lambda: self.uploaded_seq,
        )
        if batched:  # the session has run a while: its first batch and a renewal are done
            self._batch()
            self._tick()

    def step(self, name: str) -> None:
        if self.world.stopped:
            return
        try:
            getattr(self, f"_{name}")()
        except afk.LeaseLostError:
            self.world.stopped = "fenced"  # the mirror's last words, as its _fail sends them
            self.uploader.upload_after_fence(durable_journal_end(self.paths))
        except remote.RemoteIntegrityError:
            self.world.stopped = "chain"
        if self.world.stopped:
            self.writer.close()

    def _batch(self) -> None:
        """The mirror's upload batch: check, journal, check, files, meta (read first)."""
        uploader = self.uploader
        meta = uploader.read_meta()
        if uploader.lease is None:
            uploader.acquire()
            uploader.scan_remote()
        else:
            uploader.check_lease()
        uploader.upload_journal(durable_journal_end(self.paths))
        uploader.check_lease()
        for name in uploader.missing_files():
            uploader.upload_file(name)
        uploader.upload_meta(meta)
        files = local_files(self.paths)
        self.uploaded_seq = files[-1][0] if files else 0
        self.batched = True

    def _acquire(self) -> None:
        """The start of the session's first batch: the lease (the renewer waits for it)."""
        self.uploader.acquire()
        self.uploader.scan_remote()

    def _tick(self) -> None:
        if self.uploader.lease is not None:  # the timer waits for the first batch's lease
            self.renewer.tick()

    def _wait(self) -> None:
        """A renewal period passes, and the timer renews."""
        self.world.clock.now += LEASE_S / renewer_module.RENEWALS_PER_LEASE
        self._tick()

    def _pause(self) -> None:
        self.world.clock.now += PAUSE_S

    def _replay(self) -> None:
        remote_helpers.overwrite(self.world.url, alive_key("r", 2), self.world.released)
        self.world.stamps[alive_key("r", 2)] = self.world.clock.ms()

    def _delete(self) -> None:
        key = lease_key if self.world.deleted == "lease" else bases_key
        remote_helpers.overwrite(self.world.url, key("r", 2), None)

    def _gate(self) -> None:
        """What the mirror's ``before_append`` waits for (each wait moves the clock on to
        the renewer's next tick)."""
        if not self.world.sync and not self.batched and self.session_gate:
            self._batch()
        for _ in range(4):
            if self.renewer.fresh():
                return
            self.world.clock.now += lease_module.REVIVAL_WAIT_S
            self._tick()
        raise AssertionError("the renewer never became fresh")

    def _intent(self) -> None:
        self._gate()
        self.writer.effects.record_intent("e1", name="charge", input_hash="h", idempotency_key="i")
        if self.world.sync:  # the mirror uploads it, pins it, checks the lease
            self.uploader.upload_journal(durable_journal_end(self.paths))
            self.renewer.pin()
            self.uploader.check_lease()

    def _effect(self) -> None:
        self.world.ran.append("a")

    def _upload(self) -> None:
        self.writer.effects.record_outcome("e1", status="ok", result=RESULT)
        if self.world.sync:
            self.uploader.upload_journal(durable_journal_end(self.paths))
            self.renewer.pin()
        self._batch()

    def _meta(self) -> None:
        state = self.writer.effects.lookup("e1")
        if state is not None and state.in_doubt:  # (replay) its outcome, not yet recorded
            self._upload()
        self.writer.finish({"total": RESULT}, step=3)
        self._batch()
        self.uploader.check_lease()
        self.renewer.release()
        self.writer.close()


def patch_clock(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, timer: Callable[[], None] = lambda: None
) -> None:
    """Every clock reads the virtual one; a taker's sleep moves it on, and the holder's
    renewal timer fires meanwhile (``timer``)."""

    def sleep(seconds: float) -> None:
        clock.now += seconds
        timer()

    virtual = SimpleNamespace(monotonic=clock.monotonic, sleep=sleep)
    monkeypatch.setattr(renewer_module, "time", virtual)
    monkeypatch.setattr(take_module, "time", virtual)
    monkeypatch.setattr(lease_module, "now_ms", clock.ms)


def build(home: Path, clock: Clock, *, sync: bool) -> World:
    """Store z's run, taken by A (epoch 2, with bases), whose earlier session then closed
    (released); B an empty store."""
    world = World(
        remote.file_url(home / "bucket"), clock, afk.Store(home / "a"), afk.Store(home / "b"), sync
    )
    z = afk.Store(home / "z")
    with z.create("r") as run:
        run.checkpoint("runtime_state", {"stage": "start"}, step=1)
    remote.push_run(z, world.url, "r")
    remote.take_run(world.a, "r", world.url)
    earlier = OwnerA(world, batched=True)
    earlier.writer.checkpoint("runtime_state", {"stage": "earlier"}, step=1)
    earlier._batch()
    earlier.renewer.release()
    earlier.writer.close()
    released = remote.Bucket(world.url).get(alive_key("r", 2), 4096)
    assert released is not None and b'"released":true' in released
    world.released = released
    clock.now += 5
    return world


@dataclass
class Template:
    """A built world, kept as a copy: each trial restores it at the same path (a store
    knows the directory it lives in)."""

    home: Path
    copy: Path
    world: World

    def restore(self) -> World:
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.copytree(self.copy, self.home, symlinks=True)
        built = self.world
        clock = Clock()
        clock.now = built.clock.now
        return World(
            built.url,
            clock,
            afk.Store(self.home / "a"),
            afk.Store(self.home / "b"),
            built.sync,
            stamps=dict(built.stamps),
            released=built.released,
        )


def template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sync: bool) -> Template:
    clock = Clock()
    with monkeypatch.context() as patch:
        patch_clock(patch, clock)
        world = build(tmp_path / "world", clock, sync=sync)
    shutil.copytree(tmp_path / "world", tmp_path / "template", symlinks=True)
    return Template(tmp_path / "world", tmp_path / "template", world)


def interleavings(a_steps: int) -> Iterator[tuple[int, ...]]:
    """For each interleaving, how many A steps run before B step i; the rest run after."""
    yield from itertools.combinations_with_replacement(range(a_steps + 1), len(B_STEPS))


def trial(
    built: Template,
    monkeypatch: pytest.MonkeyPatch,
    scenario: str,
    cut: tuple[int, ...],
    *,
    deleted: str = "lease",
    session_gate: bool = True,
) -> list[str]:
    """Run one interleaving; returns the violations found (empty: it held)."""
    steps = SCENARIOS[scenario]
    world = built.restore()
    sync = world.sync
    world.deleted = deleted
    patch_clock(monkeypatch, world.clock, lambda: owner.step("tick"))
    owner = OwnerA(world, batched=scenario != "replay", session_gate=session_gate)
    done = 0

    def run_a_until(count: int) -> None:
        nonlocal done
        while done < min(count, len(steps)):
            owner.step(steps[done])
            done += 1

    slots = dict(zip(B_STEPS, cut, strict=True))
    bucket = ClockedBucket(
        world.url, world.clock, world.stamps, lambda step: run_a_until(slots[step])
    )
    label = f"{scenario} {'sync' if sync else 'background'} cut {cut}"
    try:
        pull_module.pull_run(world.b, bucket, "r", take=True)
    except (afk.MirrorError, afk.LeaseLostError) as exc:
        # Refused (a live holder, a broken chain) or stopped before its listing: B
        # published nothing and runs nothing; A goes on.
        run_a_until(len(steps))
        problems = (
            [] if not (world.b.runs_dir / "r").exists() else [f"refused yet published: {exc}"]
        )
        return [f"{label}: {p}" for p in problems]
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
    run_a_until(len(steps))
    if len(world.ran) > 1:
        problems.append(f"the effect ran on both machines: {world.ran}")
    return [f"{label}: {p}" for p in problems]


def explore(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    scenario: str,
    every: int,
    *,
    first: bool = False,
    cuts: list[tuple[int, ...]] | None = None,
    **options: Any,
) -> list[str]:
    """The violations over every ``every``-th interleaving, or over ``cuts`` (with
    ``first``: stop at the first interleaving that has one)."""
    if cuts is None:
        cuts = list(interleavings(len(SCENARIOS[scenario])))
    built = template(home, monkeypatch, sync=options.pop("sync", False))
    found: list[str] = []
    for cut in cuts[::every]:
        with monkeypatch.context() as patch:
            found += trial(built, patch, scenario, cut, **options)
        if first and found:
            break
    return found


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol is what is explored here, not durability: skip the fsyncs."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """Where the trials' stores and bucket live: in memory when the machine has /dev/shm
    (each trial restores a copy of the template there; on disk that is most of its cost)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="afk-renewals-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("sync", [False, True], ids=["background", "sync_effects"])
def test_a_holder_paused_past_its_lease_never_runs_an_effect_a_taker_runs(
    home: Path, monkeypatch: pytest.MonkeyPatch, trials: Callable[[int, int], int], sync: bool
) -> None:
    assert explore(home, monkeypatch, "pause", trials(61, 1), sync=sync) == []


def test_a_replayed_release_of_an_earlier_session_never_lets_an_effect_run_twice(
    home: Path, monkeypatch: pytest.MonkeyPatch, trials: Callable[[int, int], int]
) -> None:
    assert explore(home, monkeypatch, "replay", trials(97, 1)) == []


@pytest.mark.parametrize("deleted", ["lease", "bases"])
def test_a_deleted_lease_or_bases_object_stops_both_sides(
    home: Path, monkeypatch: pytest.MonkeyPatch, trials: Callable[[int, int], int], deleted: str
) -> None:
    assert explore(home, monkeypatch, "delete", trials(97, 1), deleted=deleted) == []


# -- mutants: each must be caught -------------------------------------------------------------


WITNESSES = {
    "pause": [(1, 1, 2, 2, 2, 2), (1, 1, 3, 3, 3, 3), (1, 1, 3, 4, 4, 4)],
    "replay": [(0, 0, 3, 4, 4, 4), (0, 0, 5, 5, 5, 5)],
}
"""The first interleaving (in the explorer's order) where some mutant below runs the effect
twice: the default run tries these; ``--torture`` searches every interleaving afresh."""


def hunt(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    scenario: str,
    **options: Any,
) -> bool:
    """True when the explorer finds the effect run on both machines."""
    torture = request.config.getoption("--torture")
    cuts = None if torture else WITNESSES[scenario]
    found = explore(home, monkeypatch, scenario, 1, first=True, cuts=cuts, **options)
    return any("both machines" in p for p in found)


def test_mutant_renewer_that_skips_the_self_fencing_check_is_caught(
    home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(LeaseRenewer, "fresh", lambda self: True)
    assert hunt(home, monkeypatch, request, "pause")


def test_mutant_holder_without_the_revival_wait_is_caught(
    home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(renewer_module, "REVIVAL_WAIT_S", 0.0)
    assert hunt(home, monkeypatch, request, "pause")


@pytest.mark.parametrize("skipped", ["reread_renewal", "holder_may_live"])
def test_mutant_taker_without_its_checks_around_the_create_is_caught(
    home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, skipped: str
) -> None:
    # Without the re-read (None) or without the wait after the listing (False).
    monkeypatch.setattr(pull_module, skipped, lambda *args, **kwargs: None)
    assert hunt(home, monkeypatch, request, "pause")


def test_mutant_holder_without_its_last_words_after_the_fence_is_caught(
    home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(RunUploader, "upload_after_fence", lambda self, end: None)
    assert hunt(home, monkeypatch, request, "pause")


def test_mutant_background_gate_without_the_sessions_first_batch_is_caught(
    home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    assert hunt(home, monkeypatch, request, "replay", session_gate=False)


def test_mutant_taker_that_takes_any_release_at_its_word_is_caught(
    home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(take_module, "release_holds", lambda renewal, *args: renewal.released)
    assert hunt(home, monkeypatch, request, "replay")
