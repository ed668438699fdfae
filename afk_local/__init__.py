"""afk_local: file-based, local-first checkpoints for long Python jobs.

A run is a directory of immutable, compressed, checksummed checkpoint files and
an effect journal; a crashed run resumes from its last checkpoint without
repeating side effects. docs/ holds the format, the guarantees and the API.
"""

from __future__ import annotations

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
from afk_local.storage.reader import CheckpointNotFoundError, ResumeState, RunReader
from afk_local.storage.records import (
    SCHEMA_VERSION,
    Checkpoint,
    Effect,
    ErrorInfo,
    Phase,
    RunMeta,
    RunStatus,
)
from afk_local.storage.run import RunWriter
from afk_local.storage.run_info import RunInfo
from afk_local.storage.store import Store
from afk_local.storage.verify import VerifyReport

__version__ = "0.1.0"

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
