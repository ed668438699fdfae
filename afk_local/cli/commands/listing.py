"""``afk-local runs``: one line per run, newest created first, and its filters
(``--status``, ``--since``, ``--name``, ``--tag``, ``--limit``).

:func:`add_filter_arguments` declares the flags and :func:`list_runs` applies them
(:class:`~afk_local.storage.views.run_filter.RunFilter` does the deciding), so a command
that lists runs from somewhere else can take the same flags. This module imports only
what listing needs: ``afk-local runs`` starts without the runner, agent and watcher.
"""

from __future__ import annotations

import argparse

from afk_local.cli.command import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    emit_json,
    info_dict,
    open_store,
    out,
    suggest,
    warn_untrusted,
)
from afk_local.cli.render import print_table
from afk_local.errors import AfkLocalError
from afk_local.storage.format.records import RunStatus, now_ms
from afk_local.storage.store import Store
from afk_local.storage.views.notebook import format_bytes, format_ms
from afk_local.storage.views.run_filter import LIVENESS, parse_since, parse_tag
from afk_local.storage.views.run_info import RunInfo, RunList
from afk_local.storage.views.run_progress import (
    format_duration,
    format_progress,
    journaled_step,
)


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``afk-local runs`` that choose runs."""
    p.add_argument(
        "--status",
        choices=[s.value for s in RunStatus] + list(LIVENESS),
        help="only runs with this status (interrupted: a crash left it; live: a process runs it)",
    )
    p.add_argument(
        "--since",
        metavar="AGE",
        help="only runs updated in the last AGE (30m, 2h, 3d, 1w) or since a date/time",
    )
    p.add_argument(
        "--name", metavar="GLOB", help="only runs whose id or job name matches (crawl-*)"
    )
    p.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="K=V",
        help="only runs tagged K=V (or K, any value); repeatable, all must match",
    )
    p.add_argument("--limit", type=_limit, metavar="N", help="at most N runs (the newest)")


def list_runs(store: Store, args: argparse.Namespace) -> RunList:
    """The runs of ``store`` the filter flags in ``args`` choose, newest first.

    Raises:
        CliError: a ``--since`` or ``--tag`` that does not parse (one line, exit 2).
    """
    try:
        since_ms = parse_since(args.since, now_ms()) if args.since else None
        tags = dict(parse_tag(t) for t in args.tag)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return store.runs(args.status, since_ms=since_ms, name=args.name, tags=tags, limit=args.limit)


def describe_filters(args: argparse.Namespace) -> str:
    """`` with status failed, tagged model=small`` (empty without filters), for "no runs" lines."""
    words = []
    if args.status:
        words.append(f"status {args.status}")
    if args.since:
        words.append(f"updated since {args.since}")
    if args.name:
        words.append(f"named {args.name}")
    if args.tag:
        words.append("tagged " + " ".join(args.tag))
    return (" with " + ", ".join(words)) if words else ""


def _step_cell(info: RunInfo) -> object:
    """The STEP cell: ``-`` for a durable job that journaled no ``ctx.step`` (a plain loop)."""
    step = journaled_step(info.step, info.progress)
    return step if step is not None else "-"


def _state_label(info: RunInfo, reason: str | None) -> str:
    if info.lock_problem is not None:
        return f"{info.status.value} (owner.lock damaged)"
    if info.damage is not None:
        return f"{info.status.value} (DAMAGED)"
    blocked = ", cannot resume" if reason else ""
    if info.not_started:
        return f"created (not started{blocked})"
    if info.interrupted:
        return f"{info.status.value} (interrupted{blocked})"
    if info.idle:
        return "paused (idle thread)"
    if info.owner_alive:
        return f"{info.status.value} (live)"
    if info.status.value == RunStatus.SLEEPING.value:  # (`is` would narrow the type of .value)
        return f"sleeping (until {format_ms(info.wake_at_ms)})"
    if reason and info.status is not RunStatus.COMPLETED:
        return f"{info.status.value} (cannot resume)"
    return info.status.value


def _owner_label(info: RunInfo) -> str:
    """The OWNER column: is a process running this run now?

    ``alive`` (it holds the run's lock), ``gone`` (the run expects one and nobody holds
    the lock: a crash left it), ``damaged`` (``owner.lock`` is not a lock), ``-``
    (a paused or finished run, or one not started yet, has no owner).
    """
    if info.lock_problem is not None:
        return "damaged"
    if info.owner_alive:
        return "alive"
    return "gone" if info.status.expects_owner and not info.not_started else "-"


def _reasons(store: Store, infos: list[RunInfo]) -> dict[str, str]:
    """Why each run that still has work to do cannot be resumed, for those that cannot."""
    from afk_local.runner.code.origin import cannot_resume  # noqa: PLC0415 - only for such runs

    reasons = {}
    for info in infos:
        if info.status in (RunStatus.COMPLETED, RunStatus.CANCELLED) or info.owner_alive:
            continue
        if info.idle:  # its own code continues it: nothing for anyone to resume
            continue
        try:
            reason = cannot_resume(store.read_meta(info.run_id))
        except AfkLocalError:
            continue
        if reason is not None:
            reasons[info.run_id] = reason
    return reasons


def cmd_runs(args: argparse.Namespace) -> int:
    """``runs``: one line per run, newest created first.

    Filters: :mod:`afk_local.cli.commands.listing`; ``--remote URL``: the runs on a remote.
    """
    if getattr(args, "remote", None):
        from afk_local.cli.commands.remote import cmd_remote_runs  # noqa: PLC0415 - the remote extra

        return cmd_remote_runs(args)
    store = open_store(args)
    warn_untrusted(store)
    infos = list_runs(store, args)
    reasons = _reasons(store, infos)
    damaged = [i for i in infos if i.damage is not None]
    code = EXIT_PROBLEMS if damaged else EXIT_OK
    if args.json:
        emit_json([{**info_dict(i), "cannot_resume": reasons.get(i.run_id)} for i in infos])
        return code
    if not infos:
        out(f"no runs{describe_filters(args)} under {store.root}")
        return EXIT_OK
    print_table(
        (
            "RUN",
            "STATUS",
            "OWNER",
            "STEP",
            "PROGRESS",
            "ELAPSED",
            "ATTEMPTS",
            "ETA",
            "UPDATED",
            "SIZE",
        ),
        [
            (
                i.run_id,
                _state_label(i, reasons.get(i.run_id)),
                _owner_label(i),
                _step_cell(i),
                format_progress(i.progress),
                format_duration(i.progress.active_ms / 1000) if i.progress else "-",
                i.attempt,
                format_duration(i.eta_s),
                format_ms(i.updated_ms),
                format_bytes(i.bytes),
            )
            for i in infos
        ],
        align_right=(3, 6),
    )
    for run_id, reason in reasons.items():
        out(f"{run_id}: cannot be resumed: {reason}")
    for info in damaged:
        out(f"{info.run_id}: DAMAGED: {info.damage} (`{suggest(args, 'verify', info.run_id)}`)")
    return code


__all__ = ["add_filter_arguments", "cmd_runs", "describe_filters", "list_runs"]
