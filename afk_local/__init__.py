"""afk_local: file-based, local-first checkpoints for long Python jobs.

A run is a directory of immutable, compressed, checksummed checkpoint files and
an effect journal; a crashed run resumes from its last checkpoint without
repeating side effects. docs/ holds the format, the guarantees and the API.
"""

# No ``from __future__ import annotations`` and no plain ``import x`` here: every name
# bound at module level is part of ``afk_local``'s namespace, which holds the public API
# and nothing else (tests/test_public_api.py).
import importlib as _importlib
import typing as _typing

from afk_local import _moved
from afk_local.storage.rundir import effects as _effects_seam

__version__ = "0.1.0"

# The public API: each module and the names imported from it on first use (PEP 562),
# so that ``import afk_local.integrations.langgraph`` (a saver in a fresh process) or
# the CLI pays only for the layers it uses, not for the runner, agent and watcher.
# This table is the one list of public names: ``__all__`` and ``dir()`` come from it,
# and tests/test_public_api.py holds the TYPE_CHECKING imports below to it.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "afk_local.agent.agent_runner": ("AgentRunner",),
    "afk_local.agent.factory": ("AgentFactory", "agent_factory"),
    "afk_local.agent.rebuild": ("resume_agent",),
    "afk_local.agent.resume": ("aresume", "resume", "resume_run"),
    "afk_local.agent.types": ("Agent", "AgentResult", "LLMResponse", "Tool", "ToolCall", "tool"),
    "afk_local.errors": (
        "AfkLocalError",
        "CheckpointCorruptionError",
        "CheckpointNotFoundError",
        "CodeChangedError",
        "DiskFullError",
        "EffectInDoubtError",
        "EffectLogCorruptionError",
        "EffectMismatchError",
        "EntrypointError",
        "FlushTimeoutError",
        "ForkedWriterError",
        "InvalidRunIdError",
        "KeyRequiredError",
        "LeaseLostError",
        "MirrorError",
        "PauseMismatchError",
        "RecordTooDeepError",
        "ReplayDivergence",
        "RunCancelledError",
        "RunExistsError",
        "RunLockedError",
        "RunNotFoundError",
        "RunPaused",
        "RunRolledBackError",
        "RunSleeping",
        "SchemaVersionError",
        "SettleError",
        "StoreMovedError",
        "StoreUnusableError",
        "UnstorableValueError",
        "UntrustedStoreError",
        "WriterFailedError",
    ),
    "afk_local.journal.journal": ("Journal",),
    "afk_local.journal.replay": ("ReplayedError", "input_hash"),
    "afk_local.runner.operations.cancel": ("cancel",),
    "afk_local.runner.run.durable_function": ("DurableFunction", "durable"),
    "afk_local.runner.time.limits": ("Limit",),
    "afk_local.runner.observe.observe": ("add_observer",),
    "afk_local.runner.operations.restart": ("restart_run",),
    "afk_local.runner.time.retry": ("Retry",),
    "afk_local.runner.run.run_context": ("RunContext",),
    "afk_local.runner.operations.settle": ("settle", "unsettle"),
    "afk_local.runner.run.state_checkpoint": ("StateCheckpoint",),
    "afk_local.runner.code.versions": ("CodeChangedWarning", "migration"),
    "afk_local.runner.writer": ("DurableWriter",),
    "afk_local.storage.format.records": (
        "SCHEMA_VERSION",
        "Checkpoint",
        "Effect",
        "ErrorInfo",
        "Phase",
        "RunMeta",
        "RunStatus",
    ),
    "afk_local.storage.rundir.options": ("StoreOptions",),
    "afk_local.storage.rundir.read.reader": ("ResumeState", "RunReader"),
    "afk_local.storage.rundir.read.verify": ("VerifyReport",),
    "afk_local.storage.rundir.write.writer": ("RunWriter",),
    "afk_local.storage.store": ("Store",),
    "afk_local.storage.trust": ("require_trusted_run", "trust_run"),
    "afk_local.storage.views.run_info": ("RunInfo",),
    "afk_local.watcher.requests": ("submit_request",),
    "afk_local.watcher.watcher": ("Watcher",),
}

_EXPORTS = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted([*_EXPORTS, "__version__"])  # noqa: PLE0605 - derived from _PUBLIC

if _typing.TYPE_CHECKING:  # the same names for type checkers, which do not run __getattr__
    from collections.abc import Callable
    from pathlib import Path

    from afk_local.agent.agent_runner import AgentRunner as AgentRunner
    from afk_local.agent.factory import AgentFactory as AgentFactory
    from afk_local.agent.factory import agent_factory as agent_factory
    from afk_local.agent.rebuild import resume_agent as resume_agent
    from afk_local.agent.resume import aresume as aresume
    from afk_local.agent.resume import resume as resume
    from afk_local.agent.resume import resume_run as resume_run
    from afk_local.agent.types import Agent as Agent
    from afk_local.agent.types import AgentResult as AgentResult
    from afk_local.agent.types import LLMResponse as LLMResponse
    from afk_local.agent.types import Tool as Tool
    from afk_local.agent.types import ToolCall as ToolCall
    from afk_local.agent.types import tool as tool
    from afk_local.errors import AfkLocalError as AfkLocalError
    from afk_local.errors import CheckpointCorruptionError as CheckpointCorruptionError
    from afk_local.errors import CheckpointNotFoundError as CheckpointNotFoundError
    from afk_local.errors import CodeChangedError as CodeChangedError
    from afk_local.errors import DiskFullError as DiskFullError
    from afk_local.errors import EffectInDoubtError as EffectInDoubtError
    from afk_local.errors import EffectLogCorruptionError as EffectLogCorruptionError
    from afk_local.errors import EffectMismatchError as EffectMismatchError
    from afk_local.errors import EntrypointError as EntrypointError
    from afk_local.errors import FlushTimeoutError as FlushTimeoutError
    from afk_local.errors import ForkedWriterError as ForkedWriterError
    from afk_local.errors import InvalidRunIdError as InvalidRunIdError
    from afk_local.errors import KeyRequiredError as KeyRequiredError
    from afk_local.errors import LeaseLostError as LeaseLostError
    from afk_local.errors import MirrorError as MirrorError
    from afk_local.errors import PauseMismatchError as PauseMismatchError
    from afk_local.errors import RecordTooDeepError as RecordTooDeepError
    from afk_local.errors import ReplayDivergence as ReplayDivergence
    from afk_local.errors import RunCancelledError as RunCancelledError
    from afk_local.errors import RunExistsError as RunExistsError
    from afk_local.errors import RunLockedError as RunLockedError
    from afk_local.errors import RunNotFoundError as RunNotFoundError
    from afk_local.errors import RunPaused as RunPaused
    from afk_local.errors import RunRolledBackError as RunRolledBackError
    from afk_local.errors import RunSleeping as RunSleeping
    from afk_local.errors import SchemaVersionError as SchemaVersionError
    from afk_local.errors import SettleError as SettleError
    from afk_local.errors import StoreMovedError as StoreMovedError
    from afk_local.errors import StoreUnusableError as StoreUnusableError
    from afk_local.errors import UnstorableValueError as UnstorableValueError
    from afk_local.errors import UntrustedStoreError as UntrustedStoreError
    from afk_local.errors import WriterFailedError as WriterFailedError
    from afk_local.journal.journal import Journal as Journal
    from afk_local.journal.replay import ReplayedError as ReplayedError
    from afk_local.journal.replay import input_hash as input_hash
    from afk_local.runner.code.versions import CodeChangedWarning as CodeChangedWarning
    from afk_local.runner.code.versions import migration as migration
    from afk_local.runner.observe.observe import add_observer as add_observer
    from afk_local.runner.operations.cancel import cancel as cancel
    from afk_local.runner.operations.restart import restart_run as restart_run
    from afk_local.runner.operations.settle import settle as settle
    from afk_local.runner.operations.settle import unsettle as unsettle
    from afk_local.runner.run.durable_function import DurableFunction as DurableFunction
    from afk_local.runner.run.durable_function import durable as durable
    from afk_local.runner.run.run_context import RunContext as RunContext
    from afk_local.runner.run.state_checkpoint import StateCheckpoint as StateCheckpoint
    from afk_local.runner.time.limits import Limit as Limit
    from afk_local.runner.time.retry import Retry as Retry
    from afk_local.runner.writer import DurableWriter as DurableWriter
    from afk_local.storage import fsio
    from afk_local.storage.format.codec import RecordCodec
    from afk_local.storage.format.records import SCHEMA_VERSION as SCHEMA_VERSION
    from afk_local.storage.format.records import Checkpoint as Checkpoint
    from afk_local.storage.format.records import Effect as Effect
    from afk_local.storage.format.records import ErrorInfo as ErrorInfo
    from afk_local.storage.format.records import Phase as Phase
    from afk_local.storage.format.records import RunMeta as RunMeta
    from afk_local.storage.format.records import RunStatus as RunStatus
    from afk_local.storage.rundir.mirror import RunMirror
    from afk_local.storage.rundir.options import StoreOptions as StoreOptions
    from afk_local.storage.rundir.read.reader import ResumeState as ResumeState
    from afk_local.storage.rundir.read.reader import RunReader as RunReader
    from afk_local.storage.rundir.read.verify import VerifyReport as VerifyReport
    from afk_local.storage.rundir.write.writer import RunWriter as RunWriter
    from afk_local.storage.store import Store as Store
    from afk_local.storage.trust import require_trusted_run as require_trusted_run
    from afk_local.storage.trust import trust_run as trust_run
    from afk_local.storage.views.run_info import RunInfo as RunInfo
    from afk_local.watcher.requests import submit_request as submit_request
    from afk_local.watcher.watcher import Watcher as Watcher


def _open_journal(
    path: "Path",
    run_id: str,
    *,
    record_codec: "RecordCodec",
    listener: "RunMirror | None",
    on_durable: "Callable[[int, bytes], None] | None",
    env: "fsio.Env",
) -> "Journal":
    """Open a run's effect journal for its writer (imported on a run's first effect)."""
    from afk_local.journal.journal import Journal  # noqa: PLC0415

    return Journal(
        path,
        run_id,
        writable=True,
        record_codec=record_codec,
        listener=listener,
        on_durable=on_durable,
        env=env,
    )


# The composition root: storage may not import the journal above it, so the run's
# writer opens ``effects.log`` through this opener (afk_local/storage/rundir/effects.py).
_effects_seam.register_journal_opener(_open_journal)
_moved.install()  # old module paths import for one release (afk_local/_moved.py)

_SUBPACKAGES = frozenset(
    {"agent", "cli", "errors", "integrations", "journal", "runner", "storage", "testing", "watcher"}
)


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _SUBPACKAGES:  # ``afk_local.storage`` as an attribute, as before
            return _importlib.import_module(f"afk_local.{name}")
        raise AttributeError(f"module 'afk_local' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
