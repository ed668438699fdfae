"""The ``afk-local`` command line (argparse); ``python -m afk_local`` is the same.

Every command takes ``--root`` (else ``$AFK_LOCAL_ROOT``, else ``./.afk``); read
commands take ``--json`` for scripts. Exit codes: 0 ok, 1 problems found (``verify``,
a resumed job that failed), 2 usage errors, unknown runs or checkpoints, bad input.
Errors are one line on stderr saying what to do; user errors never print a traceback.
docs/cli.md shows every command with its output.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from afk_local import __version__
from afk_local.cli_render import (
    describe_run,
    effect_rows,
    log_rows,
    payload_at,
    print_table,
    structural_diff,
    verify_run,
)
from afk_local.errors import (
    AfkLocalError,
    RunLockedError,
    RunNotFoundError,
    RunPaused,
)
from afk_local.export import export_records, import_run, to_jsonable
from afk_local.notebook import format_bytes, format_ms
from afk_local.records import RunStatus
from afk_local.retention import DEFAULT_ALWAYS_KEEP, RetentionPolicy
from afk_local.store import ROOT_ENV, RunInfo, Store, default_root

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_LOCKED = 75
"""``resume``: another process holds the run's lock (EX_TEMPFAIL; the watcher's lost race)."""


class CliError(Exception):
    """A user error: printed as one line, exit code 2 (or ``code``)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# -- output ---------------------------------------------------------------------------


def _emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False) + "\n")


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


# -- store and run helpers --------------------------------------------------------------


def _store(args: argparse.Namespace) -> Store:
    root = getattr(args, "root", None)
    return Store(Path(root) if root else default_root())


def _require_run(store: Store, run_id: str) -> None:
    store.paths(run_id)  # validates the id
    if not store.exists(run_id):
        raise RunNotFoundError(run_id, str(store.root))


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


def _info_dict(info: RunInfo) -> dict[str, Any]:
    return {
        "run_id": info.run_id,
        "status": info.status.value,
        "interrupted": info.interrupted,
        "owner_alive": info.owner_alive,
        "step": info.step,
        "seq": info.seq,
        "phase": info.phase,
        "updated_ms": info.updated_ms,
        "bytes": info.bytes,
        "thread_id": info.thread_id,
        "parent_run_id": info.parent_run_id,
        "entrypoint": info.entrypoint,
        "attempt": info.attempt,
    }


def _state_label(info: RunInfo) -> str:
    if info.interrupted:
        return f"{info.status.value} (interrupted)"
    if info.owner_alive:
        return f"{info.status.value} (live)"
    return info.status.value


# -- read commands ----------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    """``runs``: one line per run, newest first."""
    store = _store(args)
    infos = store.runs(args.status)
    if args.limit is not None:
        infos = infos[: args.limit]
    if args.json:
        _emit_json([_info_dict(i) for i in infos])
        return EXIT_OK
    if not infos:
        which = f" with status {args.status}" if args.status else ""
        _out(f"no runs{which} under {store.root}")
        return EXIT_OK
    print_table(
        ("RUN", "STATUS", "STEP", "SEQ", "PHASE", "UPDATED", "SIZE"),
        [
            (
                i.run_id,
                _state_label(i),
                i.step,
                i.seq,
                i.phase or "-",
                format_ms(i.updated_ms),
                format_bytes(i.bytes),
            )
            for i in infos
        ],
    )
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    """``show RUN``: the run's meta, position, effects and what a resume would do."""
    store = _store(args)
    _require_run(store, args.run)
    facts = describe_run(store, args.run)
    if args.json:
        _emit_json(facts)
        return EXIT_OK
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if value is None or value in ({}, []):
            continue
        text = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
        _out(f"{key:<{width}}  {text}")
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    """``log RUN``: the checkpoint chain (seq, step, phase, time, size, keyframe or delta)."""
    store = _store(args)
    _require_run(store, args.run)
    rows = log_rows(store.open(args.run), limit=args.limit)
    if args.json:
        _emit_json(rows)
        return EXIT_OK
    if not rows:
        _out(f"run {args.run} has no checkpoints yet")
        return EXIT_OK
    print_table(
        ("SEQ", "STEP", "PHASE", "TIME", "SIZE", "FRAME"),
        [
            (
                r["seq"],
                r["step"] if r["step"] is not None else "?",
                r["phase"],
                format_ms(r["timestamp_ms"]) if r["error"] is None else "DAMAGED",
                r["bytes"],
                r["frame"] if r["error"] is None else r["error"],
            )
            for r in rows
        ],
        align_right=(0, 1, 4),
    )
    return EXIT_OK


def _load_checkpoint(store: Store, run_id: str, seq: int | None) -> Any:
    reader = store.open(run_id)
    if seq is None:
        record = reader.latest()
        if record is None:
            raise CliError(f"run {run_id!r} has no checkpoints yet; nothing to inspect")
        return record
    if seq < 1:
        raise CliError(f"seq must be >= 1, got {seq}: run `afk-local log {run_id}` to list them")
    return reader.get(seq)


def cmd_inspect(args: argparse.Namespace) -> int:
    """``inspect RUN [SEQ] [--path a.b.c]``: one checkpoint's payload, pretty."""
    store = _store(args)
    _require_run(store, args.run)
    record = _load_checkpoint(store, args.run, args.seq)
    value = payload_at(record.payload, args.path, run_id=args.run, seq=record.seq)
    if args.json:
        _emit_json(
            {
                "run_id": args.run,
                "seq": record.seq,
                "step": record.step,
                "phase": record.phase,
                "timestamp_ms": record.timestamp_ms,
                "path": args.path,
                "value": value,
            }
        )
        return EXIT_OK
    where = f" path {args.path}" if args.path else ""
    _out(
        f"run {args.run}  seq {record.seq}  step {record.step}  phase {record.phase}  "
        f"{format_ms(record.timestamp_ms)}{where}"
    )
    _out(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_effects(args: argparse.Namespace) -> int:
    """``effects RUN``: every journaled call with its outcome, or in doubt."""
    store = _store(args)
    _require_run(store, args.run)
    rows = effect_rows(store.open(args.run))
    if args.json:
        _emit_json(rows)
        return EXIT_OK
    if not rows:
        _out(f"run {args.run} has no journaled effects")
        return EXIT_OK
    print_table(
        ("KEY", "NAME", "STEP", "STATE", "ATTEMPTS", "INTENT", "OUTCOME"),
        [
            (
                r["key"],
                r["name"] or "-",
                r["step"],
                "IN DOUBT" if r["state"] == "in_doubt" else r["state"],
                r["attempts"],
                format_ms(r["intent_ms"]),
                format_ms(r["outcome_ms"]),
            )
            for r in rows
        ],
        align_right=(2, 4),
    )
    doubtful = sum(1 for r in rows if r["state"] == "in_doubt")
    if doubtful:
        _out(
            f"{doubtful} effect(s) in doubt: they started before a crash and may or may not "
            "have happened; check the outside system for their idempotency keys "
            "(`--json` shows them) before resuming"
        )
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """``diff RUN SEQ_A SEQ_B``: added, removed and changed paths between two payloads."""
    store = _store(args)
    _require_run(store, args.run)
    a = _load_checkpoint(store, args.run, args.seq_a)
    b = _load_checkpoint(store, args.run, args.seq_b)
    changes = structural_diff(a.payload, b.payload)
    if args.json:
        _emit_json({"run_id": args.run, "seq_a": a.seq, "seq_b": b.seq, **changes})
        return EXIT_OK
    _out(f"run {args.run}: seq {a.seq} ({a.phase}) -> seq {b.seq} ({b.phase})")
    total = 0
    for path, value in changes["added"].items():
        _out(f"+ {path}: {_short(value)}")
        total += 1
    for path, value in changes["removed"].items():
        _out(f"- {path}: {_short(value)}")
        total += 1
    for path, (old, new) in changes["changed"].items():
        _out(f"~ {path}: {_short(old)} -> {_short(new)}")
        total += 1
    if not total:
        _out("payloads are identical")
    return EXIT_OK


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(to_jsonable(value), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cmd_verify(args: argparse.Namespace) -> int:
    """``verify [RUN ...]``: check every file; exit 1 when anything is damaged."""
    store = _store(args)
    run_ids = args.runs or store.run_ids()
    for run_id in args.runs:
        _require_run(store, run_id)
    results = [verify_run(store, run_id, repair=not args.no_repair) for run_id in run_ids]
    bad = [r for r in results if r["problems"]]
    if args.json:
        _emit_json({"ok": not bad, "runs": results})
        return EXIT_PROBLEMS if bad else EXIT_OK
    for r in results:
        label = "ok" if not r["problems"] else f"{len(r['problems'])} PROBLEM(S)"
        _out(f"{r['run_id']}: {label} ({r['checked_files']} files checked)")
        for p in r["problems"]:
            _out(f"  DAMAGED {p['path']}: {p['reason']}")
        for note in r["notes"]:
            _out(f"  note: {note}")
        for repaired in r["repaired"]:
            _out(f"  repaired: {repaired}")
    if not results:
        _out(f"no runs under {store.root}")
    elif bad:
        _out(
            f"{len(bad)} of {len(results)} run(s) damaged: restore the named files from a "
            "backup, or fork a damaged run before the damage (`afk-local fork RUN --at SEQ`)"
        )
    else:
        _out(f"all {len(results)} run(s) ok")
    return EXIT_PROBLEMS if bad else EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """``export RUN``: meta, checkpoints and effects as JSON (or JSON lines)."""
    store = _store(args)
    _require_run(store, args.run)
    records = export_records(store.open(args.run))
    out = sys.stdout if args.output in (None, "-") else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    try:
        if args.format == "jsonl":
            for record in records:
                out.write(json.dumps(to_jsonable(record), ensure_ascii=False) + "\n")
        else:
            doc: dict[str, Any] = {"format": "afk-local-export", "version": 1}
            doc["meta"] = next(r["meta"] for r in records if r["type"] == "meta")
            doc["checkpoints"] = [r["checkpoint"] for r in records if r["type"] == "checkpoint"]
            doc["effects"] = [r["effect"] for r in records if r["type"] == "effect"]
            out.write(json.dumps(to_jsonable(doc), indent=2, ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return EXIT_OK


# -- write commands ---------------------------------------------------------------------


def cmd_import(args: argparse.Namespace) -> int:
    """``import FILE``: recreate an exported run in this store."""
    store = _store(args)
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    run_id = import_run(store, text, new_run_id=args.as_id, source=args.file)
    if args.json:
        _emit_json(_info_dict(store.info(run_id)))
    else:
        _out(f"imported run {run_id} into {store.root}")
    return EXIT_OK


def cmd_fork(args: argparse.Namespace) -> int:
    """``fork RUN --at SEQ [--as NEW_ID]``: time travel into a new run."""
    store = _store(args)
    _require_run(store, args.run)
    if args.at < 1:
        raise CliError(f"--at must be >= 1: run `afk-local log {args.run}` to list checkpoints")
    info = store.fork(args.run, args.at, args.as_id)
    if args.json:
        _emit_json(_info_dict(info))
    else:
        _out(f"forked {args.run} at seq {args.at} into {info.run_id} (step {info.step})")
        _out(f"continue it with: afk-local resume {info.run_id}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume RUN [--input JSON]``: continue a run in this process."""
    value = _parse_input(args.input)
    store = _store(args)
    _require_run(store, args.run)
    if args.via_watcher:
        watcher = _watcher_module()
        return int(watcher.main_request_resume(args, store, value))
    meta = store.read_meta(args.run)
    if meta.status is RunStatus.COMPLETED:
        raise CliError(f"run {args.run!r} already completed; nothing to resume", EXIT_OK)
    try:
        from afk_local.runner import resume_run  # noqa: PLC0415 - optional until it lands
    except ImportError:
        raise CliError(
            "this afk_local has no durable-function runner (afk_local.runner); "
            "resume the run from Python with the code that created it"
        ) from None
    try:
        result = resume_run(args.run, store, value)
    except RunLockedError as exc:  # another process is resuming it: the watcher's "taken"
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_LOCKED
    except RunPaused as paused:
        if args.json:
            _emit_json({"run_id": args.run, "status": "paused", "prompt": paused.prompt})
        else:
            _out(f"run {args.run} paused waiting for {paused.kind}: {_short(paused.prompt)}")
            _out(f"answer with: afk-local resume {args.run} --input JSON")
        return EXIT_OK
    except (AfkLocalError, CliError):
        raise
    except Exception as exc:  # the job itself raised: the run is recorded as failed
        sys.stderr.write(f"afk-local: run {args.run} failed: {type(exc).__name__}: {exc}\n")
        sys.stderr.write(f"afk-local: see `afk-local show {args.run}`\n")
        return EXIT_PROBLEMS
    if args.json:
        _emit_json({"run_id": args.run, "status": "completed", "result": result})
    else:
        _out(f"run {args.run} completed: {_short(result, 200)}")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    """``cancel RUN``: make a run terminal (cancelled) so nothing resumes it."""
    store = _store(args)
    _require_run(store, args.run)
    meta = store.read_meta(args.run)
    if meta.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise CliError(f"run {args.run!r} is already {meta.status.value}; nothing to cancel")
    try:
        from afk_local import runner  # noqa: PLC0415 - optional until it lands

        cancel: Callable[..., Any] | None = getattr(runner, "cancel", None)
    except ImportError:
        cancel = None
    if cancel is not None:
        cancel(args.run, store=store, reason=args.reason)
    else:
        with store.resume_writer(args.run) as writer:
            writer.cancel(args.reason)
    status = store.read_meta(args.run).status.value
    if args.json:
        _emit_json({"run_id": args.run, "status": status})
    else:
        _out(f"run {args.run}: {status}")
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    """``gc``: compact runs and delete old terminal runs per the policy flags."""
    store = _store(args)
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
        _emit_json(report.to_dict())
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
    _out(
        f"{prefix}{len(report.compacted)} run(s) checked, {verb} {format_bytes(report.bytes_freed)}"
        f"; {gone} {len(report.deleted_runs)} whole run(s)"
        + (f": {', '.join(report.deleted_runs)}" if report.deleted_runs else "")
    )
    if report.skipped_locked:
        _out(f"skipped (owner alive): {', '.join(report.skipped_locked)}")
    for error in report.errors:
        _out(f"error: {error}")
    return EXIT_PROBLEMS if report.errors else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: crash a small job with SIGKILL, resume it, show that nothing ran twice."""
    from afk_local.demo import main as demo_main  # noqa: PLC0415 - imports the runner

    return demo_main(steps=args.steps, keep=args.keep)


def _watcher_module() -> Any:
    try:
        from afk_local import watcher  # type: ignore[attr-defined,unused-ignore]  # noqa: PLC0415
    except ImportError:
        raise CliError("this afk_local has no watcher (afk_local.watcher) yet") from None
    return watcher


def cmd_watch(args: argparse.Namespace) -> int:
    """``watch``: resume interrupted runs now and whenever they appear (afk_local.watcher)."""
    return int(_watcher_module().main_watch(args))


def cmd_submit(args: argparse.Namespace) -> int:
    """``submit``: hand a job to the watcher (afk_local.watcher)."""
    return int(_watcher_module().main_submit(args))


# -- parser -----------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a checkpoint seq is a whole number, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a checkpoint seq is >= 1, got {value}")
    return value


def _size(text: str) -> int:
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    clean = text.strip().lower().removesuffix("b")
    factor = units.get(clean[-1:], 1)
    number = clean[:-1] if clean[-1:] in units else clean
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 2G, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a size is >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``afk-local``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        default=argparse.SUPPRESS,
        help=f"the store directory (default: ${ROOT_ENV}, else ./.afk)",
    )
    reading = argparse.ArgumentParser(add_help=False, parents=[common])
    reading.add_argument("--json", action="store_true", help="machine-readable output")

    parser = argparse.ArgumentParser(
        prog="afk-local",
        description="Inspect, resume, fork and clean afk_local checkpoint runs.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"afk-local {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str,
        handler: Callable[[argparse.Namespace], int],
        help_text: str,
        *,
        json_flag: bool = True,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, help=help_text, description=help_text, parents=[reading if json_flag else common]
        )
        p.set_defaults(handler=handler)
        return p

    p = add("runs", cmd_runs, "list runs, newest first")
    p.add_argument(
        "--status", choices=[s.value for s in RunStatus], help="only runs with this status"
    )
    p.add_argument("--limit", type=_positive_int, help="at most N runs")

    p = add("show", cmd_show, "everything about one run")
    p.add_argument("run", metavar="RUN")

    p = add("log", cmd_log, "the checkpoint chain of a run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--limit", type=_positive_int, help="only the newest N checkpoints")

    p = add("inspect", cmd_inspect, "the payload of one checkpoint (default: latest)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("seq", metavar="SEQ", nargs="?", type=_seq)
    p.add_argument("--path", help="dotted path into the payload, e.g. state.items.0")

    p = add("effects", cmd_effects, "journaled side effects: intent, outcome, in doubt")
    p.add_argument("run", metavar="RUN")

    p = add("diff", cmd_diff, "structural diff of two checkpoints' payloads")
    p.add_argument("run", metavar="RUN")
    p.add_argument("seq_a", metavar="SEQ_A", type=_seq)
    p.add_argument("seq_b", metavar="SEQ_B", type=_seq)

    p = add("verify", cmd_verify, "check every file of every run (exit 1 on damage)")
    p.add_argument("runs", metavar="RUN", nargs="*")
    p.add_argument("--no-repair", action="store_true", help="report torn journal tails only")

    p = add("export", cmd_export, "a run as JSON (meta, checkpoints, effects)", json_flag=False)
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", choices=("json", "jsonl"), default="json")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")

    p = add("import", cmd_import, "recreate an exported run (FILE or - for stdin)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--as", dest="as_id", metavar="NEW_ID", help="import under another run id")

    p = add("resume", cmd_resume, "continue a run (its entrypoint is re-imported)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--input", metavar="JSON", help="the answer for a paused run, as JSON")
    p.add_argument(
        "--via-watcher", action="store_true", help="ask the running watcher to resume it"
    )

    p = add("fork", cmd_fork, "a new run continuing from checkpoint SEQ of RUN")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--at", type=_seq, required=True, metavar="SEQ")
    p.add_argument("--as", dest="as_id", metavar="NEW_ID", help="the new run's id")

    p = add("cancel", cmd_cancel, "mark a run cancelled so nothing resumes it")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--reason", default="cancelled from the command line")

    p = add("gc", cmd_gc, "compact runs and delete old finished runs")
    p.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    p.add_argument("--keep-runtime-states", type=_positive_int, default=3, metavar="N")
    p.add_argument(
        "--keep-phase",
        action="append",
        metavar="PHASE",
        help="always keep checkpoints of this phase (repeatable; replaces the default set)",
    )
    p.add_argument("--no-keep-latest-step", action="store_true")
    p.add_argument("--max-effects-per-run", type=_positive_int, metavar="N")
    p.add_argument("--max-runs", type=_positive_int, metavar="N")
    p.add_argument("--max-age-days", type=float, metavar="DAYS")
    p.add_argument("--max-bytes", type=_size, metavar="SIZE", help="e.g. 500M, 2G")

    p = add(
        "demo", cmd_demo, "crash a job with SIGKILL and resume it (a few seconds)", json_flag=False
    )
    p.add_argument("--steps", type=_positive_int, default=40)
    p.add_argument("--keep", action="store_true", help="keep the temporary store and print it")

    # The watcher registers its flags in afk_local.watcher; these stay thin.
    from afk_local import watcher_cli  # noqa: PLC0415 - the watcher owns these flags

    p = add("watch", cmd_watch, "resume interrupted runs now and as they appear", json_flag=False)
    watcher_cli.add_watch_arguments(p)
    p = add("submit", cmd_submit, "hand a job to the watcher", json_flag=False)
    watcher_cli.add_submit_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stdout)
        return EXIT_USAGE
    if getattr(args, "root", None) is None:
        args.root = None
    try:
        return int(args.handler(args))
    except CliError as exc:
        if exc.code == EXIT_OK:
            _out(str(exc))
            return EXIT_OK
        sys.stderr.write(f"afk-local: {exc}\n")
        return exc.code
    except RunLockedError as exc:
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_USAGE
    except AfkLocalError as exc:
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        sys.stderr.write(f"afk-local: bad input: {exc}\n")
        return EXIT_USAGE
    except OSError as exc:
        where = exc.filename or getattr(args, "root", None) or default_root()
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            reason = "a file is in the way (not a directory)"
        sys.stderr.write(
            f"afk-local: cannot use {where}: {reason}; choose a writable "
            f"directory with --root or {ROOT_ENV}\n"
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("afk-local: interrupted\n")
        return 130
