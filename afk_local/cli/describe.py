"""What ``afk-local show`` says about a run, and the next thing a person can do with it.

:func:`describe_run` gathers the facts (meta, position, progress, owner, effects,
metrics, where a failed run failed, where a script job's code is, why it cannot be
resumed); the ``next`` fact is always a command that works as printed (or says why
there is none).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from typing import Any

from afk_local.errors import AfkLocalError, UntrustedStoreError
from afk_local.runner.code.origin import cannot_resume, origin_of
from afk_local.storage.format.records import WAITING_KEY, RunMeta, RunStatus
from afk_local.storage.format.values import plain as to_jsonable
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.store import Store
from afk_local.storage.views.conversation import conversation
from afk_local.storage.views.effect_table import effect_rows
from afk_local.storage.views.notebook import format_bytes, format_ms

SHOWN_ENTRIES = 20
"""``show`` prints the newest this many entries of an agent run's conversation."""
SHOWN_CHARS = 200
"""... each cut to this many characters (``inspect --conversation``: :data:`CONVERSATION_CHARS`)."""
CONVERSATION_CHARS = 2000
"""``inspect --conversation`` cuts each entry to this many characters."""

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)


def _plain_hint(*words: object) -> str:
    return " ".join(["afk-local", *(shlex.quote(str(w)) for w in words)])


def _moved_from(store: Store) -> str | None:
    """Where the store was created when it was copied or moved (None: at home, or its
    identity does not verify, which the warning line says)."""
    try:
        return store.moved_from()
    except UntrustedStoreError:
        return None


def describe_run(
    store: Store, run_id: str, hint: Callable[..., str] = _plain_hint
) -> dict[str, Any]:
    """Everything ``afk-local show`` prints about a run.

    ``hint(*words)`` spells a command the user can run (``afk-local [--root R] ...``).
    """
    info = store.info(run_id)
    reader = store.open(run_id)
    meta = reader.meta
    active = meta.status in (RunStatus.RUNNING, RunStatus.CREATED, RunStatus.FAILED)
    reason = cannot_resume(meta) if active or meta.status is RunStatus.PAUSED else None
    progress = info.progress
    facts: dict[str, Any] = {
        "run_id": run_id,
        "status": meta.status.value,
        "interrupted": info.interrupted,
        "owner_alive": info.owner_alive,
        "lock_problem": info.lock_problem,
        "damage": info.damage,
        "owner": to_jsonable(meta.owner) if meta.owner else None,
        "attempt": meta.attempt,
        "progress": ({**progress.to_dict(), "fraction": progress.fraction} if progress else None),
        "active_ms": progress.active_ms if progress else None,
        "eta_s": info.eta_s,
        "tags": info.tags,
        "failure": _failure(reader, meta),
        "step": info.step,
        "seq": info.seq,
        "phase": info.phase,
        "checkpoints": len(reader.checkpoint_files()),
        "bytes": info.bytes,
        "size": format_bytes(info.bytes),
        "created_ms": meta.created_ms,
        "updated_ms": info.updated_ms,
        "entrypoint": meta.entrypoint,
        "script": _script(meta),
        "thread_id": meta.thread_id,
        "parent_run_id": meta.parent_run_id,
        "version": meta.version,
        "code_fingerprint": meta.code_fingerprint,
        "params": to_jsonable(meta.params),
        "error": to_jsonable(meta.error) if meta.error else None,
        "pause": to_jsonable(meta.pause) if meta.pause else None,
        "wake_at_ms": meta.wake_at_ms or None,
        "wake_at": format_ms(meta.wake_at_ms) if meta.wake_at_ms else None,
        "waiting": to_jsonable(meta.extra.get(WAITING_KEY)),
        "extra": to_jsonable(meta.extra),
        "path": str(reader.paths.dir.absolute()),
        "store_moved_from": _moved_from(store),
        "cannot_resume": reason,
    }
    if facts["error"] and isinstance(facts["error"], dict):
        facts["error"].pop("traceback", None)  # `export` / `--json` of meta keep it; show is short
    in_doubt = 0
    try:
        rows = effect_rows(reader)
        in_doubt = sum(1 for r in rows if r["state"] == "in_doubt")
        facts["effects"] = len(rows)
        facts["effects_in_doubt"] = in_doubt
    except AfkLocalError as exc:
        facts["effects"] = f"unreadable: {exc}"
    try:
        facts["metrics"] = reader.metrics().summary()
    except (AfkLocalError, OSError) as exc:
        facts["metrics"] = f"unreadable: {exc}"
    try:
        facts["conversation"] = conversation(
            reader, max_chars=SHOWN_CHARS, max_entries=SHOWN_ENTRIES
        )
    except (AfkLocalError, OSError) as exc:
        facts["conversation"] = f"unreadable: {exc}"
    facts["next"] = _next_action(
        meta,
        interrupted=info.interrupted,
        alive=info.owner_alive,
        reason=reason,
        in_doubt=in_doubt,
        hint=hint,
    )
    if info.lock_problem is not None:
        facts["next"] = f"repair first: {info.lock_problem} (`{hint('verify', run_id)}`)"
    elif info.damage is not None:
        facts["next"] = f"see every damaged file: `{hint('verify', run_id)}`"
    return facts


def _failure(reader: RunReader, meta: RunMeta) -> dict[str, Any] | None:
    """Where a failed run failed: the seq and step of its failure, the step that raised, the error.

    ``where`` is the innermost ``file:line in function`` of the recorded traceback.
    """
    if meta.status is not RunStatus.FAILED:
        return None
    error = meta.error
    found: dict[str, Any] = {
        "seq": None,
        "step": None,
        "step_key": None,
        "type": error.type if error else None,
        "message": error.message if error else None,
        "where": None,
    }
    try:
        latest = reader.latest()
    except AfkLocalError:
        latest = None
    payload = latest.payload if latest is not None else None
    if isinstance(payload, dict) and payload.get("state") == RunStatus.FAILED.value:
        assert latest is not None
        found["seq"], found["step"] = latest.seq, latest.step
        key = payload.get("failed_step")
        found["step_key"] = key if isinstance(key, str) else None
    frames = list(_FRAME.finditer(error.traceback or "")) if error else []
    if frames:
        last = frames[-1]
        found["where"] = f"{os.path.basename(last['file'])}:{last['line']} in {last['func']}"
    return found


def describe_failure(failure: dict[str, Any], *, with_step: bool = True) -> str:
    """``seq 6, step 3, in step iterate#1[3]/fetch#1: ValueError: boom (jobs.py:12 in fetch)``.

    ``with_step=False`` leaves ``step N`` out (a durable job that journaled no step).
    """
    place = []
    if failure.get("seq") is not None:
        step = f", step {failure['step']}" if with_step else ""
        place.append(f"seq {failure['seq']}{step}")
    if failure.get("step_key"):
        place.append(f"in step {failure['step_key']}")
    text = ", ".join(place) or "(no failure checkpoint)"
    if failure.get("type"):
        text += f": {failure['type']}: {failure.get('message') or ''}".rstrip()
    if failure.get("where"):
        text += f" ({failure['where']})"
    return text


def _script(meta: RunMeta) -> str | None:
    """Where a ``__main__`` job's code is: its script, or ``python -m`` module."""
    origin = origin_of(meta)
    if origin is None or not (meta.entrypoint or "").startswith("__main__:"):
        return None
    if origin.module is not None:
        return f"python -m {origin.module} (in {origin.cwd})"
    return origin.script


def _next_action(
    meta: RunMeta,
    *,
    interrupted: bool,
    alive: bool,
    reason: str | None,
    in_doubt: int,
    hint: Callable[..., str],
) -> str:
    run_id, status = meta.run_id, meta.status
    if alive:
        owner = meta.owner
        who = f" (pid {owner.pid} on {owner.hostname})" if owner else ""
        return (
            f"a process is running it{who}; it goes on by itself. Stopping that process "
            "leaves it interrupted, to be resumed later"
        )
    if status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        return "nothing to do"
    if status is RunStatus.PAUSED and meta.pause is not None and meta.pause.idle:
        prompt = meta.pause.prompt if isinstance(meta.pause.prompt, str) else ""
        then = f": {prompt}" if prompt else ""
        return f"an idle thread: the code that keeps it continues it when it next writes{then}"
    if reason is not None:
        return f"cannot be resumed: {reason}"
    if in_doubt:
        return (
            f"{in_doubt} effect(s) in doubt: `{hint('effects', run_id)}` shows how to settle "
            f"them, then `{hint('resume', run_id)}`"
        )
    if interrupted and status is RunStatus.CREATED and meta.attempt == 0:
        return f"not started yet: `afk-local watch` starts it (or `{hint('resume', run_id)}`)"
    if interrupted:
        return f"interrupted: `{hint('resume', run_id)}` (or let `afk-local watch` do it)"
    if status is RunStatus.SLEEPING:
        return (
            f"sleeping until {format_ms(meta.wake_at_ms)}: `afk-local watch` resumes it then "
            "(a resume before that parks it again)"
        )
    if status is RunStatus.PAUSED:
        return (
            f"waiting for input: `{hint('resume', run_id, '--input', 'JSON')}` with your "
            "answer as JSON in place of JSON (e.g. '\"yes\"' or 42)"
        )
    if status is RunStatus.FAILED:
        return (
            f"`{hint('resume', run_id)}` retries it (finished steps replay); "
            f"`{hint('log', run_id)}` lists the checkpoints a fork can start from"
        )
    return "nothing to do"


__all__ = ["CONVERSATION_CHARS", "describe_failure", "describe_run"]
