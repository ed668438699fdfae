"""Reading one run directory: checkpoints, their signatures, latest, resume state, verify.

A :class:`RunReader` takes no lock and never writes. ``latest`` is followed
when it is sound; when it is missing, dangling, outside the run, not a
checkpoint or corrupt, the reader scans for the newest valid checkpoint and
records what it skipped in :attr:`RunReader.skipped`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from afk_local.errors import (
    CheckpointCorruptionError,
    CheckpointNotFoundError,
    DecodeBudgetError,
)
from afk_local.storage.format.layout import (
    CheckpointFile,
)
from afk_local.storage.format.records import (
    Checkpoint,
    Effect,
    Phase,
    RunStatus,
)
from afk_local.storage.rundir.read.loading import (
    _MOVED_RETRIES,
    MAX_META_BYTES,
    RunLoader,
    Skipped,
    _read_budget,
    meta_file_torn,
    read_meta,
    read_meta_file,
)

# verify, the effect journal, metrics and the notebook view are imported where they are
# used: reading a checkpoint (a cold start, a LangGraph get_tuple) needs none of them.
if TYPE_CHECKING:
    from afk_local.storage.rundir.read.metrics import MetricLog
    from afk_local.storage.rundir.read.verify import VerifyReport

log = logging.getLogger("afk_local")


class ResumeState(msgspec.Struct, frozen=True):
    """What a resumed run starts from (the resume contract of docs/agent.md)."""

    run_id: str
    status: RunStatus
    terminal: bool
    """True when the run completed: return :attr:`result`, run nothing."""
    result: Any
    checkpoint: Checkpoint | None
    """The newest usable ``runtime_state`` checkpoint (None when there is none yet)."""
    latest_seq: int
    skipped: tuple[Skipped, ...] = ()

    @property
    def state(self) -> Any:
        """The payload of :attr:`checkpoint`, or None."""
        return None if self.checkpoint is None else self.checkpoint.payload


class RunReader(RunLoader):
    """A read-only view of one run. Takes no lock; safe while a writer is active."""

    def _repr_html_(self) -> str | None:
        """Notebook view: the run and its recent checkpoints.

        The view lives above this layer (``storage.views.notebook``); a reader from
        :meth:`Store.open <afk_local.storage.store.Store.open>` is handed it. Without
        one, None tells Jupyter to show the plain ``repr``.
        """
        return None if self._html_view is None else self._html_view(self)

    def history(self, *, skip_moved: bool = True) -> list[Checkpoint]:
        """Every valid checkpoint in seq order; damaged ones are skipped and recorded.

        With ``skip_moved=False`` a checkpoint that a rewrite deleted while it was read
        (:attr:`CheckpointCorruptionError.moved`) raises instead: the history would not
        be one instant of the run (export asks for that and reads again).
        """
        result = []
        files = self.checkpoint_files()
        with self._chain.budget(_read_budget(files)):
            for file in files:
                try:
                    result.append(self.load(file))
                except DecodeBudgetError:
                    raise
                except CheckpointCorruptionError as exc:
                    if exc.moved and not skip_moved:
                        raise
                    self._skip(file.name, exc.reason)
        return result

    def resume_state(self, *, on_corrupt: str = "raise") -> ResumeState:
        """The terminal result of a completed run, or the newest usable ``runtime_state``.

        Args:
            on_corrupt: ``"raise"`` (a damaged newest snapshot raises
                :class:`CheckpointCorruptionError` naming it) or ``"fallback"``
                (use the newest readable one and record the skipped files).
        """
        if on_corrupt not in ("raise", "fallback"):
            raise ValueError("on_corrupt must be 'raise' or 'fallback'")
        status = self.meta.status
        wanted = Phase.RUN_TERMINAL.value if status is RunStatus.COMPLETED else None
        skipped: list[Skipped] = []
        files = self.checkpoint_files()
        latest_seq = files[-1].seq if files else 0
        with self._chain.budget(_read_budget(files)):
            return self._resume_state(
                files, wanted, status, latest_seq, skipped=skipped, on_corrupt=on_corrupt
            )

    def _resume_state(
        self,
        files: list[CheckpointFile],
        wanted: str | None,
        status: RunStatus,
        latest_seq: int,
        *,
        skipped: list[Skipped],
        on_corrupt: str,
    ) -> ResumeState:
        for file in reversed(files):
            if file.phase not in (wanted, Phase.RUNTIME_STATE.value):
                continue
            try:
                record = self.load(file)
            except CheckpointCorruptionError as exc:
                if on_corrupt == "raise" or isinstance(exc, DecodeBudgetError):
                    raise
                skipped.append(Skipped(file.name, exc.reason))
                self._skip(file.name, exc.reason)
                continue
            if record.phase == Phase.RUN_TERMINAL.value:
                payload = record.payload if isinstance(record.payload, dict) else {}
                return ResumeState(
                    self.run_id,
                    status,
                    True,
                    payload.get("terminal_result"),
                    None,
                    latest_seq,
                    tuple(skipped),
                )
            return ResumeState(self.run_id, status, False, None, record, latest_seq, tuple(skipped))
        return ResumeState(self.run_id, status, False, None, None, latest_seq, tuple(skipped))

    def verify(self) -> VerifyReport:
        """Check every file of the run; problems are reported, not raised.

        Always decodes cold, from the bytes on disk (a fresh reader: no cached base can
        hide a missing one). When a rewrite published while it read and something looked
        damaged, it checks again against the new view.
        """
        from afk_local.storage.rundir.read.verify import verify_cold  # noqa: PLC0415

        report = None
        for _ in range(_MOVED_RETRIES):
            token = self._catalog.view_token()
            cold = RunReader(
                self.paths,
                record_codec=self._codec,
                max_record_bytes=self._max_bytes,
                heads=self._heads,
                env=self.env,
            )
            report = verify_cold(cold)
            if report.ok or self._catalog.view_token() == token:
                return report
        assert report is not None
        return report

    # -- what a cold verify reads (rundir/read/verify.py) -------------------------------

    def effects(self) -> list[Effect]:
        """Every record of the effect journal in file order (a torn tail is ignored).

        Raises:
            EffectLogCorruptionError: a damaged record with good records after it.
        """
        from afk_local.storage.format.journal_format import read_journal  # noqa: PLC0415

        return read_journal(self.paths.journal, self.run_id, self._codec).records

    def metrics(self) -> MetricLog:
        """Every ``ctx.metric`` point of the run, in order, those gc archived included."""
        from afk_local.storage.rundir.read.metrics import read_metrics  # noqa: PLC0415

        return read_metrics(self)


__all__ = [
    "MAX_META_BYTES",
    "CheckpointNotFoundError",
    "DecodeBudgetError",
    "ResumeState",
    "RunReader",
    "Skipped",
    "meta_file_torn",
    "read_meta",
    "read_meta_file",
]
