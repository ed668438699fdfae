"""Judging one crash state: open the store as a new process would and hold it to its promises.

:func:`check_state` reads every run (``verify``, ``latest``), checks each
acknowledged checkpoint and effect outcome, checks that every side effect that
ran had a durable intent, then resumes the workload and checks what the resume
returned, which side effects it ran again and that every run still verifies.
It returns the problems found, as sentences; an empty list means the state
recovers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from afk_local.errors import AfkLocalError, CheckpointCorruptionError, EffectLogCorruptionError
from afk_local.storage.format.journal_format import JournalContents, read_journal
from afk_local.storage.ops.removal import REMOVED_DIR
from afk_local.storage.rundir.read.reader import CheckpointNotFoundError, RunReader
from afk_local.storage.store import Store
from afk_local.storage.store_identity import read_identity
from afk_local.testing.crashsim.jobs import EffectLedger, use_probe
from afk_local.testing.crashsim.trace import (
    Ack,
    CheckpointAck,
    ClaimAck,
    DoneAck,
    EffectCall,
    GoneAck,
    KeptAck,
    MetaAck,
    MetricsAck,
    OutcomeAck,
    RemovedAck,
    UnrecordedAck,
    meta_field,
    run_listing,
)
from afk_local.testing.crashsim.workloads import InDoubt, Workload


def check_state(
    root: Path, workload: Workload, acks: tuple[Ack, ...], calls: tuple[EffectCall, ...]
) -> list[str]:
    """The problems of the crash state under ``root`` (``root/store`` is the store).

    ``acks`` and ``calls`` are the promises and side effects that bind this state
    (those made before the crash).
    """
    store = workload.store(root / "store")  # its head records are the crash state's
    acked: dict[str, int] = {}
    for ack in sorted(acks, key=lambda a: a.at):
        if isinstance(ack, (KeptAck, RemovedAck, GoneAck, ClaimAck)):
            continue  # a kept file or a claim names no run; a removed one may be gone
        if isinstance(ack, DoneAck) and ack.names is None:
            continue  # deleted, and stays so
        acked.setdefault(ack.run_id, ack.at)
    for ack in acks:
        if isinstance(ack, RemovedAck):
            acked.pop(ack.run_id, None)
    problems: list[str] = []
    try:  # a crash never damages the store's own files (resumes from the CLI read it)
        read_identity(store.root, store.codec.signer)
    except AfkLocalError as exc:
        problems.append(f"the store's identity: {exc}")
    journals: dict[str, JournalContents] = {}
    for run_id in store.run_ids():
        if not store.paths(run_id).meta.exists():
            if run_id in acked:
                problems.append(f"run {run_id}: run.meta is missing")
            continue
        problems += _check_run(store, run_id, "")
        with contextlib.suppress(EffectLogCorruptionError, OSError):  # verify reported it
            journals[run_id] = read_journal(store.paths(run_id).journal, run_id, store.codec)
    journals.update(_kept_journals(store))
    present = set(store.run_ids())
    for run_id, at in acked.items():
        if run_id not in present:
            problems.append(f"run {run_id} (acknowledged after call #{at}) is missing")
    problems += _check_acks(store, acks, journals)
    problems += _check_intents(calls, journals)
    if problems:
        return problems
    return _check_resume(store, workload, acked, calls, journals)


def _check_run(store: Store, run_id: str, when: str) -> list[str]:
    """``verify`` finds nothing, and ``latest`` never names an unreadable file."""
    try:
        reader = store.open(run_id)
        report = reader.verify()
    except AfkLocalError as exc:
        return [f"{when}run {run_id}: cannot be opened: {exc}"]
    problems = [
        f"{when}run {run_id}: verify: {os.path.basename(p.path)}: {p.reason}"
        for p in report.problems
    ]
    named = reader.latest_file()
    if named is not None and (reader.paths.dir / named.name).is_file():
        try:
            reader.load(named)
        except CheckpointCorruptionError as exc:
            problems.append(
                f"{when}run {run_id}: latest names {named.name}, unreadable: {exc.reason}"
            )
    try:
        reader.latest()
    except AfkLocalError as exc:
        problems.append(f"{when}run {run_id}: latest() raised {type(exc).__name__}: {exc}")
    return problems


def _check_acks(
    store: Store, acks: tuple[Ack, ...], journals: dict[str, JournalContents]
) -> list[str]:
    problems = []
    readers: dict[str, RunReader] = {}
    newest: dict[str, CheckpointAck] = {}
    for ack in acks:
        if isinstance(ack, DoneAck):
            problems += _check_done(store, ack)
            continue
        if isinstance(ack, KeptAck):
            problems += _check_kept(store, ack)
            continue
        if isinstance(ack, GoneAck):
            if os.path.lexists(os.path.normpath(store.root / ack.path)):
                problems.append(f"{ack.path} (removed after call #{ack.at}) is back")
            continue
        if isinstance(ack, RemovedAck):
            continue
        if isinstance(ack, UnrecordedAck):
            problems += _check_unrecorded(ack, journals.get(ack.run_id))
            continue
        if isinstance(ack, ClaimAck):
            try:
                found = ack.problem(store)
            except Exception as exc:  # a claim that cannot even be checked is broken
                found = f"checking it raised {type(exc).__name__}: {exc}"
            if found is not None:
                problems.append(f"{ack.what} (acknowledged after call #{ack.at}): {found}")
            continue
        if not store.exists(ack.run_id):
            continue  # reported as a missing run
        if isinstance(ack, CheckpointAck):
            if ack.run_id not in readers:
                try:
                    readers[ack.run_id] = store.open(ack.run_id)
                except AfkLocalError:
                    continue  # reported by _check_run
            if ack.run_id not in newest or ack.seq > newest[ack.run_id].seq:
                newest[ack.run_id] = ack
            what = f"run {ack.run_id}: checkpoint {ack.seq} (acknowledged after call #{ack.at})"
            problems += _cold_get(store, ack, what)
        elif isinstance(ack, OutcomeAck):
            problems += _check_outcome(ack, journals.get(ack.run_id))
        elif isinstance(ack, MetricsAck):
            try:
                points = tuple(store.open(ack.run_id).metrics().to_records())
            except AfkLocalError as exc:
                problems.append(f"run {ack.run_id}: its metrics cannot be read: {exc}")
                continue
            if points != ack.points:
                problems.append(
                    f"run {ack.run_id}: {len(points)} metric points read back, not the "
                    f"{len(ack.points)} acknowledged after call #{ack.at}"
                )
        elif isinstance(ack, MetaAck):
            try:
                value = meta_field(store.read_meta(ack.run_id), ack.field)
            except AfkLocalError:
                continue  # reported by _check_run
            if value != ack.value:
                problems.append(
                    f"run {ack.run_id}: run.meta {ack.field} is {value!r}, not {ack.value!r} "
                    f"as acknowledged after call #{ack.at}"
                )
        else:
            try:
                status = store.read_meta(ack.run_id).status.value
            except AfkLocalError:
                continue  # reported by _check_run
            if status != ack.status:
                problems.append(
                    f"run {ack.run_id}: status is {status}, not {ack.status} as acknowledged "
                    f"after call #{ack.at}"
                )
    for run_id, ack in newest.items():
        try:
            cold = store.open(run_id)  # a new reader: nothing decoded yet
            cold.resume_state()
        except AfkLocalError as exc:
            problems.append(
                f"run {run_id}: resume_state() raised {type(exc).__name__}: {exc} (newest "
                f"acknowledged checkpoint {ack.seq}, after call #{ack.at})"
            )
        latest = readers[run_id].latest()
        if latest is None or latest.seq < ack.seq:
            shown = "nothing" if latest is None else f"checkpoint {latest.seq}"
            problems.append(
                f"run {run_id}: latest is {shown}, older than checkpoint {ack.seq} "
                f"(acknowledged after call #{ack.at})"
            )
    return problems


_KEPT_NAME = re.compile(r"^(?P<run>.+)\.\d{8}T\d{6}Z(?:\.\d+)?$")


def _kept_journals(store: Store) -> dict[str, JournalContents]:
    """The journals ``afk-local rm`` kept under ``removed/``, by directory (an effect whose
    run was removed has its intent there)."""
    found: dict[str, JournalContents] = {}
    removed = store.root / REMOVED_DIR
    for directory in sorted(removed.iterdir()) if removed.is_dir() else []:
        match = _KEPT_NAME.match(directory.name)
        journal = directory / "effects.log"
        if match is None or not journal.is_file():
            continue
        with contextlib.suppress(EffectLogCorruptionError, OSError):
            found[f"{REMOVED_DIR}/{directory.name}"] = read_journal(
                journal, match["run"], store.codec
            )
    return found


def _check_kept(store: Store, ack: KeptAck) -> list[str]:
    # normpath: a file beside the store (../export.json) is there even when the crash
    # left no store directory to go up from
    path = Path(os.path.normpath(store.root / ack.path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [f"{ack.path} (kept after call #{ack.at}) is missing: {exc.strerror}"]
    if hashlib.sha256(data).hexdigest() != ack.sha256:
        return [f"{ack.path} (kept after call #{ack.at}) holds other bytes ({len(data)} now)"]
    return []


def _check_done(store: Store, ack: DoneAck) -> list[str]:
    """A rewrite that returned stays done: the run directory as it left it."""
    what = f"run {ack.run_id}: {ack.what} returned after call #{ack.at}"
    now = run_listing(store, ack.run_id)
    if now is None:
        return [] if ack.names is None else [f"{what}, and the run is gone"]
    if ack.names is None:
        return [f"{what} and deleted it, and it is back"]
    left, found = dict(ack.names), dict(now)
    problems = [
        f"{what}, and {n} (which it removed) is back" for n in sorted(set(found) - set(left))
    ]
    problems += [f"{what}, and {n} (which it left) is gone" for n in sorted(set(left) - set(found))]
    problems += [
        f"{what}, and {n} is not as it left it"
        for n in sorted(set(left) & set(found))
        if left[n] != found[n]
    ]
    return problems


def _cold_get(store: Store, ack: CheckpointAck, what: str) -> list[str]:
    """Decode checkpoint ``ack.seq`` cold: a new reader, no chain decoded before it, as a
    new process would (a reader that decoded the chain in order may hold a base that
    the files on disk no longer give)."""
    try:
        if store.open(ack.run_id).get(ack.seq).payload != ack.payload:
            return [f"{what} holds another payload"]
    except CheckpointNotFoundError:
        return [f"{what} is missing"]
    except CheckpointCorruptionError as exc:
        return [f"{what} is unreadable: {exc.reason}"]
    except AfkLocalError as exc:
        return [f"{what}: reading it raised {type(exc).__name__}: {exc}"]
    return []


def _check_outcome(ack: OutcomeAck, journal: JournalContents | None) -> list[str]:
    records = journal.records if journal is not None else []
    outcome = None
    for record in records:
        if record.key == ack.key and record.kind == "outcome":
            outcome = record
    what = f"run {ack.run_id}: outcome of effect {ack.key!r} (acknowledged after call #{ack.at})"
    if outcome is None:
        return [f"{what} is missing from effects.log"]
    if (outcome.status, outcome.result) != (ack.status, ack.result):
        return [f"{what} reads back as another outcome"]
    return []


def _check_unrecorded(ack: UnrecordedAck, journal: JournalContents | None) -> list[str]:
    """No record of a key whose append raised is read back (the writer cut it durably)."""
    found = [r.kind for r in (journal.records if journal is not None else []) if r.key == ack.key]
    if not found:
        return []
    return [
        f"run {ack.run_id}: effects.log holds {'/'.join(found)} of {ack.key!r}, whose append "
        f"raised (a failed fsync) after call #{ack.at}: the cut back to the durable end was lost"
    ]


def _effect_states(journals: dict[str, JournalContents]) -> dict[str, str]:
    """Idempotency key -> ``in doubt``, ``ok`` or ``error``: each journaled call's state."""
    states: dict[str, str] = {}
    idempotency: dict[tuple[str, str], str] = {}
    for run_id, journal in journals.items():
        for record in journal.records:
            if record.kind == "intent" and record.idempotency_key:
                idempotency[(run_id, record.key)] = record.idempotency_key
                states[record.idempotency_key] = "in doubt"
            elif (run_id, record.key) in idempotency and record.status is not None:
                states[idempotency[(run_id, record.key)]] = record.status
    return states


def _check_intents(
    calls: tuple[EffectCall, ...], journals: dict[str, JournalContents]
) -> list[str]:
    """Every side effect that ran had its intent durable first (DESIGN §3, effect journal)."""
    states = _effect_states(journals)
    return [
        f"effect {call.label!r} ran after call #{call.at}, but its intent is not in effects.log: "
        "a resume would run it again unknowingly"
        for call in calls
        if call.idempotency_key not in states
    ]


def _check_resume(
    store: Store,
    workload: Workload,
    acked: dict[str, int],
    calls: tuple[EffectCall, ...],
    journals: dict[str, JournalContents],
) -> list[str]:
    ledger = EffectLedger()
    previous = use_probe(ledger)
    try:
        outcomes = workload.resume(store)
    except Exception as exc:
        return [f"resume failed: {type(exc).__name__}: {exc}"]
    finally:
        use_probe(previous)
    states = _effect_states(journals)
    problems = []
    for run_id, want in workload.expected.items():
        if run_id not in outcomes:
            if run_id in acked:
                problems.append(f"run {run_id} was not resumed")
            continue
        got: Any = outcomes[run_id]
        if isinstance(got, InDoubt):
            if not _in_doubt(journals.get(run_id), got.key):
                problems.append(
                    f"resume of {run_id} stopped at {got.key!r} as in doubt, which it is not"
                )
        elif got != want:
            problems.append(f"resume of {run_id} returned {got!r}, not {want!r}")
    before = {call.idempotency_key: call for call in calls}
    for key, count in Counter(key for key, _ in ledger.calls).items():
        label = next(label for k, label in ledger.calls if k == key)
        state = states.get(key)
        if count > 1:
            problems.append(f"effect {label!r} ran {count} times in one resume")
        if state == "ok":
            problems.append(
                f"effect {label!r} ran again on resume although its outcome was durable"
            )
        elif state is None and key in before:
            problems.append(
                f"effect {label!r} ran after call #{before[key].at} and again on resume: "
                "its intent was lost"
            )
    for run_id in store.run_ids():
        if store.paths(run_id).meta.exists():
            problems += _check_run(store, run_id, "after resume: ")
    return problems


def _in_doubt(journal: JournalContents | None, key: str) -> bool:
    last = None
    for record in journal.records if journal is not None else []:
        if record.key == key:
            last = record.kind
    return last == "intent"


__all__ = ["check_state"]
