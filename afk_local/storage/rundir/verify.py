"""What :meth:`RunReader.verify` reports, and the checks of a run's ``latest`` and journal.

Verifying lists problems instead of raising them: a :class:`VerifyReport`
holds every damaged file (:class:`VerifyProblem`) and notes about harmless
oddities (a torn journal tail, effects in doubt, unpublished temp files).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from afk_local.errors import EffectLogCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.journal_format import read_journal
from afk_local.storage.format.layout import CheckpointFile, RunPaths, parse_checkpoint_name
from afk_local.storage.format.records import RunStatus


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
