"""afk_local: file-based, local-first checkpoints for long Python jobs.

A run is a directory of immutable, compressed, checksummed checkpoint files and
an effect journal; a crashed run resumes from its last checkpoint without
repeating side effects. See DESIGN.md and docs/ for the contract.
"""

from __future__ import annotations

from afk_local.agent import AgentRunner
from afk_local.agent_types import Agent, AgentResult, LLMResponse, ToolCall
from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    CodeChangedError,
    EffectInDoubtError,
    EffectLogCorruptionError,
    EffectMismatchError,
    InvalidRunIdError,
    KeyRequiredError,
    RunCancelledError,
    RunExistsError,
    RunLockedError,
    RunNotFoundError,
    RunPaused,
    SchemaVersionError,
    WriterFailedError,
)
from afk_local.journal import Journal, ReplayedError, input_hash
from afk_local.reader import CheckpointNotFoundError, ResumeState, RunReader, VerifyReport
from afk_local.records import (
    SCHEMA_VERSION,
    Checkpoint,
    Effect,
    ErrorInfo,
    Phase,
    RunMeta,
    RunStatus,
)
from afk_local.run import RunWriter
from afk_local.runner import (
    CodeChangedWarning,
    DurableFunction,
    RunContext,
    aresume,
    cancel,
    durable,
    migration,
    resume,
)
from afk_local.simple import StateCheckpoint
from afk_local.store import RunInfo, Store
from afk_local.writer import DurableWriter

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "AfkLocalError",
    "Agent",
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
    "InvalidRunIdError",
    "Journal",
    "KeyRequiredError",
    "LLMResponse",
    "Phase",
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
    "RunStatus",
    "RunWriter",
    "SchemaVersionError",
    "StateCheckpoint",
    "Store",
    "ToolCall",
    "VerifyReport",
    "WriterFailedError",
    "__version__",
    "aresume",
    "cancel",
    "durable",
    "input_hash",
    "migration",
    "resume",
]
