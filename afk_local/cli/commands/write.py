"""The write commands of ``afk-local``: import, fork, resume, cancel, gc, pack, demo.

Each changes the store: a new run (import, fork), an attempt of a run
(resume), a terminal status (cancel), compaction (gc), fewer files (pack);
``resume --via-watcher`` hands over to the watcher (:mod:`afk_local.cli.commands.watch`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    suggest,
)
from afk_local.cli.render import print_table
from afk_local.errors import (
    IN_DOUBT_CAUSES,
    AfkLocalError,
    DiskFullError,
    EffectInDoubtError,
    RunLockedError,
    RunPaused,
    RunSleeping,
)
from afk_local.runner.code.origin import REENTERED_ENV, ReentryPlan, cannot_resume, reentry_plan
from afk_local.storage.format.records import RunStatus
from afk_local.storage.ops.state_edit import parse_updates
from afk_local.storage.store import Store
from afk_local.storage.trust import require_trusted_run, trust_run
from afk_local.storage.views.notebook import format_bytes


def parse_json_option(name: str, text: str) -> Any:
    """The value of a JSON option (``--input``, ``--result``); a CliError saying how to quote it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{name} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            f"quote it for the shell, e.g. {name} '{{\"answer\": 42}}'"
        ) from None


def cmd_import(args: argparse.Namespace) -> int:
    """``import FILE``: recreate an exported run in this store (created if missing)."""
    from afk_local.storage.ops.export import import_run  # noqa: PLC0415

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"cannot read {args.file}: it is not UTF-8 text (not an export)") from None
    store = open_store(args, create=True)
    run_id = import_run(store, text, new_run_id=args.as_id, source=args.file)
    if args.json:
        emit_json(info_dict(store.info(run_id)))
    else:
        out(f"imported run {run_id} into {store.root}")
    return EXIT_OK


def _updates(pairs: list[str]) -> dict[str, Any]:
    """``--set PATH=JSON`` options as ``{path: value}`` (the rules the page's fork form uses)."""
    try:
        return parse_updates(pairs)
    except ValueError as exc:
        raise CliError(f"--set: {exc}") from None


def cmd_fork(args: argparse.Namespace) -> int:
    """``fork RUN --at SEQ [--as NEW_ID] [--set PATH=JSON ...]``: time travel into a new run."""
    updates = _updates(args.set or [])
    if args.at is None and not args.salvage:
        raise CliError(
            "fork needs --at SEQ (`afk-local log RUN` lists the checkpoints), or --salvage "
            "for a run whose effect journal is damaged"
        )
    store = open_store(args)
    require_run(store, args.run)
    info = store.fork(args.run, args.at, args.as_id, updates=updates or None, salvage=args.salvage)
    meta = store.read_meta(info.run_id)
    reason = cannot_resume(meta)
    at_seq = meta.extra.get("at_seq", args.at)
    salvage = salvage_report(store, args, info.run_id) if args.salvage else None
    if args.json:
        emit_json(
            {
                **info_dict(info),
                "forked_from": args.run,
                "at_seq": at_seq,
                "updated": sorted(updates),
                **({"salvage": salvage} if salvage is not None else {}),
            }
        )
        return EXIT_OK
    out(f"forked {args.run} at seq {at_seq} into {info.run_id} (step {info.step})")
    if salvage is not None:
        for line in salvage["lines"]:
            out(line)
    if updates:
        out(f"set {', '.join(sorted(updates))} in its state (checkpoint {info.seq})")
    if reason is None:
        out(f"continue it with: {suggest(args, 'resume', info.run_id)}")
    else:
        out(f"it cannot be resumed by afk-local: {reason}")
    return EXIT_OK


def salvage_report(store: Store, args: argparse.Namespace, fork_id: str) -> dict[str, Any]:
    """What ``fork --salvage`` kept, lost and left in doubt, with the commands to settle it."""
    from afk_local.storage.format.journal_format import read_journal  # noqa: PLC0415

    extra = store.read_meta(fork_id).extra
    saved = extra.get("salvaged") if isinstance(extra, dict) else None
    saved = saved if isinstance(saved, dict) else {}
    source = store.open(args.run)
    later = [f.seq for f in source.checkpoint_files() if f.seq > int(extra.get("at_seq", 0))]
    fork = store.open(fork_id)
    journal = read_journal(fork.paths.journal, fork_id, store.codec)
    names = {r.key: r.name for r in journal.records if r.kind == "intent"}
    in_doubt = journal.in_doubt()
    lines: list[str] = []
    if saved.get("damage_offset") is None:
        lines.append(f"the effect journal of {args.run} is intact: every record was kept")
    else:
        lines.append(
            f"kept {saved.get('kept_records')} effect record(s), the journal's intact part "
            f"(damage at byte {saved.get('damage_offset')}: {saved.get('reason')})"
        )
        lines.append(
            f"lost: {saved.get('lost_records')} record(s) after the damage; a call recorded "
            "there is in doubt in the fork"
        )
    if later:
        lines.append(
            f"lost: checkpoint(s) {later[0]}-{later[-1]} of {args.run} (taken after the "
            "damage); the fork continues from the one before"
        )
    for key in in_doubt:
        lines.append(
            f"in doubt (its outcome is lost): effect {key} ({names.get(key, '?')}); settle "
            f"it: {suggest(args, 'settle', fork_id, key, '--done', '--result', 'JSON')} or "
            f"{suggest(args, 'settle', fork_id, key, '--failed', 'MESSAGE')}"
        )
    return {
        "kept_records": saved.get("kept_records"),
        "lost_records": saved.get("lost_records", 0),
        "damage_offset": saved.get("damage_offset"),
        "lost_checkpoints": later,
        "in_doubt": in_doubt,
        "lines": lines,
    }


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume RUN [--input JSON [--pause-seq SEQ]] [--in-doubt retry|raise]``: continue a run."""
    from afk_local.agent.resume import resume_run  # noqa: PLC0415 - the runner and agent
    from afk_local.cli.commands.watch import request_resume  # noqa: PLC0415 - the watcher

    has_input = args.input is not None
    value = parse_json_option("--input", args.input) if has_input else None
    pause_seq = getattr(args, "pause_seq", None)
    if pause_seq is not None and not has_input:
        raise CliError("--pause-seq names the pause an --input answers: give --input too")
    store = open_store(args)
    require_run(store, args.run)
    if getattr(args, "trust", False):
        trust_run(store, args.run)  # the person vouches for the run as it is on disk now
        sys.stderr.write(f"afk-local: run {args.run} trusted (as it is on disk now)\n")
    meta = store.read_meta(args.run)
    if has_input and meta.status is not RunStatus.PAUSED:
        raise CliError(
            f"run {args.run!r} is {meta.status.value}, not paused: --input answers a paused "
            f"run's question; {_without_input(args, meta.status)}"
        )
    if meta.status is RunStatus.COMPLETED:  # its stored result; nothing is imported or run
        result = resume_run(args.run, store)
        return _report(args, {"run_id": args.run, "status": "completed", "result": result})
    idle = meta.pause is not None and meta.pause.idle  # its own code continues it
    if meta.status is RunStatus.PAUSED and not has_input and not args.via_watcher and not idle:
        prompt = meta.pause.prompt if meta.pause else None
        kind = meta.pause.kind if meta.pause else "input"
        paused = {"run_id": args.run, "status": "paused", "kind": kind, "prompt": prompt}
        return _report(args, paused)
    if meta.status is not RunStatus.CANCELLED:
        # a reason an earlier resume recorded (the code was gone) is tried again: a person asks
        reason = cannot_resume(meta, recorded=False)
        if reason is not None:
            raise CliError(f"run {args.run!r} cannot be resumed: {reason}")
    if args.via_watcher:
        return request_resume(args, store, value)
    # The trust gate before anything the run names runs here: the interpreter it hands
    # over to, the module it imports, the script it re-enters (docs/security.md).
    meta = require_trusted_run(store, args.run, from_origin=True).meta
    plan = reentry_plan(meta)
    if plan.other_interpreter and not os.environ.get(REENTERED_ENV):
        return _hand_over(args, store, plan)
    # With --json, stdout holds only the JSON: what the job prints goes to stderr.
    job_output = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with job_output:
            result = resume_run(
                args.run,
                store,
                value,
                in_doubt=args.in_doubt,
                reenter=True,
                pause_seq=pause_seq,
            )
    except RunLockedError as exc:  # another process is resuming it: the watcher's "taken"
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_LOCKED
    except RunPaused as paused:
        return _report(
            args,
            {"run_id": args.run, "status": "paused", "kind": paused.kind, "prompt": paused.prompt},
        )
    except RunSleeping as sleeping:  # parked in a long ctx.sleep: the watcher wakes it
        return _report(
            args, {"run_id": args.run, "status": "sleeping", "wake_at_ms": sleeping.wake_at_ms}
        )
    except EffectInDoubtError as exc:  # the run is now recorded as failed
        settle_it = suggest(args, "settle", args.run, exc.key, "--done", "--result", "JSON")
        retry = suggest(args, "resume", args.run, "--in-doubt", "retry")
        message = (
            f"run {args.run!r}: effect {exc.key!r} was started but has no recorded outcome "
            f"({IN_DOUBT_CAUSES}): it may or may not have happened. Check the outside system for "
            f"idempotency key {exc.idempotency_key!r}, then record what happened with "
            f"`{settle_it}` (JSON: what it returned; or --failed 'it did not happen') and "
            f"resume, or call it again with `{retry}`"
        )
        return _failed(args, message, exc)
    except DiskFullError as exc:  # nothing is lost: the same resume works once there is room
        sys.stderr.write(f"afk-local: run {args.run!r} stopped: {exc}\n")
        if args.json:
            error = {"type": type(exc).__name__, "message": str(exc)}
            emit_json({"run_id": args.run, "status": "stopped", "error": error})
        return EXIT_PROBLEMS
    except (AfkLocalError, CliError):
        raise
    except Exception as exc:  # the job itself raised: the run is recorded as failed
        return _failed(args, f"run {args.run} failed: {type(exc).__name__}: {exc}", exc)
    return _report(args, {"run_id": args.run, "status": "completed", "result": result})


def _without_input(args: argparse.Namespace, status: RunStatus) -> str:
    if status is RunStatus.COMPLETED:
        return f"it is done (`{suggest(args, 'show', args.run)}` shows its result)"
    if status is RunStatus.CANCELLED:
        return "a cancelled run is never resumed"
    return f"resume it without --input: {suggest(args, 'resume', args.run)}"


def _report(args: argparse.Namespace, outcome: dict[str, Any]) -> int:
    """Print how a resume ended (a table line, or JSON); exit 0."""
    from afk_local.watcher.wakeups import wake_time_text  # noqa: PLC0415 - the watcher

    if args.json:
        emit_json({**outcome, **getattr(args, "report_extra", {})})
        return EXIT_OK
    run_id = outcome["run_id"]
    if outcome["status"] == "completed":
        out(f"run {run_id} completed: {short(outcome['result'], 200)}")
    elif outcome["status"] == "sleeping":
        out(f"run {run_id} sleeping until {wake_time_text(outcome['wake_at_ms'])}")
        out("`afk-local watch` resumes it then")
    else:
        out(f"run {run_id} paused waiting for {outcome['kind']}: {short(outcome['prompt'])}")
        out(f"answer with: {suggest(args, 'resume', run_id, '--input', 'JSON')}")
    return EXIT_OK


def _failed(args: argparse.Namespace, message: str, exc: BaseException) -> int:
    """The job raised (the run is recorded as failed): one line on stderr, exit 1."""
    sys.stderr.write(f"afk-local: {message}\n")
    if args.json:
        emit_json(
            {
                "run_id": args.run,
                "status": "failed",
                "error": {"type": type(exc).__name__, "message": str(exc)},
                **getattr(args, "report_extra", {}),
            }
        )
    else:
        sys.stderr.write(f"afk-local: see `{suggest(args, 'show', args.run)}`\n")
    return EXIT_PROBLEMS


def _hand_over(args: argparse.Namespace, store: Store, plan: ReentryPlan) -> int:
    """Resume in a child under the run's own interpreter (its virtualenv): exit with its code."""
    assert plan.python is not None
    command = [plan.python, "-m", "afk_local", "--root", str(store.root.absolute()), "resume"]
    command.append(args.run)
    if args.input is not None:
        command += ["--input", args.input]
    if getattr(args, "pause_seq", None) is not None:  # an afk-local without it refuses: safe
        command += ["--pause-seq", str(args.pause_seq)]
    if args.in_doubt is not None:
        command += ["--in-doubt", args.in_doubt]
    if args.json:
        command.append("--json")
    env = {**os.environ, **plan.env, REENTERED_ENV: "1"}
    try:
        return subprocess.run(command, env=env, check=False).returncode
    except OSError as exc:
        raise CliError(
            f"run {args.run!r} ran under {plan.python}, which cannot be started here "
            f"({exc.strerror or exc})"
        ) from None


def cmd_cancel(args: argparse.Namespace) -> int:
    """``cancel RUN``: make a run terminal (cancelled) so nothing resumes it."""
    from afk_local.runner.operations.cancel import cancel  # noqa: PLC0415 - the runner

    store = open_store(args)
    require_run(store, args.run)
    meta = store.read_meta(args.run)
    if meta.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise CliError(f"run {args.run!r} is already {meta.status.value}; nothing to cancel")
    cancel(args.run, store=store, reason=args.reason)
    status = store.read_meta(args.run).status.value
    if args.json:
        emit_json({"run_id": args.run, "status": status, "reason": args.reason})
    else:
        out(f"run {args.run}: {status}")
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    """``gc``: compact runs and delete old terminal runs per the policy flags."""
    from afk_local.storage.ops.retention import (  # noqa: PLC0415 - gc only
        DEFAULT_ALWAYS_KEEP,
        RetentionPolicy,
    )

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
        args.runs or None,
        full=not args.no_merge,
        merge=not args.no_merge,
        keep_loose=args.keep_loose,
        dry_run=args.dry_run,
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
    from afk_local.cli.commands.demo import main as demo_main  # noqa: PLC0415 - imports the runner

    if args.steps < 2:
        raise CliError(f"--steps must be at least 2, got {args.steps}")
    root = None
    if args.root is not None:  # given with --root: the demo's own store there, kept
        root = Path(args.root).expanduser()
        if root.is_symlink() or (root.exists() and (not root.is_dir() or any(root.iterdir()))):
            raise CliError(
                f"demo --root {args.root}: not a new or empty directory; the demo writes its "
                "own store there (leave --root out for a temporary one)"
            )
    return demo_main(steps=args.steps, keep=args.keep, as_json=args.json, root=root)


__all__ = [
    "cmd_cancel",
    "cmd_demo",
    "cmd_fork",
    "cmd_gc",
    "cmd_import",
    "cmd_pack",
    "cmd_resume",
    "parse_json_option",
]
