"""afk_local: file-based, local-first checkpoints for long Python jobs.

A run is a directory of immutable, compressed, checksummed checkpoint files and
an effect journal; a crashed run resumes from its last checkpoint without
repeating side effects. docs/ holds the format, the guarantees and the API.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afk_local.storage.rundir import effects as _effects_seam

if TYPE_CHECKING:
    from afk_local.agent.agent_runner import AgentRunner
    from afk_local.agent.factory import AgentFactory, agent_factory
    from afk_local.agent.resume import aresume, resume
    from afk_local.agent.types import Agent, AgentResult, LLMResponse, ToolCall
    from afk_local.errors import (
        AfkLocalError,
        CheckpointCorruptionError,
        CodeChangedError,
        EffectInDoubtError,
        EffectLogCorruptionError,
        EffectMismatchError,
        ForkedWriterError,
        InvalidRunIdError,
        KeyRequiredError,
        LeaseLostError,
        MirrorError,
        PauseMismatchError,
        RecordTooDeepError,
        RunCancelledError,
        RunExistsError,
        RunLockedError,
        RunNotFoundError,
        RunPaused,
        RunRolledBackError,
        SchemaVersionError,
        UntrustedStoreError,
        WriterFailedError,
    )
    from afk_local.journal.journal import Journal
    from afk_local.journal.replay import ReplayedError, input_hash
    from afk_local.runner.cancel import cancel
    from afk_local.runner.durable_function import DurableFunction, durable
    from afk_local.runner.run_context import RunContext
    from afk_local.runner.state_checkpoint import StateCheckpoint
    from afk_local.runner.versions import CodeChangedWarning, migration
    from afk_local.runner.writer import DurableWriter
    from afk_local.storage.format.codec import RecordCodec
    from afk_local.storage.format.records import (
        SCHEMA_VERSION,
        Checkpoint,
        Effect,
        ErrorInfo,
        Phase,
        RunMeta,
        RunStatus,
    )
    from afk_local.storage.rundir.mirror import RunMirror
    from afk_local.storage.rundir.reader import CheckpointNotFoundError, ResumeState, RunReader
    from afk_local.storage.rundir.verify import VerifyReport
    from afk_local.storage.rundir.writer import RunWriter
    from afk_local.storage.store import Store
    from afk_local.storage.views.run_info import RunInfo

# Public names and the module each lives in. Imported on first use (PEP 562), so that
# ``import afk_local.integrations.langgraph`` (a saver in a fresh process) or the CLI
# pays only for the layers it uses, not for the runner, agent and watcher.
_EXPORTS = {
    "AgentRunner": "afk_local.agent.agent_runner",
    "AgentFactory": "afk_local.agent.factory",
    "agent_factory": "afk_local.agent.factory",
    "aresume": "afk_local.agent.resume",
    "resume": "afk_local.agent.resume",
    "Agent": "afk_local.agent.types",
    "AgentResult": "afk_local.agent.types",
    "LLMResponse": "afk_local.agent.types",
    "ToolCall": "afk_local.agent.types",
    "AfkLocalError": "afk_local.errors",
    "CheckpointCorruptionError": "afk_local.errors",
    "CodeChangedError": "afk_local.errors",
    "EffectInDoubtError": "afk_local.errors",
    "EffectLogCorruptionError": "afk_local.errors",
    "EffectMismatchError": "afk_local.errors",
    "ForkedWriterError": "afk_local.errors",
    "InvalidRunIdError": "afk_local.errors",
    "KeyRequiredError": "afk_local.errors",
    "LeaseLostError": "afk_local.errors",
    "MirrorError": "afk_local.errors",
    "PauseMismatchError": "afk_local.errors",
    "RecordTooDeepError": "afk_local.errors",
    "RunCancelledError": "afk_local.errors",
    "RunExistsError": "afk_local.errors",
    "RunLockedError": "afk_local.errors",
    "RunNotFoundError": "afk_local.errors",
    "RunPaused": "afk_local.errors",
    "RunRolledBackError": "afk_local.errors",
    "SchemaVersionError": "afk_local.errors",
    "UntrustedStoreError": "afk_local.errors",
    "WriterFailedError": "afk_local.errors",
    "Journal": "afk_local.journal.journal",
    "ReplayedError": "afk_local.journal.replay",
    "input_hash": "afk_local.journal.replay",
    "cancel": "afk_local.runner.cancel",
    "DurableFunction": "afk_local.runner.durable_function",
    "durable": "afk_local.runner.durable_function",
    "RunContext": "afk_local.runner.run_context",
    "StateCheckpoint": "afk_local.runner.state_checkpoint",
    "CodeChangedWarning": "afk_local.runner.versions",
    "migration": "afk_local.runner.versions",
    "DurableWriter": "afk_local.runner.writer",
    "CheckpointNotFoundError": "afk_local.storage.rundir.reader",
    "ResumeState": "afk_local.storage.rundir.reader",
    "RunReader": "afk_local.storage.rundir.reader",
    "SCHEMA_VERSION": "afk_local.storage.format.records",
    "Checkpoint": "afk_local.storage.format.records",
    "Effect": "afk_local.storage.format.records",
    "ErrorInfo": "afk_local.storage.format.records",
    "Phase": "afk_local.storage.format.records",
    "RunMeta": "afk_local.storage.format.records",
    "RunStatus": "afk_local.storage.format.records",
    "RunWriter": "afk_local.storage.rundir.writer",
    "RunInfo": "afk_local.storage.views.run_info",
    "Store": "afk_local.storage.store",
    "VerifyReport": "afk_local.storage.rundir.verify",
}

__version__ = "0.1.0"


def _open_journal(
    path: Path,
    run_id: str,
    *,
    record_codec: RecordCodec,
    listener: RunMirror | None,
    on_durable: Callable[[int, bytes], None] | None,
) -> Journal:
    """Open a run's effect journal for its writer (imported on a run's first effect)."""
    from afk_local.journal.journal import Journal  # noqa: PLC0415

    return Journal(
        path,
        run_id,
        writable=True,
        record_codec=record_codec,
        listener=listener,
        on_durable=on_durable,
    )


# The composition root: storage may not import the journal above it, so the run's
# writer opens ``effects.log`` through this opener (afk_local/storage/rundir/effects.py).
_effects_seam.register_journal_opener(_open_journal)

__all__ = [
    "SCHEMA_VERSION",
    "AfkLocalError",
    "Agent",
    "AgentFactory",
    "AgentResult",
    "AgentRunner",
    "Checkpoint",
    "CheckpointCorruptionError",
    "CheckpointNotFoundError",
    "CodeChangedError",
    "CodeChangedWarning",
    "DurableFunction",
    "DurableWriter",
    "Effect",
    "EffectInDoubtError",
    "EffectLogCorruptionError",
    "EffectMismatchError",
    "ErrorInfo",
    "ForkedWriterError",
    "InvalidRunIdError",
    "Journal",
    "KeyRequiredError",
    "LLMResponse",
    "LeaseLostError",
    "MirrorError",
    "PauseMismatchError",
    "Phase",
    "RecordTooDeepError",
    "ReplayedError",
    "ResumeState",
    "RunCancelledError",
    "RunContext",
    "RunExistsError",
    "RunInfo",
    "RunLockedError",
    "RunMeta",
    "RunNotFoundError",
    "RunPaused",
    "RunReader",
    "RunRolledBackError",
    "RunStatus",
    "RunWriter",
    "SchemaVersionError",
    "StateCheckpoint",
    "Store",
    "ToolCall",
    "UntrustedStoreError",
    "VerifyReport",
    "WriterFailedError",
    "__version__",
    "agent_factory",
    "aresume",
    "cancel",
    "durable",
    "input_hash",
    "migration",
    "resume",
]


_SUBPACKAGES = frozenset(
    {"agent", "cli", "errors", "integrations", "journal", "runner", "storage", "testing", "watcher"}
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _SUBPACKAGES:  # ``afk_local.storage`` as an attribute, as before
            return importlib.import_module(f"afk_local.{name}")
        raise AttributeError(f"module 'afk_local' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
