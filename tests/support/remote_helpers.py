"""Helpers shared by the remote-mirror tests that run the command line and damage buckets."""

from __future__ import annotations

import os
from pathlib import Path

import proc

import afk_local as afk

SUPPORT = Path(__file__).resolve().parent


def afk_cli(root: Path, *args: str, code: int = 0, env: dict[str, str] | None = None):
    """``python -m afk_local --root ROOT args...`` in a fresh process; asserts the exit code."""
    full = {k: v for k, v in os.environ.items() if k not in ("AFK_LOCAL_ROOT", "AFK_LOCAL_MIRROR")}
    full["PYTHONPATH"] = str(SUPPORT) + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    result = proc.python(["-m", "afk_local", "--root", str(root), *args], env=full, timeout=120)
    assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
    return result


def one_line(text: str) -> str:
    """The only line of ``text`` (a refusal is one line)."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def overwrite(url: str, key: str, data: bytes | None) -> None:
    """What an attacker or a broken tool does: replace or delete an object in place."""
    import obstore  # noqa: PLC0415 - the remote extra; callers skip without it

    if url.startswith("file://"):
        store = obstore.store.LocalStore(url[len("file://") :])
    else:
        store = obstore.store.from_url(url)
    if data is None:
        obstore.delete(store, key)
    else:
        obstore.put(store, key, data)


def make_run(store: afk.Store, run_id: str, n: int, *, effects: int = 0) -> None:
    """A closed run of ``n`` checkpoints, an effect (intent, outcome) before each of the
    first ``effects``."""
    with store.create(run_id) as run:
        for i in range(n):
            if i < effects:
                run.effects.record_intent(f"k{i}", name="f", input_hash="h", idempotency_key=f"{i}")
                run.effects.record_outcome(f"k{i}", status="ok", result=i)
            run.checkpoint("runtime_state", {"i": i}, step=i)
