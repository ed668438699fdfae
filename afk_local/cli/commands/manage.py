"""``afk-local rm`` and ``afk-local restart``: removing runs, and running a job again anew.

``rm`` deletes finished runs (failed and cancelled ones with ``--force``) and keeps
their effect journals under ``<root>/removed/`` unless ``--with-effects``; it never
touches a run that a process or a resume may still continue. ``restart`` records a
new run with the old one's job and inputs (:func:`afk_local.runner.operations.restart.restart_run`)
and continues it exactly as ``afk-local resume`` does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from afk_local.cli.command import (
    EXIT_OK,
    CliError,
    emit_json,
    open_store,
    out,
    require_run,
    suggest,
)
from afk_local.cli.commands.write import cmd_resume
from afk_local.runner.code.origin import cannot_resume
from afk_local.storage.format.records import RunMeta, RunStatus
from afk_local.storage.store import Store


def _refusal(args: argparse.Namespace, store: Store, run_id: str) -> str | None:
    """Why ``rm`` must not delete ``run_id`` (None: it may)."""
    info = store.info(run_id)
    if info.owner_alive:
        return (
            f"run {run_id!r} is live (a process holds its lock): stop that process first; "
            "nothing was removed"
        )
    return _status_refusal(args, run_id, info.status, idle=info.idle)


def _status_refusal(
    args: argparse.Namespace, run_id: str, status: RunStatus, *, idle: bool = False
) -> str | None:
    """Why ``rm`` must not delete a run with ``status`` (None: it may).

    An idle thread (a LangGraph thread, a ``RunSession`` conversation) is paused for
    nobody: like a failed run it goes with ``--force`` (its history is lost with it).
    """
    if idle:
        if args.force:
            return None
        return (
            f"run {run_id!r} is an idle thread (a LangGraph thread or a conversation): its "
            f"history goes with it; remove it with {suggest(args, 'rm', run_id, '--force')}; "
            "nothing was removed"
        )
    waiting = (RunStatus.PAUSED, RunStatus.SLEEPING)
    if status in (RunStatus.RUNNING, RunStatus.CREATED, *waiting):
        what = status.value if status in waiting else "interrupted"
        cancel, force = suggest(args, "cancel", run_id), suggest(args, "rm", run_id, "--force")
        return (
            f"run {run_id!r} is {what}: a resume (or the watcher) would continue it. Cancel it "
            f"first ({cancel}), then {force}; nothing was removed"
        )
    if status in (RunStatus.FAILED, RunStatus.CANCELLED) and not args.force:
        return (
            f"run {run_id!r} is {status.value}: keep it to look at, or remove it with "
            f"{suggest(args, 'rm', run_id, '--force')}; nothing was removed"
        )
    return None


def _under_lock(args: argparse.Namespace, run_id: str) -> Callable[[RunMeta], None]:
    """The status check again, under the run's lock: a resume may have started meanwhile."""

    def check(meta: RunMeta) -> None:
        idle = meta.status is RunStatus.PAUSED and meta.pause is not None and meta.pause.idle
        refusal = _status_refusal(args, run_id, meta.status, idle=idle)
        if refusal is not None:
            raise CliError(refusal)

    return check


def cmd_rm(args: argparse.Namespace) -> int:
    """``rm RUN... [--force] [--with-effects]``: delete runs; all or none are removed."""
    store = open_store(args)
    for run_id in args.runs:
        require_run(store, run_id)
    for run_id in dict.fromkeys(args.runs):
        refusal = _refusal(args, store, run_id)
        if refusal is not None:
            raise CliError(refusal)
    removed: list[dict[str, Any]] = []
    for run_id in dict.fromkeys(args.runs):
        kept = store.delete(
            run_id, keep_effects=not args.with_effects, check=_under_lock(args, run_id)
        )
        removed.append({"run_id": run_id, "effects_kept_in": str(kept) if kept else None})
    if args.json:
        emit_json({"removed": removed})
        return EXIT_OK
    for entry in removed:
        where = entry["effects_kept_in"]
        kept_text = f"; its effect journal is kept in {where}" if where else ""
        out(f"removed run {entry['run_id']}{kept_text}")
    return EXIT_OK


def cmd_restart(args: argparse.Namespace) -> int:
    """``restart RUN [--as NEW] [--no-start]``: a new run of the same job with the same inputs."""
    store = open_store(args)
    require_run(store, args.run)
    meta = store.read_meta(args.run)
    reason = cannot_resume(meta)
    if meta.extra.get("kind") == "agent":
        reason = "it is an agent run (restart repeats @afk.durable jobs)"
    if reason is not None:
        raise CliError(f"run {args.run!r} cannot be restarted: {reason}")
    from afk_local.runner.operations.restart import restart_run  # noqa: PLC0415 - the runner

    new_id = restart_run(args.run, store=store, new_run_id=args.as_id)
    if args.no_start:
        if args.json:
            emit_json({"run_id": new_id, "status": "created", "restarted_from": args.run})
        else:
            out(f"restarted {args.run} as {new_id} (not started)")
            out(f"start it with: {suggest(args, 'resume', new_id)} (or let afk-local watch do it)")
        return EXIT_OK
    if not args.json:
        out(f"restarted {args.run} as {new_id}")
    resume_args = argparse.Namespace(**vars(args))
    resume_args.run = new_id
    resume_args.input = None
    resume_args.in_doubt = None
    resume_args.via_watcher = False
    resume_args.report_extra = {"restarted_from": args.run}
    return cmd_resume(resume_args)


__all__ = ["cmd_restart", "cmd_rm"]
