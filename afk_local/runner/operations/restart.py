"""Restarting a run: a new run of the same job with the same inputs, from the beginning.

Unlike ``resume`` (which continues a run) and ``fork`` (which continues a copy of
its history), :func:`restart_run` records a **new** run that shares nothing with
the old one but its recipe: the entrypoint, the arguments, where the job ran (so a
script job is found again), the code fingerprint, the version and the tags. It is
created with status ``created`` and runs nothing: ``afk-local restart`` then
continues it exactly as ``afk-local resume`` would (the same search for its code,
:func:`afk_local.runner.operations.resume.load_job`, and the same checks), and a running
watcher would pick it up too.
"""

from __future__ import annotations

from afk_local.errors import EntrypointError
from afk_local.runner.code.origin import ORIGIN_KEY, cannot_resume
from afk_local.storage.store import StoreLike, as_store
from afk_local.storage.trust import require_trusted_run
from afk_local.storage.views.run_info import TAGS_KEY, tags_of

RESTARTED_FROM_KEY = "restarted_from"
"""``RunMeta.extra`` key naming the run a restart was made from."""


def restart_run(run_id: str, *, store: StoreLike = None, new_run_id: str | None = None) -> str:
    """Record a new run of ``run_id``'s job with its inputs (status ``created``); returns its id.

    Nothing runs: resume the new run (``afk-local resume NEW``, ``afk.resume(NEW)``)
    or let a watcher start it. ``afk-local restart`` does both steps.

    Raises:
        RunNotFoundError: no run ``run_id``.
        UntrustedStoreError: the old run fails the trust checks every resume applies
            (docs/security.md): its job is not started under a new name either.
        RunExistsError: ``new_run_id`` is taken.
        EntrypointError: the run is not a durable job's that another process can run
            (an agent run, a StateCheckpoint, a job defined in a notebook...).
    """
    the_store = as_store(store)
    # The new run is this process's own (signed with its key): it must not launder an
    # entrypoint that someone else wrote into the old one. The old run passes the gate.
    meta = require_trusted_run(the_store, run_id, from_origin=True).meta
    if meta.extra.get("kind") == "agent":
        raise EntrypointError(
            run_id,
            meta.entrypoint,
            "it is an agent run: start the agent again with AgentRunner.run (restart "
            "repeats @afk.durable jobs)",
        )
    reason = cannot_resume(meta)
    if reason is not None:
        raise EntrypointError(run_id, meta.entrypoint, reason)
    extra: dict[str, object] = {RESTARTED_FROM_KEY: run_id}
    if ORIGIN_KEY in meta.extra:
        extra[ORIGIN_KEY] = meta.extra[ORIGIN_KEY]
    tags = tags_of(meta.extra)
    if tags:
        extra[TAGS_KEY] = tags
    with the_store.create(
        new_run_id,
        entrypoint=meta.entrypoint,
        params=meta.params,
        code_fingerprint=meta.code_fingerprint,
        version=meta.version,
        extra=extra,
        new_attempt=False,  # no process ran it yet: its first run is attempt 1
    ) as run:
        return run.run_id


__all__ = ["RESTARTED_FROM_KEY", "restart_run"]
