"""The write commands of ``afk-local``: import, fork, resume, cancel, gc, pack, demo.

Each changes the store: a new run (import, fork), an attempt of a run
(resume), a terminal status (cancel), compaction (gc), fewer files (pack); ``resume --via-watcher``
hands over to the watcher (:mod:`afk_local.cli.watch`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from afk_local.agent.resume import resume_run
from afk_local.cli.command import (
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    emit_json,
    info_dict,
    open_store,
    out,
    require_run,
    short,
)
from afk_local.cli.render import print_table
from afk_local.cli.watch import request_resume
from afk_local.errors import AfkLocalError, RunLockedError, RunPaused
from afk_local.runner.cancel import cancel
from afk_local.storage.export import import_run
from afk_local.storage.notebook import format_bytes
from afk_local.storage.records import RunStatus
from afk_local.storage.retention import DEFAULT_ALWAYS_KEEP, RetentionPolicy


def _parse_input(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"--input is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            "quote it for the shell, e.g. --input '{\"answer\": 42}'"
        ) from None


def cmd_import(args: argparse.Namespace) -> int:
    """``import FILE``: recreate an exported run in this store."""
    store = open_store(args)
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    run_id = import_run(store, text, new_run_id=args.as_id, source=args.file)
    if args.json:
        emit_json(info_dict(store.info(run_id)))
    else:
        out(f"imported run {run_id} into {store.root}")
    return EXIT_OK


def cmd_fork(args: argparse.Namespace) -> int:
    """``fork RUN --at SEQ [--as NEW_ID]``: time travel into a new run."""
    store = open_store(args)
    require_run(store, args.run)
    if args.at < 1:
        raise CliError(f"--at must be >= 1: run `afk-local log {args.run}` to list checkpoints")
    info = store.fork(args.run, args.at, args.as_id)
    if args.json:
        emit_json(info_dict(info))
    else:
        out(f"forked {args.run} at seq {args.at} into {info.run_id} (step {info.step})")
        out(f"continue it with: afk-local resume {info.run_id}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume RUN [--input JSON]``: continue a run in this process."""
    value = _parse_input(args.input)
    store = open_store(args)
    require_run(store, args.run)
    if args.via_watcher:
        return request_resume(args, store, value)
    meta = store.read_meta(args.run)
    if meta.status is RunStatus.COMPLETED:
        raise CliError(f"run {args.run!r} already completed; nothing to resume", EXIT_OK)
    try:
        result = resume_run(args.run, store, value)
    except RunLockedError as exc:  # another process is resuming it: the watcher's "taken"
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_LOCKED
    except RunPaused as paused:
        if args.json:
            emit_json({"run_id": args.run, "status": "paused", "prompt": paused.prompt})
        else:
            out(f"run {args.run} paused waiting for {paused.kind}: {short(paused.prompt)}")
            out(f"answer with: afk-local resume {args.run} --input JSON")
        return EXIT_OK
    except (AfkLocalError, CliError):
        raise
    except Exception as exc:  # the job itself raised: the run is recorded as failed
        sys.stderr.write(f"afk-local: run {args.run} failed: {type(exc).__name__}: {exc}\n")
        sys.stderr.write(f"afk-local: see `afk-local show {args.run}`\n")
        return EXIT_PROBLEMS
    if args.json:
        emit_json({"run_id": args.run, "status": "completed", "result": result})
    else:
        out(f"run {args.run} completed: {short(result, 200)}")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    """``cancel RUN``: make a run terminal (cancelled) so nothing resumes it."""
    store = open_store(args)
    require_run(store, args.run)
    meta = store.read_meta(args.run)
    if meta.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise CliError(f"run {args.run!r} is already {meta.status.value}; nothing to cancel")
    cancel(args.run, store=store, reason=args.reason)
    status = store.read_meta(args.run).status.value
    if args.json:
        emit_json({"run_id": args.run, "status": status})
    else:
        out(f"run {args.run}: {status}")
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    """``gc``: compact runs and delete old terminal runs per the policy flags."""
    store = open_store(args)
    phases = frozenset(args.keep_phase) if args.keep_phase else DEFAULT_ALWAYS_KEEP
    try:
        policy = RetentionPolicy(
            keep_runtime_states=args.keep_runtime_states,
            always_keep_phases=phases,
            keep_latest_step=not args.no_keep_latest_step,
            max_effects_per_run=args.max_effects_per_run,
            max_runs=args.max_runs,
            max_age_days=args.max_age_days,
            max_bytes=args.max_bytes,
        )
    except ValueError as exc:
        raise CliError(f"bad gc policy: {exc}") from None
    report = store.gc(policy, dry_run=args.dry_run)
    if args.json:
        emit_json(report.to_dict())
        return EXIT_OK
    verb = "would free" if args.dry_run else "freed"
    rows = [
        (
            c.run_id,
            c.deleted_files,
            c.rewritten_files,
            c.effects_dropped,
            format_bytes(c.bytes_freed),
        )
        for c in report.compacted
        if c.deleted_files or c.rewritten_files or c.effects_dropped
    ]
    if rows:
        print_table(
            ("RUN", "FILES DELETED", "REWRITTEN", "EFFECTS DROPPED", verb.upper()),
            rows,
            align_right=(1, 2, 3),
        )
    prefix = "dry run: " if args.dry_run else ""
    gone = "would delete" if args.dry_run else "deleted"
    out(
        f"{prefix}{len(report.compacted)} run(s) checked, {verb} {format_bytes(report.bytes_freed)}"
        f"; {gone} {len(report.deleted_runs)} whole run(s)"
        + (f": {', '.join(report.deleted_runs)}" if report.deleted_runs else "")
    )
    if report.skipped_locked:
        out(f"skipped (owner alive): {', '.join(report.skipped_locked)}")
    for error in report.errors:
        out(f"error: {error}")
    return EXIT_PROBLEMS if report.errors else EXIT_OK


def cmd_pack(args: argparse.Namespace) -> int:
    """``pack [RUN ...]``: fold older checkpoint files into pack files."""
    store = open_store(args)
    for run_id in args.runs:
        require_run(store, run_id)
    reports = store.pack(
        args.runs or None, full=not args.no_merge, keep_loose=args.keep_loose, dry_run=args.dry_run
    )
    if args.json:
        emit_json([r.to_dict() for r in reports])
        return EXIT_PROBLEMS if any(r.errors for r in reports) else EXIT_OK
    rows = [
        (
            r.run_id,
            r.packed_files,
            r.packs_merged,
            f"{r.files_before} -> {r.files_after}",
            f"{format_bytes(r.bytes_before)} -> {format_bytes(r.bytes_after)}",
        )
        for r in reports
        if not r.skipped and not r.errors
    ]
    if rows:
        print_table(
            ("RUN", "FILES PACKED", "PACKS MERGED", "FILES", "SIZE"), rows, align_right=(1, 2)
        )
    prefix = "dry run: " if args.dry_run else ""
    packed = sum(r.packed_files for r in reports)
    out(f"{prefix}{len(reports)} run(s) checked, {packed} checkpoint file(s) packed")
    skipped = [r.run_id for r in reports if r.skipped]
    if skipped:
        out(f"skipped (owner alive, it packs as it writes): {', '.join(skipped)}")
    for r in reports:
        for error in r.errors:
            out(f"error: run {r.run_id}: {error}")
    return EXIT_PROBLEMS if any(r.errors for r in reports) else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: crash a small job with SIGKILL, resume it, show that nothing ran twice."""
    from afk_local.cli.demo import main as demo_main  # noqa: PLC0415 - imports the runner

    return demo_main(steps=args.steps, keep=args.keep)


__all__ = [
    "cmd_cancel",
    "cmd_demo",
    "cmd_fork",
    "cmd_gc",
    "cmd_import",
    "cmd_pack",
    "cmd_resume",
]
