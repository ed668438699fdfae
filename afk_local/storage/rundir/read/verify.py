"""What :meth:`RunReader.verify` reports, and the checks of a run's ``latest`` and journal.

Verifying lists problems instead of raising them: a :class:`VerifyReport`
holds every damaged file (:class:`VerifyProblem`) and notes about harmless
oddities (a torn journal tail, effects in doubt, unpublished temp files).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    DecodeBudgetError,
    EffectLogCorruptionError,
    RunNotFoundError,
    SchemaVersionError,
)
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.journal_format import read_journal
from afk_local.storage.format.layout import CheckpointFile, RunPaths, parse_checkpoint_name
from afk_local.storage.format.records import Phase, RunMeta, RunStatus
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.chain import is_signed_file
from afk_local.storage.rundir.read.heads import HeadStore


@dataclass(frozen=True)
class VerifyProblem:
    """One damaged or suspicious file found by :meth:`RunReader.verify`."""

    path: str
    reason: str


@dataclass
class VerifyReport:
    """Everything :meth:`RunReader.verify` checked; problems are listed, never raised."""

    run_id: str
    checked_files: int = 0
    problems: list[VerifyProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is damaged."""
        return not self.problems


def special_checkpoint_names(run_dir: os.PathLike[str] | str) -> list[tuple[str, str]]:
    """``(path, kind)`` for each name in ``run_dir`` that looks like a checkpoint but is a
    FIFO, socket, device, directory or symlink: readers pass over it without opening it,
    so whoever lists checkpoints (``verify``, ``log``) names it."""
    found = []
    with os.scandir(run_dir) as entries:
        for entry in entries:
            name = entry.name
            if parse_checkpoint_name(name) is not None and not entry.is_file(follow_symlinks=False):
                found.append(
                    (entry.path, fsio.file_kind(entry.stat(follow_symlinks=False).st_mode))
                )
    return sorted(found)


def verify_latest(
    paths: RunPaths,
    valid: Sequence[int],
    status: RunStatus | None,
    report: VerifyReport,
    *,
    packed: Callable[[CheckpointFile], bool] | None = None,
) -> None:
    """Check ``latest`` into ``report``: inside the run, and not behind its newest checkpoint.

    ``valid`` are the seqs of the checkpoints that decoded, in order (``packed`` says
    whether one that is not a loose file is in a pack); ``status`` is
    the run's (None when ``run.meta`` is unreadable). A crash between publishing
    checkpoint N and swapping ``latest`` leaves ``latest`` at N-1 (N was never
    acknowledged): a note. ``latest`` further behind, or behind at all once the
    run is paused or terminal (its meta is written only after ``latest`` moved),
    is what a second writer leaves, such as a forked child flushing an old queue:
    a problem, since readers that follow ``latest`` see an older state.
    """
    target = fsio.read_link(paths.latest)
    if target is None:
        if valid:
            report.notes.append("no latest pointer (readers scan instead)")
        return
    parsed = parse_checkpoint_name(target)
    if parsed is None:
        report.problems.append(
            VerifyProblem(str(paths.latest), f"points at {target!r}, outside the run")
        )
        return
    if not (paths.dir / parsed.name).is_file() and not (packed is not None and packed(parsed)):
        report.notes.append(f"latest names missing {target} (ignored; a crash can do this)")
        return
    newest = valid[-1] if valid else 0
    if parsed.seq >= newest or parsed.seq not in valid:
        return  # at the newest, or at a damaged file (reported with that file)
    settled = (
        status is not None and status is not RunStatus.RUNNING and status is not RunStatus.CREATED
    )
    if parsed.seq < newest - 1 or settled:
        report.problems.append(
            VerifyProblem(
                str(paths.latest),
                f"points at checkpoint {parsed.seq}, below the newest valid one ({newest})"
                + (f" of a {status.value} run" if settled and status is not None else "")
                + ": rolled back by a second writer (a forked child's flush?); readers that "
                "follow latest see an older state (resume scans and uses the newest)",
            )
        )
    else:
        report.notes.append(
            f"latest points at checkpoint {parsed.seq}, one below the newest ({newest}): a crash "
            "between publishing it and swapping latest (it was never acknowledged); the next "
            "write moves latest on"
        )


def verify_journal(paths: RunPaths, record_codec: RecordCodec, report: VerifyReport) -> int:
    """Check the run's ``effects.log`` into ``report``; returns how many records are signed.

    Every record is decoded in full (not just the fields the index needs); a torn
    tail and effects in doubt are notes, damage is a problem. A run without a
    journal adds nothing.
    """
    if not paths.journal.exists():
        return 0
    report.checked_files += 1
    try:
        contents = read_journal(paths.journal, paths.run_id, record_codec)
        signed = contents.signed_count
        torn = contents.torn_tail
        if torn is not None:
            report.notes.append(
                f"effects.log: torn tail ignored at offset {torn.offset} "
                f"({torn.dropped_bytes} bytes, {torn.reason}); repaired on next write open"
            )
        doubtful = contents.in_doubt()
        if doubtful:
            keys = ", ".join(repr(key) for key in doubtful[:5])
            more = "..." if len(doubtful) > 5 else ""
            report.notes.append(
                f"effects.log: {len(doubtful)} effect(s) in doubt "
                f"(started, no outcome): {keys}{more}"
            )
    except EffectLogCorruptionError as exc:
        report.problems.append(
            VerifyProblem(str(paths.journal), f"corrupt at byte {exc.offset}: {exc.reason}")
        )
    except OSError as exc:
        report.problems.append(VerifyProblem(str(paths.journal), f"cannot read: {exc.strerror}"))
    else:
        return signed
    return 0


class ColdRun(Protocol):
    """What a cold verify reads of a run: a fresh :class:`~.reader.RunReader` is one.

    Declared here so that verify, which the reader calls, never imports the reader.
    """

    paths: RunPaths
    run_id: str

    @property
    def record_codec(self) -> RecordCodec:
        """The codec the run is decoded (and its signatures checked) with."""
        ...

    @property
    def catalog(self) -> RunCatalog:
        """Where the run's checkpoints are."""
        ...

    @property
    def heads(self) -> HeadStore | None:
        """The store's head records, in a keyed store."""
        ...

    def checkpoint_files(self) -> list[CheckpointFile]:
        """Every live checkpoint, in seq order."""
        ...

    def read_meta(self) -> RunMeta:
        """The run's ``run.meta``, read now."""
        ...

    def meta_file_torn(self) -> str | None:
        """Why ``run.meta`` is torn when its terminal checkpoint's copy stands in for it."""
        ...

    def load_chained(
        self, file: CheckpointFile, names: dict[int, str], macs: dict[int, bytes]
    ) -> bytes | None:
        """Decode ``file`` with its chains; its MAC, if any."""
        ...

    def decode_budget(self, files: list[CheckpointFile]) -> AbstractContextManager[None]:
        """Bound the delta frames one pass over ``files`` may follow."""
        ...


def verify_cold(run: ColdRun) -> VerifyReport:
    """Check every file of ``run`` as read by a fresh reader; problems are reported."""
    report = VerifyReport(run.run_id)
    signed = 0
    status: RunStatus | None = None
    try:
        status = run.read_meta().status
        report.checked_files += 1
        torn = run.meta_file_torn()
        if torn is not None:  # a power cut during its unsynced rewrite: nothing is lost
            report.notes.append(
                f"run.meta: torn ({torn}); read from its copy in the terminal checkpoint"
            )
        signed += run.record_codec.signer is None and is_signed_file(run.paths.meta)
    except (CheckpointCorruptionError, RunNotFoundError) as exc:
        report.problems.append(VerifyProblem(str(run.paths.meta), str(exc)))
    except SchemaVersionError as exc:
        report.problems.append(VerifyProblem(str(run.paths.meta), _newer_schema(exc)))
    files = run.checkpoint_files()
    problem = run.catalog.manifest_problem
    if problem is not None:
        report.problems.append(VerifyProblem(problem.path, problem.reason))
    _note_garbage(run, report)
    names = {f.seq: f.name for f in files}
    macs: dict[int, bytes] = {}  # MACs of the files read so far: the next one chains on them
    valid: list[int] = []
    with run.decode_budget(files):
        for file in files:
            report.checked_files += 1
            own = run.catalog.location(file)
            try:
                mac = run.load_chained(file, names, macs)
                valid.append(file.seq)
                if mac is not None:
                    signed += 1
                    macs[file.seq] = mac
            except DecodeBudgetError as exc:
                report.problems.append(VerifyProblem(exc.path, exc.reason))
                break
            except CheckpointCorruptionError as exc:
                reason = exc.reason
                if exc.path != own:
                    base = os.path.basename(exc.path)
                    reason = f"its delta base {base} is damaged ({reason})"
                report.problems.append(VerifyProblem(own, reason))
            except SchemaVersionError as exc:
                report.problems.append(VerifyProblem(own, _newer_schema(exc)))
    verify_latest(run.paths, valid, status, report, packed=lambda file: _is_packed(run, file))
    _verify_terminal(run.paths, files, status, report)
    _verify_packs(run, report)
    lock_problem = fsio.regular_file_problem(run.paths.lock)
    if lock_problem is not None:
        report.problems.append(
            VerifyProblem(
                str(run.paths.lock),
                f"{lock_problem}: nobody can own the run; remove it once no process uses it",
            )
        )
    temps = []
    with os.scandir(run.paths.dir) as entries:
        temps = [entry.name for entry in entries if entry.name.startswith(fsio.TEMP_PREFIX)]
    for path, kind in special_checkpoint_names(run.paths.dir):
        report.problems.append(VerifyProblem(path, f"is a {kind}, not a regular file (ignored)"))
    try:
        latest_mode = os.lstat(run.paths.latest).st_mode
    except OSError:
        latest_mode = stat.S_IFLNK
    if not (stat.S_ISLNK(latest_mode) or stat.S_ISREG(latest_mode)):
        report.problems.append(
            VerifyProblem(
                str(run.paths.latest),
                f"is a {fsio.file_kind(latest_mode)}, not a symlink or pointer file (ignored)",
            )
        )
    if temps:
        report.notes.append(f"{len(temps)} unpublished temp file(s), removed on next open")
    signed += verify_journal(run.paths, run.record_codec, report)
    if run.heads is not None:
        _verify_head(run, report)
    if signed and run.record_codec.signer is None:
        report.notes.append(
            f"{signed} signed file(s)/record(s): signatures not checked, this store has no "
            "key (set AFK_LOCAL_KEY or pass Store(key=...))"
        )
    return report


def _verify_terminal(
    paths: RunPaths, files: Sequence[CheckpointFile], status: RunStatus | None, report: VerifyReport
) -> None:
    """A completed run ends with its ``run_terminal`` checkpoint (written before the meta
    says completed): a completed meta without it is ahead of the files it describes
    (a copy missing its newest files), and its result would read as None."""
    if status is not RunStatus.COMPLETED:
        return
    newest = files[-1] if files else None
    if newest is None or newest.phase != Phase.RUN_TERMINAL.value:
        where = f"checkpoint {newest.seq} ({newest.phase})" if newest is not None else "none"
        report.problems.append(
            VerifyProblem(
                str(paths.meta),
                f"says completed, but the run's newest checkpoint is {where}, not its "
                "run_terminal checkpoint: the meta is ahead of the files (files missing)",
            )
        )


def _verify_packs(run: ColdRun, report: VerifyReport) -> None:
    """Every live pack file: header, index, MAC and every block (its entries were loaded)."""
    from afk_local.storage.format.pack import verify_pack  # noqa: PLC0415

    try:
        packs = run.catalog.live()[1]  # garbage packs are no longer part of the run
    except CheckpointCorruptionError:
        packs = run.catalog.packs()  # the manifest is reported already
    for pack in packs:
        report.checked_files += 1
        path = str(run.paths.dir / pack.name)
        try:
            problems = verify_pack(run.catalog.pack_reader(pack).index)
        except FileNotFoundError:
            continue  # merged into another pack meanwhile
        except CheckpointCorruptionError as exc:
            problems = [exc.reason]
        report.problems += [VerifyProblem(path, reason) for reason in problems]


def _note_garbage(run: ColdRun, report: VerifyReport) -> None:
    """Note the copies an interrupted rewrite left that the manifest does not name."""
    try:
        manifest = run.catalog.manifest()
        loose, packs = run.catalog.scan()
    except (CheckpointCorruptionError, OSError):
        return
    if manifest is None:
        return
    stale = [f.name for f in loose if f.seq < manifest.loose_from]
    stale += [p.name for p in packs if p.name not in manifest.packs]
    if stale:
        report.notes.append(
            f"{len(stale)} file(s) the MANIFEST does not name, left by an interrupted "
            f"rewrite (ignored; the next pack or gc removes them): {', '.join(stale[:3])}"
            + ("..." if len(stale) > 3 else "")
        )


def _is_packed(run: ColdRun, file: CheckpointFile) -> bool:
    try:
        return run.catalog.packed(file.seq) is not None
    except CheckpointCorruptionError:
        return False


def _verify_head(run: ColdRun, report: VerifyReport) -> None:
    """Compare the run with its head record (keyed stores: rollback protection)."""

    assert run.heads is not None

    def updated() -> int | None:  # read after the head: a writer may be at work beside us
        try:
            return run.read_meta().updated_ms
        except AfkLocalError:
            return None

    for reason in run.heads.behind(run.paths, updated):
        report.problems.append(VerifyProblem(str(run.paths.dir), f"rolled back: {reason}"))
    try:
        present = run.heads.read(run.run_id) is not None
    except ValueError as exc:
        report.notes.append(f"{exc}: rollback is not checked until the run is next written")
        return
    if not present:
        report.notes.append(
            "no head record: rollback is not checked for this run until it is next "
            "written (it predates rollback protection, or the store moved)"
        )


def _newer_schema(exc: SchemaVersionError) -> str:
    return (
        f"schema version {exc.found} (this afk_local reads up to {exc.supported}): "
        "written by a newer afk_local; upgrade to read it"
    )
