"""``afk-local replay``: would the job's current code reproduce a run's journal?

One run (``replay RUN``) is replayed in this process, which was started for it; a
selection (``--all``, ``--status``, ``--name``...) replays each run in a child process
of its own, so that one job's imports and working directory never leak into the next.
Exit 0 when every replayed run is reproduced, 1 when one diverges or cannot be replayed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from typing import Any

from afk_local.agent.rebuild import is_agent_run
from afk_local.cli.command import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    emit_json,
    open_store,
    out,
    require_run,
    suggest,
)
from afk_local.cli.commands.listing import list_runs
from afk_local.errors import AfkLocalError
from afk_local.runner.code.origin import REENTERED_ENV, reentry_plan
from afk_local.runner.operations.replay_run import replay_run
from afk_local.runner.run.replay import ReplayReport
from afk_local.storage.format.records import RunStatus
from afk_local.storage.ops.fork import JOURNAL_TRIMMED_KEY
from afk_local.storage.store import Store

_CHILD_TIMEOUT_S = 600.0
"""How long one run's replay child may take in ``--all`` (a job stuck outside its steps)."""


def cmd_replay(args: argparse.Namespace) -> int:
    """``replay [RUN] [--all | --status S | --name GLOB ...] [--json]``."""
    store = open_store(args)
    selecting = args.all or args.status or args.name or args.since or args.tag
    if args.run is not None and selecting:
        raise CliError("give either RUN or a selection (--all, --status, --name...), not both")
    if args.run is None:
        if not selecting:
            raise CliError("give a RUN, or --all (with --status/--name to choose runs)")
        return _replay_many(args, store)
    require_run(store, args.run)
    meta = store.read_meta(args.run)
    if is_agent_run(meta):
        raise CliError(
            f"run {args.run!r} is an AgentRunner run: replay checks the runs of durable jobs "
            "(@afk.durable, and the pydantic-ai and Agents SDK integrations)"
        )
    if meta.extra.get(JOURNAL_TRIMMED_KEY):
        raise CliError(
            f"run {args.run!r} cannot be replayed: gc trimmed its journal (max_effects_per_run), "
            "so the calls it made first are gone"
        )
    plan = reentry_plan(meta)
    if plan.other_interpreter and not os.environ.get(REENTERED_ENV):
        report = _replay_in_child(store, args.run, plan.python, plan.env)
    else:
        report = _replay_here(store, args.run)
    if args.json:
        emit_json(report)
    else:
        _print(args, report)
    return EXIT_OK if report.get("ok") else EXIT_PROBLEMS


def _replay_here(store: Store, run_id: str) -> dict[str, Any]:
    """Replay ``run_id`` in this process (started for it); what the job prints goes to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        try:
            report: ReplayReport = replay_run(store, run_id, reenter=True)
        except AfkLocalError as exc:
            return _cannot(run_id, str(exc))
    return report.to_json()


def _replay_many(args: argparse.Namespace, store: Store) -> int:
    reports = []
    for info in list_runs(store, args):
        if info.status is RunStatus.CANCELLED or not info.entrypoint:
            continue  # never resumes, or no job to run
        meta = store.read_meta(info.run_id)
        if is_agent_run(meta) or meta.extra.get(JOURNAL_TRIMMED_KEY):
            continue  # rebuilt, not re-run; or its first calls are gone (finished runs only)
        plan = reentry_plan(meta)
        python = plan.python if plan.other_interpreter else sys.executable
        reports.append(_replay_in_child(store, info.run_id, python, plan.env))
    ok = all(r.get("ok") for r in reports)
    if args.json:
        emit_json({"ok": ok, "runs": reports})
    else:
        if not reports:
            out("no runs of a durable job to replay")
        for report in reports:
            _print(args, report)
        bad = sum(1 for r in reports if not r.get("ok"))
        if reports:
            out(f"{len(reports) - bad} of {len(reports)} runs reproduced by the current code")
    return EXIT_OK if ok else EXIT_PROBLEMS


def _replay_in_child(
    store: Store, run_id: str, python: str | None, env: dict[str, str]
) -> dict[str, Any]:
    """``afk-local replay RUN --json`` in a fresh process; its report."""
    command = [python or sys.executable, "-m", "afk_local", "--root", str(store.root.absolute())]
    command += ["replay", run_id, "--json"]
    try:
        done = subprocess.run(
            command,
            env={**os.environ, **env, REENTERED_ENV: "1"},
            capture_output=True,
            text=True,
            check=False,
            timeout=_CHILD_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _cannot(run_id, f"its replay process failed: {exc}")
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return _cannot(run_id, why.removeprefix("afk-local: "))
    return report


def _cannot(run_id: str, why: str) -> dict[str, Any]:
    return {"run_id": run_id, "ok": False, "error": why, "divergence": None}


def _print(args: argparse.Namespace, report: dict[str, Any]) -> None:
    run_id = report["run_id"]
    if report.get("error"):
        out(f"run {run_id}: cannot replay: {report['error']}")
        return
    d = report.get("divergence")
    if d is None:
        where = report.get("frontier")
        tail = f"; a resume goes on live at {where}" if where else ""
        out(
            f"run {run_id} ({report['status']}): reproduced, {report['replayed']} of "
            f"{report['recorded']} journaled calls replayed{tail}"
        )
    else:
        out(f"run {run_id} ({report['status']}): DIVERGES at call {d['position']} ({d['key']})")
        out(f"  the run recorded: {d['recorded']}")
        out(f"  the code now asks: {d['asked']}")
        out(f"  what to do: {d['advice']}")
    if report.get("raised"):
        out(f"  the code raised {report['raised']}")
    for patch in report.get("old_branches") or ():
        out(f"  takes the old branch of patch {patch!r} (keep its ctx.patched for now)")
    if d is not None:
        out(f"  (see the journal: {suggest(args, 'effects', run_id)})")


__all__ = ["cmd_replay"]
