"""The read commands of ``afk-local``: runs, show, log, inspect, effects, diff, verify, export.

None of them changes a run (``verify`` repairs a torn journal tail unless
``--no-repair``); each prints a table or, with ``--json``, JSON for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from afk_local.cli.command import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    emit_json,
    open_store,
    out,
    require_run,
    short,
    suggest,
    warn_untrusted,
)
from afk_local.cli.commands.listing import cmd_runs
from afk_local.cli.commands.metrics import metric_lines, on_terminal
from afk_local.cli.describe import CONVERSATION_CHARS, describe_failure, describe_run
from afk_local.cli.render import log_rows, payload_at, print_table, verify_run
from afk_local.errors import IN_DOUBT_CAUSES
from afk_local.storage import fsio
from afk_local.storage.format.values import plain as to_jsonable
from afk_local.storage.store import Store
from afk_local.storage.views.conversation import conversation, conversation_lines
from afk_local.storage.views.effect_table import effect_rows
from afk_local.storage.views.notebook import format_bytes, format_ms
from afk_local.storage.views.payload_diff import structural_diff
from afk_local.storage.views.run_progress import (
    format_duration,
    format_progress,
    journaled_step,
    progress_of,
)


def cmd_show(args: argparse.Namespace) -> int:
    """``show RUN``: the run's meta, position, effects and what a resume would do."""
    store = open_store(args)
    require_run(store, args.run)
    warn_untrusted(store, args.run)
    facts = describe_run(store, args.run, hint=lambda *words: suggest(args, *words))
    code = EXIT_PROBLEMS if facts["damage"] is not None else EXIT_OK
    if args.json:
        emit_json(facts)
        return code
    width = max(len(k) for k in facts)
    # A durable job that journaled no ctx.step (a plain iterate loop) has no step to show.
    progress = progress_of({"progress": facts["progress"]})
    stepped = journaled_step(facts["step"] or 0, progress) is not None
    for key, value in facts.items():
        if value is None or value in ({}, []) or key in ("extra", "cannot_resume", "wake_at_ms"):
            continue
        if key == "step" and not stepped:
            continue
        lines = _show_lines(store, args.run, key, value, stepped=stepped)
        label = _SHOW_LABELS.get(key, key)
        for index, line in enumerate(lines):
            out(f"{label if index == 0 else '':<{width}}  {line}")
    return code


_SHOW_LABELS = {"active_ms": "elapsed", "eta_s": "eta", "failure": "failed at"}


def _show_lines(
    store: Store, run_id: str, key: str, value: Any, *, stepped: bool = True
) -> list[str]:
    """How ``show`` prints one fact (dicts as JSON, except those with a form of their own).

    ``stepped``: the run journaled a ``ctx.step`` (else no step count is printed).
    """
    if key == "progress":
        progress = progress_of({"progress": value})
        shown = progress and progress.done is not None and stepped
        steps = f" ({progress.steps} steps)" if shown and progress else ""
        return [format_progress(progress) + steps]
    if key == "active_ms":
        return [f"{format_duration(value / 1000)} active (all attempts)"]
    if key == "eta_s":
        return [f"{format_duration(value)} at this attempt's rate"]
    if key == "tags":
        return [" ".join(f"{k}={v}" for k, v in value.items())]
    if key == "failure":
        return [describe_failure(value, with_step=stepped)]
    if key == "conversation" and isinstance(value, dict):
        lines = conversation_lines(value)
        if value["omitted"] or value["truncated"]:
            lines.append(f"(all of it: `afk-local inspect {run_id} --conversation`)")
        return lines
    if key == "metrics" and isinstance(value, dict):
        return metric_lines(value, store.open(run_id).metrics() if on_terminal() else None)
    return [json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value]


def cmd_log(args: argparse.Namespace) -> int:
    """``log RUN``: the checkpoint chain (seq, step, phase, time, size, keyframe or delta)."""
    store = open_store(args)
    require_run(store, args.run)
    warn_untrusted(store, args.run)
    rows = log_rows(store.open(args.run), limit=args.limit)
    if args.json:
        emit_json(rows)
        return EXIT_OK
    if not rows:
        out(f"run {args.run} has no checkpoints yet")
        return EXIT_OK
    print_table(
        ("SEQ", "STEP", "PROGRESS", "PHASE", "TIME", "SIZE", "FRAME"),
        [
            (
                r["seq"],
                *_log_position(r),
                r["phase"],
                format_ms(r["timestamp_ms"]) if r["error"] is None else "DAMAGED",
                r["bytes"],
                r["frame"] if r["error"] is None else r["error"],
            )
            for r in rows
        ],
        align_right=(0, 1, 5),
    )
    return EXIT_OK


def _log_position(row: dict[str, Any]) -> tuple[object, str]:
    """``log``'s STEP and PROGRESS cells: ``-`` for a durable job's checkpoint made before
    any journaled ``ctx.step``, and the loop's (or ``ctx.progress``'s) n/N when known."""
    if row["step"] is None:
        return "?", "?"
    progress = progress_of({"progress": row["progress"]})
    step = journaled_step(row["step"], progress)
    done = format_progress(progress) if progress and progress.done is not None else "-"
    return (step if step is not None else "-"), done


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
    store = open_store(args)
    require_run(store, args.run)
    warn_untrusted(store, args.run)
    if args.conversation:
        return _inspect_conversation(store, args)
    record = _load_checkpoint(store, args.run, args.seq)
    value = payload_at(record.payload, args.path, run_id=args.run, seq=record.seq)
    if args.json:
        emit_json(
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
    out(
        f"run {args.run}  seq {record.seq}  step {record.step}  phase {record.phase}  "
        f"{format_ms(record.timestamp_ms)}{where}"
    )
    out(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))
    return EXIT_OK


def _inspect_conversation(store: Store, args: argparse.Namespace) -> int:
    """``inspect RUN --conversation``: the whole conversation of an agent run (bounded)."""
    if args.seq is not None or args.path:
        raise CliError("--conversation shows the run's whole conversation: give no SEQ or --path")
    found = conversation(store.open(args.run))
    if found is None:
        raise CliError(
            f"run {args.run} holds no conversation (it is not an AgentRunner run, a "
            "pydantic-ai DurableAgent's, an Agents SDK DurableRunner's or a RunSession); "
            "`afk-local inspect RUN` shows its latest checkpoint"
        )
    if args.json:
        emit_json({"run_id": args.run, **found})
        return EXIT_OK
    for line in conversation_lines(found, width=CONVERSATION_CHARS):
        out(line)
    if found["truncated"]:
        out(f"({found['truncated']} long entries cut at {CONVERSATION_CHARS} characters)")
    return EXIT_OK


def cmd_effects(args: argparse.Namespace) -> int:
    """``effects RUN``: every journaled call and its outcome; in doubt first, with how to settle."""
    store = open_store(args)
    require_run(store, args.run)
    warn_untrusted(store, args.run)
    rows = effect_rows(store.open(args.run))
    if args.json:
        emit_json(rows)
        return EXIT_OK
    if not rows:
        out(f"run {args.run} has no journaled effects")
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
    doubtful = [r for r in rows if r["state"] == "in_doubt"]
    if not doubtful:
        return EXIT_OK
    out()
    out(
        f"{len(doubtful)} effect(s) in doubt: started, with no recorded outcome "
        f"({IN_DOUBT_CAUSES}), they may or may not have happened. Check the outside system "
        "for each idempotency key, then record what happened:"
    )
    for r in doubtful:
        out(f"  {r['key']}  (idempotency key {r['idempotency_key']})")
        done = suggest(args, "settle", args.run, r["key"], "--done", "--result", "JSON")
        out(f"    it happened:      {done}")
        out(
            "    it did not:       "
            f"{suggest(args, 'settle', args.run, r['key'], '--failed', 'it did not happen')}"
        )
    out(
        f"then {suggest(args, 'resume', args.run)}; or, without settling, call them all "
        f"again: {suggest(args, 'resume', args.run, '--in-doubt', 'retry')}"
    )
    out(
        "(JSON: what the call returned, replayed by the resume, e.g. --result '{\"id\": 7}' "
        "or --result null; a mistake is taken back with `settle RUN KEY --undo` before resuming)"
    )
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """``diff RUN SEQ_A SEQ_B``: added, removed and changed paths between two payloads."""
    store = open_store(args)
    require_run(store, args.run)
    warn_untrusted(store, args.run)
    a = _load_checkpoint(store, args.run, args.seq_a)
    b = _load_checkpoint(store, args.run, args.seq_b)
    changes = structural_diff(a.payload, b.payload)
    if args.json:
        emit_json({"run_id": args.run, "seq_a": a.seq, "seq_b": b.seq, **changes})
        return EXIT_OK
    out(f"run {args.run}: seq {a.seq} ({a.phase}) -> seq {b.seq} ({b.phase})")
    total = 0
    for path, value in changes["added"].items():
        out(f"+ {path}: {short(value)}")
        total += 1
    for path, value in changes["removed"].items():
        out(f"- {path}: {short(value)}")
        total += 1
    for path, (old, new) in changes["changed"].items():
        out(f"~ {path}: {short(old)} -> {short(new)}")
        total += 1
    if not total:
        out("payloads are identical")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """``verify [RUN ...]``: check every file; exit 1 when anything is damaged."""
    store = open_store(args)
    warn_untrusted(store)
    run_ids = args.runs or store.run_ids()
    for run_id in args.runs:
        require_run(store, run_id)
    results = [verify_run(store, run_id, repair=not args.no_repair) for run_id in run_ids]
    bad = [r for r in results if r["problems"]]
    index_notes: list[str] = []
    index_problems: list[str] = []
    if not args.runs:  # the whole store: its listing index too
        index_notes, index_problems = store.meta_index().disagreements()
    if args.json:
        emit_json(
            {
                "ok": not bad and not index_problems,
                "runs": results,
                "index": {"problems": index_problems, "notes": index_notes},
            }
        )
        return EXIT_PROBLEMS if bad or index_problems else EXIT_OK
    for line in index_problems:
        out(f"DAMAGED {line}")
    for line in index_notes:
        out(f"note: {line}")
    for r in results:
        label = "ok" if not r["problems"] else f"{len(r['problems'])} PROBLEM(S)"
        out(f"{r['run_id']}: {label} ({r['checked_files']} files checked)")
        for p in r["problems"]:
            out(f"  DAMAGED {p['path']}: {p['reason']}")
        for note in r["notes"]:
            out(f"  note: {note}")
        for repaired in r["repaired"]:
            out(f"  repaired: {repaired}")
    if not results:
        out(f"no runs under {store.root}")
    elif bad:
        out(
            f"{len(bad)} of {len(results)} run(s) damaged: restore the named files from a "
            "backup, or fork a damaged run before the damage (`afk-local fork RUN --at SEQ`; a "
            "damaged effect journal: `afk-local fork RUN --salvage`)"
        )
    elif not index_problems:
        out(f"all {len(results)} run(s) ok")
    return EXIT_PROBLEMS if bad or index_problems else EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """``export RUN``: meta, checkpoints and effects as JSON (or JSON lines)."""
    store = open_store(args)
    require_run(store, args.run)
    warn_untrusted(store, args.run)
    from afk_local.storage.ops.export import export_records  # noqa: PLC0415 - export only

    records = export_records(store.open(args.run))
    if args.format == "jsonl":
        text = "".join(json.dumps(to_jsonable(r), ensure_ascii=False) + "\n" for r in records)
    else:
        doc: dict[str, Any] = {"format": "afk-local-export", "version": 1}
        doc["meta"] = next(r["meta"] for r in records if r["type"] == "meta")
        doc["checkpoints"] = [r["checkpoint"] for r in records if r["type"] == "checkpoint"]
        doc["effects"] = [r["effect"] for r in records if r["type"] == "effect"]
        text = json.dumps(to_jsonable(doc), indent=2, ensure_ascii=False) + "\n"
    if args.output in (None, "-"):
        sys.stdout.write(text)  # the export is JSON already, with or without --json
        return EXIT_OK
    data = text.encode("utf-8")
    try:  # 0600 like the run's own files, and never half written
        fsio.atomic_write(args.output, data)
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    if args.json:
        emit_json(
            {
                "run_id": args.run,
                "path": str(args.output),
                "format": args.format,
                "checkpoints": sum(1 for r in records if r["type"] == "checkpoint"),
                "effects": sum(1 for r in records if r["type"] == "effect"),
                "bytes": len(data),
            }
        )
    else:
        out(f"exported run {args.run} to {args.output} ({format_bytes(len(data))})")
    return EXIT_OK


__all__ = [
    "cmd_diff",
    "cmd_effects",
    "cmd_export",
    "cmd_inspect",
    "cmd_log",
    "cmd_runs",
    "cmd_show",
    "cmd_verify",
]
