"""The explorer's mutants: each makes the model treat some fsyncs as never made.

A *kind* mutant (:data:`MUTANTS`) removes every fsync of one kind; a *site* mutant
(:data:`SITE_MUTANTS`) removes the fsyncs of one kind that one function of the pack,
merge and gc paths, or of a new run's life (creation, journal, checkpoints, meta),
asked for (:attr:`~afk_local.testing.crashsim.trace.Op.site`).
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
    ("journal._sync_locked", "journal"),  # an intent before its effect, an outcome after
    ("publisher.publish", "file"),  # a checkpoint's bytes (the terminal one)
    ("publisher.publish", "dir"),  # its name and latest
)
"""Every fsync a new run makes (docs/guarantees.md, "What a new run costs"). The
completed ``run.meta`` has none: the terminal checkpoint carries a copy of its bytes."""

SITE_MUTANTS: dict[str, tuple[str, str]] = {
    f"no-fsync@{site}:{kind}": (site, kind) for site, kind in (*_REWRITE_SITES, *RUN_SITES)
}
"""Site mutant name -> the (call site, fsync kind) it removes: every fsync of the pack,
merge and gc paths and of a new run, one at a time
(:attr:`~afk_local.testing.crashsim.trace.Op.site`)."""

REWRITE_MODULES = ("packing", "rewrite", "retention", "maintenance", "metrics")
"""Modules whose fsyncs are the rewrite paths that :data:`SITE_MUTANTS` must cover."""


__all__ = ["MUTANTS", "REWRITE_MODULES", "RUN_SITES", "SITE_MUTANTS"]
