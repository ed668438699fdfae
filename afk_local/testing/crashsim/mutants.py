"""The explorer's mutants: each makes the model treat some fsyncs as never made.

A *kind* mutant (:data:`MUTANTS`) removes every fsync of one kind; a *site* mutant
(:data:`SITE_MUTANTS`) removes the fsyncs of one kind that one function of the pack,
merge and gc paths, of a new run's life (creation, journal, checkpoints, meta), of the
other operations, or of what is written outside the runs (a new store root, an export
file, the watcher's service file, a pull) asked for
(:attr:`~afk_local.testing.crashsim.trace.Op.site`).
:mod:`.hunt` looks for the workload that catches each site mutant.
"""

from __future__ import annotations

MUTANTS: dict[str, str] = {
    "no-file-fsync": "file",
    "no-dir-fsync": "dir",
    "no-journal-fsync": "journal",
}
"""Mutant name -> the kind of fsync it removes (a file's data, a directory's entries,
``effects.log`` appends)."""

_REWRITE_SITES: tuple[tuple[str, str], ...] = (
    ("rewrite.write_packs", "file"),  # a new, merged or gc-republished pack's bytes
    ("rewrite.write_packs", "dir"),  # their names, before a manifest names them
    ("rewrite.publish_manifest", "file"),  # the MANIFEST naming what is live
    ("rewrite.publish_manifest", "dir"),  # its rename, before anything is deleted
    ("rewrite.remove_garbage", "dir"),  # what the manifest superseded, removed
    ("retention.rewrite_as_keyframe", "file"),  # gc: a kept delta rewritten as a keyframe
    ("retention.rewrite_as_keyframe", "dir"),
    ("retention.remove_checkpoints", "dir"),  # gc: each deletion round, the replaced packs
    ("retention.compact_run", "file"),  # gc, keyed: chain links in run.meta
    ("retention.compact_run", "dir"),
    ("retention._mark_journal_trimmed", "file"),
    ("retention._mark_journal_trimmed", "dir"),
    ("journal_format.write_journal_file", "file"),  # gc: the trimmed journal
    ("retention._rewrite_journal", "dir"),
    ("maintenance.delete", "dir"),  # gc: a deleted run
)

RUN_SITES: tuple[tuple[str, str], ...] = (
    ("creation._write_meta", "file"),  # a new run's meta, in its unpublished directory
    ("creation._write_first_checkpoint", "file"),  # a Store.create(publish_with_first_write)
    # run's first checkpoint, published with it (a durable function's run has none)
    ("creation._seal", "dir"),  # their names, before the directory can appear
    ("creation._appear", "dir"),  # the run findable: its rename into runs/
    ("appending._sync_locked", "journal"),  # an intent before its effect, an outcome after
    ("publisher.publish", "file"),  # a checkpoint's bytes (the terminal one)
    ("publisher.publish", "dir"),  # its name and latest
)
"""Every fsync a new run makes (docs/guarantees.md, "What a new run costs"). The
completed ``run.meta`` has none: the terminal checkpoint carries a copy of its bytes."""

OPERATION_SITES: tuple[tuple[str, str], ...] = (
    ("creation.begin_run_dir", "dir"),  # runs/ made durable before a run is built in it
    ("writer.open_writer", "file"),  # an attempt's meta (its head record is anchored on it)
    ("writer.open_writer", "dir"),
    ("publisher.repoint_latest", "dir"),  # latest moved on before the attempt writes
    ("meta_keeper._write", "file"),  # a status change: cancel, pause, settle, tags
    ("meta_keeper._write", "dir"),
    ("heads.loosen", "dir"),  # keyed gc: the head narrowed, durably, before the rewrite
    ("removal.keep_journal", "dir"),  # rm: the kept files' names, before the run goes
    ("removal._link_or_copy", "file"),  # rm: the kept run.meta's bytes
    ("fork._fork_once", "file"),  # a fork's meta, journal and latest, then its name
    ("fork._fork_once", "dir"),
    ("fork._share_history", "file"),  # the source's chain links, before history is shared
    ("export.import_run", "file"),  # an imported run's files, then its name
    ("export.import_run", "dir"),
    ("store_identity.ensure_identity", "file"),  # the store's id and path
    ("store_identity.ensure_identity", "dir"),
    ("store_key.write_marker", "file"),  # the keyed-store marker
    ("store_key.write_marker", "dir"),
    ("attempts.update_meta_unowned", "file"),  # the watcher's claim of an attempt, backoff
    ("attempts.update_meta_unowned", "dir"),
    ("schedules.write_schedule", "file"),  # afk-local schedule add
    ("schedules.write_schedule", "dir"),
    ("schedules.remove_schedule", "dir"),  # afk-local schedule rm
    ("schedules._mark", "file"),  # the newest slot a watcher started
    ("schedules._mark", "dir"),
    ("limits.limited", "dir"),  # a shared limit's directory
    ("limits._take_start", "file"),  # the starts a limit counted in the last minute
    ("limits._take_start", "dir"),
    ("requests.write_request", "file"),  # afk-local resume --via-watcher, submit
    ("requests.write_request", "dir"),
    ("requests.reject", "file"),  # a request the watcher moved aside, and why
    ("requests.reject", "dir"),
    ("store_identity.adopt_identity", "file"),  # afk-local adopt: the store's new home
    ("store_identity.adopt_identity", "dir"),
    ("fork._write_edited", "file"),  # afk-local state edit: the fork's edited checkpoint
    ("trust.trust_run", "file"),  # resume --trust: the import mark cleared
    ("trust.trust_run", "dir"),
    ("metrics.write_archive", "file"),  # gc: the deleted checkpoints' metric points
    ("metrics.write_archive", "dir"),
)
"""The fsyncs of the other operations that write: attempts, status changes, rm, fork,
import, the watcher's bookkeeping, schedules, limits, requests, the store's own files."""

OUTSIDE_SITES: tuple[tuple[str, str], ...] = (
    ("command.open_store", "dir"),  # afk-local --root NEW: the new root's name
    ("read.cmd_export", "file"),  # afk-local export -o FILE: its bytes, then its name
    ("read.cmd_export", "dir"),
    ("service.install", "file"),  # afk-local watch --install: the unit file
    ("service.install", "dir"),  # its name (and the directories made for it)
    ("watcher._prepare", "dir"),  # a watcher's first start: runs/ and requests/
)
"""The fsyncs of what the command line and the watcher write outside the runs (the
``watcher-service`` and ``pull-new-root`` workloads)."""

REMOTE_SITES: tuple[tuple[str, str], ...] = (
    ("identity.store_id", "file"),  # the store's owner id, made once
    ("identity.store_id", "dir"),
    ("pull.pull_run", "file"),  # the pulled run's local run.meta
    ("pull.pull_run", "dir"),  # runs/ made for it in a new store
    ("pull.fetch", "file"),  # each downloaded checkpoint or pack
    ("pull._download", "journal"),  # the downloaded journal
    ("pull._publish", "dir"),  # the pulled run's entries and its name (or the swap)
)
"""The fsyncs of a pull (the remote extra; the ``pull-new-root`` and ``pull-replace``
workloads, registered when obstore is installed)."""

FAULT_SITES: tuple[tuple[str, str], ...] = (
    ("fork._link_or_copy", "file"),  # a fork's history copied where links are refused
    ("reading._open", "dir"),  # effects.log made by its first open: its name
    ("reading._load", "journal"),  # a torn tail cut on open
    ("appending._discard_unsynced_locked", "journal"),  # the cut after a failed fsync
    ("mirror.mark_fenced", "file"),  # the fenced marker: another store took the run
    ("mirror.mark_fenced", "dir"),
)
"""The fsyncs of paths a healthy local disk never takes (links refused, a torn journal, a
failed fsync) and of fencing (:mod:`.suites.faults`)."""

LANGGRAPH_SITES: tuple[tuple[str, str], ...] = (
    ("index.open_index_cache", "journal"),  # a torn tail of the index cache cut
    ("index.open_index_cache", "file"),  # a new (or older-format) cache's marker
    ("index.open_index_cache", "dir"),
    ("index.record_deletions", "journal"),  # tombstones before a name can be used again
    ("threads.delete_files", "dir"),  # latest moved off the deleted checkpoints
    ("writes.rewrite_writes", "file"),  # the writes of the kept checkpoints
    ("writes.rewrite_writes", "dir"),
    ("writes.append_writes", "journal"),  # put_writes: durable before it returns
    ("writes.open_writes", "dir"),  # a new thread's writes file: its name
)
"""The fsyncs of the LangGraph saver (:mod:`.suites.langgraph`, when LangGraph is
installed)."""

SUBSUMED_SITES: dict[tuple[str, str], str] = {
    ("reading._load", "journal"): "the cut of a torn tail on open: the next append's fsync "
    "makes it durable before anything is acknowledged, and a crash that loses it brings "
    "back only the same torn tail, which readers ignore and the next writable open cuts",
    ("index.open_index_cache", "journal"): "the cut of the LangGraph index cache's torn "
    "tail: entries appended after it are never fsynced (a lost one is a cache miss) but "
    "tombstones, whose fsync makes the cut durable with them",
    ("index.open_index_cache", "file"): "a new index cache's marker: a cache that lost its "
    "bytes has no marker, so it is not trusted (each entry is checked against its file's "
    "crc); the tombstones that must last are fsynced with it",
    ("index.open_index_cache", "dir"): "a new index cache's name: a cache a crash removes "
    "held no entry yet for a deleted name (it was made by this open), so none can be stale",
    ("threads.delete_files", "dir"): "latest moved off the deleted checkpoints: a lost move "
    "leaves latest naming a deleted file, which readers skip and the next writer repoints; "
    "the next fsync of the run directory (the writes rewrite, the next put) covers it",
    ("writes.rewrite_writes", "dir"): "the LangGraph writes file rewritten without the "
    "deleted checkpoints': a lost rename brings back the old file, which holds every kept "
    "write too; the others belong to deleted ids, and a re-put id reads only the writes "
    "after the mark its put took",
}
"""Fsyncs whose loss no crash can show, and why: a workload records each and its site
mutant exists, but survives by construction (the site-coverage test checks that it
does, so a change that makes one matter moves it back among those that must be caught)."""

SITE_MUTANTS: dict[str, tuple[str, str]] = {
    f"no-fsync@{site}:{kind}": (site, kind)
    for site, kind in (
        *_REWRITE_SITES,
        *RUN_SITES,
        *OPERATION_SITES,
        *OUTSIDE_SITES,
        *REMOTE_SITES,
        *FAULT_SITES,
        *LANGGRAPH_SITES,
    )
}
"""Site mutant name -> the (call site, fsync kind) it removes: every fsync of the pack,
merge and gc paths and of a new run, one at a time
(:attr:`~afk_local.testing.crashsim.trace.Op.site`)."""

UNMODELLED_SITES: dict[str, str] = {}
"""Call sites of the I/O seam's fsyncing methods in afk_local's source that no workload
records, and why: the site-coverage test fails on any other (a new fsync must come with
a workload that makes it and a site mutant that workload catches)."""

SEAM_FSYNC_METHODS = frozenset(
    {
        "fsync_fd",
        "fsync_dir",
        "atomic_write",
        "atomic_symlink",
        "publish_with_link",
        "write_new_file",
        "make_dir",
        "make_dirs",
        "publish_dir",
        "truncate",
    }
)
"""The methods of :class:`afk_local.storage.fsio.Env` (and the module's functions) that
may fsync: a call to one is a site, unless it passes a ``sync*=False`` constant."""

REWRITE_MODULES = ("packing", "rewrite", "retention", "maintenance", "metrics")
"""Modules whose fsyncs are the rewrite paths that :data:`SITE_MUTANTS` must cover."""


__all__ = [
    "FAULT_SITES",
    "MUTANTS",
    "OPERATION_SITES",
    "OUTSIDE_SITES",
    "REMOTE_SITES",
    "REWRITE_MODULES",
    "RUN_SITES",
    "SEAM_FSYNC_METHODS",
    "SITE_MUTANTS",
    "SUBSUMED_SITES",
    "UNMODELLED_SITES",
]
