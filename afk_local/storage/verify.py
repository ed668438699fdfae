"""What :meth:`RunReader.verify` reports, and the check of a run's effect journal.

Verifying lists problems instead of raising them: a :class:`VerifyReport`
holds every damaged file (:class:`VerifyProblem`) and notes about harmless
oddities (a torn journal tail, effects in doubt, unpublished temp files).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from afk_local.errors import EffectLogCorruptionError
from afk_local.storage.codec import RecordCodec
from afk_local.storage.journal_format import read_journal
from afk_local.storage.layout import RunPaths


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
