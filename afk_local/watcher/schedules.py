"""Schedules: ``<root>/schedules/<name>.json``, and the runs a watcher starts for their slots.

``afk-local schedule add`` writes one small JSON file per schedule (atomically,
0600; in a keyed store followed by a MAC line, as requests are). On every sweep the
watcher reads them and, for each due slot (:mod:`afk_local.watcher.slots`), creates
the run ``<name>--<slot as YYYYmmddTHHMMSSZ>`` with the schedule's job and arguments.
Watchers take a schedule's slots one at a time, under ``<name>.lock``, and move
``<name>.mark`` (the newest slot started) forward after each run they make: a slot
at or before the mark never starts again, even once its run was removed (a mark past
the clock's time, left while the clock was ahead, is moved back to now; a mark belongs
to the schedule it was made for, by its ``created_ms``, and goes with it). The run
id is a function of the slot and the run is created create-only (the run
directory's ``mkdir``), a second guard: two watchers, a restarted watcher or one
after a reboot all compute the same id and only one of them creates it.
The run is then an ordinary ``created`` run, resumed like any interrupted one (its
child goes through the trust gate and refuses anything but an ``@afk.durable`` job);
its tags name the schedule and the slot (``ctx.scheduled_slot`` in the job).

Format (fields with their default value are left out)::

    {"name": "nightly", "entrypoint": "jobs:report", "args": [], "kwargs": {},
     "every_s": 0, "cron": "0 3 * * *", "timezone": "Europe/Berlin",
     "catchup": "latest", "overlap": "allow", "created_ms": 1795716000000,
     "origin": {...}}
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from pathlib import Path
from typing import Any, Protocol

import msgspec

from afk_local.clock import current_clock
from afk_local.errors import AfkLocalError, RunExistsError
from afk_local.runner.code.entrypoints import is_entrypoint
from afk_local.runner.code.origin import ORIGIN_KEY
from afk_local.runner.run.tags import SCHEDULE_TAG_KEY, SLOT_TAG_KEY
from afk_local.runner.time.limits import file_lock
from afk_local.storage import fsio
from afk_local.storage.store import Store
from afk_local.storage.trust import path_problem
from afk_local.storage.views.run_info import TAGS_KEY
from afk_local.watcher.documents import open_document
from afk_local.watcher.slots import CATCHUP, OVERLAP, Timing, check_cron, due_slots, zone

log = logging.getLogger("afk_local")

SCHEDULES_DIR = "schedules"
SCHEDULE_TAG = "afk-local/schedule"
"""What a schedule's MAC is made for (it never passes for another kind of document)."""
MAX_SCHEDULE_BYTES = 1 << 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SLOT_FORMAT = "%Y%m%dT%H%M%SZ"


class Schedule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One schedule file's content."""

    name: str
    entrypoint: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    every_s: int = 0
    """Fire every this many seconds (multiples of it since the epoch); or ``cron``."""
    cron: str = ""
    timezone: str = ""
    """IANA zone the cron expression is read in; ``""``: the watcher's local zone."""
    catchup: str = "latest"
    overlap: str = "allow"
    """While its previous run is unfinished, a due slot starts anyway (``allow``), is
    skipped (``skip``), or waits until it finished (``queue``)."""
    created_ms: int = 0
    origin: dict[str, Any] = {}
    """Where it was added from (working directory, interpreter): each run starts from there."""

    @property
    def timing(self) -> Timing:
        """When it fires."""
        return Timing(self.every_s, self.cron, self.timezone)

    def run_id(self, slot: float) -> str:
        """The run id of ``slot``: the same in every watcher."""
        stamp = dt.datetime.fromtimestamp(slot, dt.timezone.utc).strftime(_SLOT_FORMAT)
        return f"{self.name}--{stamp}"

    def slot_of(self, run_id: str) -> float | None:
        """The slot a run of this schedule was made for (None: not one of its runs)."""
        prefix = f"{self.name}--"
        if not run_id.startswith(prefix):
            return None
        try:
            when = dt.datetime.strptime(run_id[len(prefix) :], _SLOT_FORMAT)
        except ValueError:
            return None
        return when.replace(tzinfo=dt.timezone.utc).timestamp()


def validate(schedule: Schedule) -> Schedule:
    """Raise ValueError naming what is wrong with ``schedule``."""
    if not _NAME.match(schedule.name):
        raise ValueError(
            f"schedule name {schedule.name!r}: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if not is_entrypoint(schedule.entrypoint):
        raise ValueError(f"entrypoint {schedule.entrypoint!r} is not module:function")
    if bool(schedule.every_s) == bool(schedule.cron):
        raise ValueError("a schedule has either every_s (--every) or cron (--cron)")
    if schedule.every_s < 0:
        raise ValueError(f"every_s must be >= 1 second, not {schedule.every_s}")
    if schedule.catchup not in CATCHUP:
        raise ValueError(f"catchup must be one of {', '.join(CATCHUP)}, not {schedule.catchup!r}")
    if schedule.overlap not in OVERLAP:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP)}, not {schedule.overlap!r}")
    zone(schedule.timezone)
    if schedule.cron:
        check_cron(schedule.cron, schedule.timezone)
    return schedule


def schedules_dir(store: Store) -> Path:
    """``<root>/schedules``."""
    return store.root / SCHEDULES_DIR


def schedule_path(store: Store, name: str) -> Path:
    """The file of schedule ``name`` (the name is checked first)."""
    if not _NAME.match(name):
        raise ValueError(f"schedule name {name!r}: letters, digits, '.', '_' or '-'")
    return schedules_dir(store) / f"{name}.json"


def write_schedule(store: Store, schedule: Schedule) -> Path:
    """Publish ``schedule`` atomically (replacing one of the same name); returns its path."""
    validate(schedule)
    if not schedule.created_ms:
        created = int(current_clock().time() * 1000)
        schedule = msgspec.structs.replace(schedule, created_ms=created)
    fsio.make_dirs(schedules_dir(store))
    path = schedule_path(store, schedule.name)
    body = msgspec.json.encode(schedule)
    signer = store.codec.signer
    fsio.atomic_write(path, body if signer is None else signer.sign_document(SCHEDULE_TAG, body))
    return path


def read_schedule(store: Store, path: Path) -> Schedule:
    """Read, check and validate one schedule file; ValueError saying why it is unusable.

    The file must be the user's, in a ``schedules/`` nobody else can write, and in a
    keyed store carry a valid MAC.
    """
    problem = path_problem(schedules_dir(store), directory=True)
    if problem is not None:
        raise ValueError(f"untrusted: {schedules_dir(store)} {problem}")
    try:
        fd = fsio.open_regular(path)  # a symlink, FIFO or device is refused, unblocked
    except OSError as exc:
        raise ValueError(f"cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise ValueError(f"untrusted: owned by uid {st.st_uid}, not by you")
        if st.st_size > MAX_SCHEDULE_BYTES:
            raise ValueError(f"too large: {st.st_size} bytes, over {MAX_SCHEDULE_BYTES}")
        data = os.read(fd, MAX_SCHEDULE_BYTES + 1)
    finally:
        os.close(fd)
    signer = store.codec.signer
    schedule = open_document(data, signer, SCHEDULE_TAG, Schedule, "schedule")
    if path.name != f"{schedule.name}.json":
        raise ValueError(f"names schedule {schedule.name!r}, not {path.stem!r}")
    return validate(schedule)


def list_schedules(store: Store) -> list[tuple[Path, Schedule | str]]:
    """Every schedule file, by name, with its schedule or why it cannot be used."""
    try:
        names = sorted(n for n in os.listdir(schedules_dir(store)) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    found: list[tuple[Path, Schedule | str]] = []
    for name in names:
        path = schedules_dir(store) / name
        try:
            found.append((path, read_schedule(store, path)))
        except (ValueError, ImportError) as exc:
            found.append((path, str(exc)))
    return found


def remove_schedule(store: Store, name: str) -> bool:
    """Delete schedule ``name`` and its mark (its runs stay); False when there was none."""
    path = schedule_path(store, name)
    try:
        fsio.unlink(path, missing_ok=False)
    except FileNotFoundError:
        return False
    # a schedule added again under this name starts afresh (a mark left by a crash
    # here is ignored too: it names the removed schedule's created_ms)
    fsio.unlink(schedules_dir(store) / f"{name}.mark", missing_ok=True)
    fsio.fsync_dir(path.parent)  # a watcher after a crash must not find it again
    return True


class _Mark(msgspec.Struct, forbid_unknown_fields=True):
    last_slot: float
    schedule_ms: int = 0
    """The ``created_ms`` of the schedule it was written for (0: written before it was kept)."""


def last_started_slot(store: Store, name: str, schedule_ms: int | None = None) -> float | None:
    """The newest slot of schedule ``name`` a watcher started a run for (None: none yet).

    Kept in ``<name>.mark`` next to the schedule, so a slot whose run was removed
    since (``afk-local rm``, gc) is never started again. With ``schedule_ms`` (the
    schedule's ``created_ms``), a mark written for an earlier schedule of the same
    name counts as none.
    """
    path = schedules_dir(store) / f"{name}.mark"
    try:
        data = fsio.read_bounded(path, 4096)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.name} unreadable: {exc}") from None
    try:
        mark = msgspec.json.decode(data, type=_Mark)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{path.name} damaged: {exc}; remove it to start over") from None
    if schedule_ms is not None and mark.schedule_ms not in (0, schedule_ms):
        return None
    return mark.last_slot


def _mark(store: Store, schedule: Schedule, slot: float) -> None:
    path = schedules_dir(store) / f"{schedule.name}.mark"
    fsio.atomic_write(path, msgspec.json.encode(_Mark(slot, schedule.created_ms)))


class ScheduleHost(Protocol):
    """What starting scheduled runs needs of the watcher."""

    @property
    def store(self) -> Store:
        """The watched store."""
        ...

    def emit(self, kind: str, run_id: str | None = None, message: str = "", /) -> None:
        """Report an event."""


class Scheduler:
    """Starts the runs of due schedule slots for a watcher (on every sweep)."""

    def __init__(self, host: ScheduleHost) -> None:
        self.host = host
        self._said: dict[str, str] = {}  # schedule file -> the problem reported already

    def start_due_runs(self, now: float | None = None) -> list[str]:
        """Create the run of every due slot of every schedule; returns the ids created here.

        A run that exists already (made by this watcher earlier, by another one, before
        a restart or a reboot) is left alone: create-only is what makes a slot run once.
        A schedule file that cannot be used is reported once (``rejected``) and skipped.
        """
        store = self.host.store
        moment = current_clock().time() if now is None else now
        created: list[str] = []
        seen: set[str] = set()
        for path, schedule in list_schedules(store):
            seen.add(path.name)
            if isinstance(schedule, str):
                self._problem(path, schedule)
                continue
            try:
                created += self._start_due(schedule, moment)
            except (ValueError, ImportError, OSError) as exc:
                self._problem(path, str(exc))
                continue
            self._said.pop(path.name, None)
        for gone in set(self._said) - seen:
            del self._said[gone]
        return created

    def _start_due(self, schedule: Schedule, now: float) -> list[str]:
        """Start the due slots of one schedule, under its lock (one watcher at a time).

        The mark only moves forward and is written after each run is made: a slot at
        or before it never starts again, whatever happened to its run since.
        """
        store = self.host.store
        created: list[str] = []
        with file_lock(schedules_dir(store) / f"{schedule.name}.lock", -1):
            mark = last_started_slot(store, schedule.name, schedule.created_ms)
            if mark is not None and mark > now:
                mark = self._repair_future_mark(schedule, mark, now)
            slots = due_slots(
                schedule.timing,
                now,
                created=schedule.created_ms / 1000,
                catchup=schedule.catchup,
                newest_run=mark,
            )
            slots = [s for s in slots if mark is None or s > mark]
            busy = bool(slots) and schedule.overlap != "allow" and self._unfinished(schedule)
            if slots and busy and schedule.overlap == "queue":
                return []  # the mark stays: the slots are due again once the run ends
            if schedule.overlap == "queue":
                slots = slots[:1]  # one at a time, oldest first
            for slot in slots:
                if busy and schedule.overlap == "skip":
                    self.host.emit(
                        "skipped",
                        schedule.run_id(slot),
                        f"schedule {schedule.name}: its previous run has not finished "
                        "(--overlap skip)",
                    )
                    _mark(store, schedule, slot)
                    mark = slot
                    continue
                run_id = self._start(schedule, slot)
                if run_id is not None:
                    created.append(run_id)
                _mark(store, schedule, slot)
                mark = slot
        return created

    def _unfinished(self, schedule: Schedule) -> bool:
        """True when the schedule's newest run has not ended (created, running, sleeping or
        paused). Run ids sort by slot, so the newest is the greatest of its runs."""
        store = self.host.store
        prefix = f"{schedule.name}--"
        runs = [r for r in store.run_ids() if r.startswith(prefix) and schedule.slot_of(r)]
        if not runs:
            return False
        try:
            return not store.read_meta(max(runs)).status.is_terminal
        except (AfkLocalError, OSError, ValueError):
            return False  # unreadable: the watcher reports it; it holds no slot back

    def _repair_future_mark(self, schedule: Schedule, mark: float, now: float) -> float:
        """A mark past ``now`` was written while the clock was ahead: kept, it would hold
        every slot back until the clock reached it. The slots up to the one before the
        newest due now count as started, so the newest starts (once) and the rest go on.
        """
        latest = schedule.timing.latest(now)
        self.host.emit(
            "repaired",
            None,
            f"schedule {schedule.name}: its mark {_iso(mark)} is in the future (the clock "
            f"was ahead); going on from {_iso(latest)}",
        )
        return latest - 1e-3

    def _problem(self, path: Path, problem: str) -> None:
        if self._said.get(path.name) != problem:
            self._said[path.name] = problem
            self.host.emit("rejected", None, f"schedule {path.name}: {problem}")

    def _start(self, schedule: Schedule, slot: float) -> str | None:
        """Create the run of ``slot`` (create-only); its id, or None when it exists."""
        store = self.host.store
        run_id = schedule.run_id(slot)
        if store.exists(run_id):
            return None
        try:
            writer = store.create(
                run_id,
                entrypoint=schedule.entrypoint,
                params={"args": list(schedule.args), "kwargs": dict(schedule.kwargs)},
                extra=_slot_extra(schedule, slot),
                new_attempt=False,  # the sweep's child makes attempt 1
            )
        except RunExistsError:
            return None  # another watcher made it just now: it runs there
        except AfkLocalError as exc:
            self.host.emit("failed", run_id, f"schedule {schedule.name}: cannot create: {exc}")
            return None
        writer.close()  # status "created", lock free: the sweep resumes it
        self.host.emit("scheduled", run_id, f"schedule {schedule.name}, slot {_iso(slot)}")
        return run_id


def _slot_extra(schedule: Schedule, slot: float) -> dict[str, Any]:
    """The run's ``extra``: where it starts from, and tags naming its schedule and slot."""
    extra: dict[str, Any] = {TAGS_KEY: {SCHEDULE_TAG_KEY: schedule.name, SLOT_TAG_KEY: _iso(slot)}}
    if schedule.origin:
        extra[ORIGIN_KEY] = schedule.origin
    return extra


def _iso(slot: float) -> str:
    return dt.datetime.fromtimestamp(slot, dt.timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "SCHEDULES_DIR",
    "Schedule",
    "ScheduleHost",
    "Scheduler",
    "last_started_slot",
    "list_schedules",
    "read_schedule",
    "remove_schedule",
    "schedule_path",
    "schedules_dir",
    "validate",
    "write_schedule",
]
