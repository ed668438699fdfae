"""``push``, ``pull`` and ``runs --remote``: runs on object storage (the ``remote`` extra).

Each command imports :mod:`afk_local.integrations.remote` inside its function, so the
rest of ``afk-local`` starts and works without obstore installed (pyproject's import
contracts list that one lazy import). The URL comes from ``--to``/``--from``/``--remote``,
else ``$AFK_LOCAL_MIRROR``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from afk_local.cli.command import EXIT_OK, EXIT_PROBLEMS, CliError, emit_json, open_store, out
from afk_local.cli.render import print_table
from afk_local.errors import AfkLocalError, LeaseLostError
from afk_local.storage.rundir.mirror import MIRROR_ENV, REMOTE_EXTRA_HINT
from afk_local.storage.rundir.options import default_mirror_url
from afk_local.storage.store import Store
from afk_local.storage.views.notebook import format_bytes, format_ms


def _url(value: str | None, flag: str) -> str:
    url = value or default_mirror_url()
    if not url:
        raise CliError(
            f"no remote given: pass {flag} URL (s3://bucket/prefix, file:///dir) "
            f"or set {MIRROR_ENV}"
        )
    return url


def _remote() -> Any:
    try:
        from afk_local.integrations import remote  # noqa: PLC0415 - the extra, lazily
    except ImportError as exc:
        raise CliError(f"push/pull need the remote extra ({exc}); {REMOTE_EXTRA_HINT}") from None
    return remote


def cmd_push(args: argparse.Namespace) -> int:
    """``push [RUN...] --to URL``: upload what the remote lacks of each run (all by default)."""
    remote = _remote()
    store = open_store(args)
    url = _url(args.to, "--to")
    bucket = remote.Bucket(url)
    run_ids = list(args.runs) or store.run_ids()
    reports, failed = [], 0
    for run_id in run_ids:
        try:
            report = remote.push_run(store, bucket, run_id, concurrency=args.jobs)
        except LeaseLostError as exc:
            failed += 1
            sys.stderr.write(f"afk-local: {exc}\n")
            continue
        except AfkLocalError as exc:
            failed += 1
            sys.stderr.write(f"afk-local: run {run_id}: not pushed: {exc}\n")
            continue
        reports.append(report)
        if not args.json:
            if report.up_to_date:
                out(f"{run_id}: up to date on {url} (epoch {report.epoch})")
            else:
                out(
                    f"{run_id}: pushed {report.files} file(s), {format_bytes(report.bytes)}, "
                    f"{format_bytes(report.journal_bytes)} of journal"
                    f"{', run.meta' if report.meta else ''} (epoch {report.epoch})"
                )
    if args.json:
        emit_json([vars(r) | {"up_to_date": r.up_to_date} for r in reports])
    return EXIT_PROBLEMS if failed else EXIT_OK


def cmd_pull(args: argparse.Namespace) -> int:
    """``pull RUN --from URL [--take]``: copy a run here, verified; --take moves its lease."""
    remote = _remote()
    store = open_store(args, create=True)
    url = _url(args.source, "--from")
    if args.force and not args.take:
        raise CliError("--force only applies to --take")
    try:
        report = remote.pull_run(
            store, url, args.run, take=args.take, force=args.force, concurrency=args.jobs
        )
    except remote.RemoteIntegrityError as exc:
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_PROBLEMS
    if args.json:
        emit_json(vars(report))
        return EXIT_OK
    if report.up_to_date:
        out(f"{args.run}: already up to date here (this store holds epoch {report.epoch})")
    else:
        if report.took:
            how = "taken (this store now holds the lease"
        elif report.read_only:
            how = "pulled (a read-only copy; --take to continue it here"
        else:
            how = "pulled (this store holds the lease"
        out(
            f"{args.run}: {how}, epoch {report.epoch}): {report.files} file(s), "
            f"{format_bytes(report.bytes)}, {format_bytes(report.journal_bytes)} of journal"
            f"{', replaced the local copy' if report.replaced else ''}"
        )
        out(_staleness(report))
    return EXIT_OK


def _staleness(report: Any) -> str:
    """How old the pulled copy is, and what a resume of it treats as in doubt."""
    age = "?" if report.remote_age_ms is None else f"{report.remote_age_ms / 1000:.1f} s"
    text = f"  remote copy: checkpoint {report.seq}, last written {age} ago"
    if report.owner_renewed_ms is not None:
        text += (
            f"; its previous holder renewed its lease {report.owner_renewed_ms / 1000:.1f} s ago"
        )
    if report.in_doubt:
        keys = ", ".join(report.in_doubt[:5]) + (" ..." if len(report.in_doubt) > 5 else "")
        text += (
            f"\n  in doubt on resume ({len(report.in_doubt)}): {keys} (started, no outcome on "
            "the remote: they may have run on the other machine; a resume applies each step's "
            "in-doubt policy: raise, or retry with the same idempotency key; "
            f"`afk-local effects {report.run_id}` shows them)"
        )
    else:
        text += "; no effect in doubt"
    return text


def cmd_remote_runs(args: argparse.Namespace) -> int:
    """``runs --remote URL``: the runs a remote holds, with their lease holder."""
    remote = _remote()
    try:
        store = open_store(args)
    except CliError:  # no local store: fine, it only decides "this store" and the key
        store = Store(getattr(args, "root", None))
    infos = remote.remote_runs(args.remote, store.codec)
    if args.status:
        infos = [i for i in infos if i.status == args.status]
    if args.limit is not None:
        infos = infos[: args.limit]
    if args.json:
        emit_json([vars(i) for i in infos])
        return EXIT_OK
    if not infos:
        out(f"no runs on {args.remote}")
        return EXIT_OK
    me = remote.existing_store_id(store.root) or ""
    print_table(
        ("RUN", "STATUS", "SEQ", "EPOCH", "HOLDER", "UPDATED"),
        [
            (
                i.run_id,
                i.status or f"damaged: {i.problem}"[:60],
                i.seq,
                i.epoch,
                "this store" if i.holder == me else f"{i.holder[:12]} on {i.host or '?'}",
                format_ms(i.updated_ms),
            )
            for i in infos
        ],
    )
    return EXIT_OK


def add_push_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``push``."""
    parser.add_argument("runs", metavar="RUN", nargs="*", help="runs to push (default: all)")
    parser.add_argument("--to", metavar="URL", help=f"the remote (default: ${MIRROR_ENV})")
    parser.add_argument("--jobs", type=int, default=16, help="parallel uploads (default 16)")


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``pull``."""
    parser.add_argument("run", metavar="RUN")
    parser.add_argument(
        "--from", dest="source", metavar="URL", help=f"the remote (default: ${MIRROR_ENV})"
    )
    parser.add_argument(
        "--take",
        action="store_true",
        help="move the run's lease to this store (its previous owner is fenced off)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --take: take even while the owner still renews its lease with the "
        "background mirror (effects it starts meanwhile may run twice; see docs/remote.md)",
    )
    parser.add_argument("--jobs", type=int, default=16, help="parallel downloads (default 16)")


__all__ = [
    "add_pull_arguments",
    "add_push_arguments",
    "cmd_pull",
    "cmd_push",
    "cmd_remote_runs",
]
