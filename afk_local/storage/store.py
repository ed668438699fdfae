"""The root of many runs: create, open, list and delete run directories.

Example:
    >>> import afk_local as afk
    >>> store = afk.Store("/tmp/afk-doc-store")
    >>> with store.create() as run:
    ...     _ = run.checkpoint("runtime_state", {"done": 1}, step=1)
    >>> store.open(run.run_id).latest().payload
    {'done': 1}
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afk_local.errors import (
    RunLockedError,
)
from afk_local.storage.format.records import RunMeta
from afk_local.storage.rundir.ownership import (
    lock_is_held,
)
from afk_local.storage.store_runs import StoreRuns

# Writing, gc, packing, fork and the run listings are imported where they are
# used: a process that only opens a store and reads a run (a LangGraph saver's cold
# get_tuple, `afk-local show`) does not pay for them, nor for filelock and the journal.
if TYPE_CHECKING:
    from afk_local.storage.ops.retention import GcReport, RetentionPolicy
    from afk_local.storage.rundir.packing import PackReport
    from afk_local.storage.views.run_info import RunInfo


class Store(StoreRuns):
    """A directory of runs (``<root>/runs/<run_id>/``).

    Every setting is in a :class:`~afk_local.StoreOptions` (docs/options.md lists each
    one, its default and its environment variable). Pass ``options=`` or the
    keyword arguments below, or both (a keyword given wins over ``options``).
    Without ``options`` the environment is read once, here
    (:meth:`StoreOptions.from_environ`); an explicit ``options`` is used as it is.

    The facade over its parts: :class:`~afk_local.storage.store_settings.StoreSettings`
    (settings, key, mirror, write checks), :class:`~afk_local.storage.store_runs.StoreRuns`
    (create, open, list) and :mod:`~afk_local.storage.maintenance` (gc, pack, fork, delete).

    Args:
        root: the store's directory; default ``$AFK_LOCAL_ROOT``, else ``./.afk``.
        options: every setting at once; default ``StoreOptions.from_environ()``.
        enc_hook / dec_hook: msgspec hooks for custom payload types (never pickle).
        max_record_bytes: largest decoded record written or read (default
            ``$AFK_LOCAL_MAX_RECORD_BYTES``, else 256 MiB). Reading a record allocates at
            most this much (plus one delta base of at most 64 MiB).
        lock_timeout: seconds a writer waits for a run's lock before RunLockedError.
        max_chain: deltas after which a new keyframe is written (at most 1024).
        key: a secret (bytes or text) that turns on tamper evidence: every file and
            journal record is signed with HMAC-SHA256, and unsigned or wrongly signed
            ones count as damaged (docs/format.md, "Tamper evidence"). Default:
            ``$AFK_LOCAL_KEY`` when set, else no key (files are not signed).
        mirror: a remote to mirror every run this store writes to, as a URL
            (``s3://bucket/prefix``, ``gs://``, ``az://``, ``file:///abs/path``; needs the
            ``remote`` extra) or a :class:`~afk_local.storage.rundir.mirror.Mirror`. Each
            acknowledged checkpoint and journal record is uploaded in the background,
            in order; a writer's flush and close wait for it and raise its errors, and
            a run whose lease another store took refuses writes (docs/remote.md).
            Default: ``$AFK_LOCAL_MIRROR`` when set, else none; ``""`` means none.
        head_dir: where a keyed store keeps its runs' head records (rollback
            protection, docs/security.md); it must be outside the store. Default
            ``$AFK_LOCAL_HEAD_DIR``, else the user's state directory.
        pack_loose_limit: loose checkpoint files a writer lets accumulate before it
            folds the older ones into a pack (docs/format.md, "Packs"); None or 0:
            never (``Store.pack`` and ``afk-local pack`` still pack on request).
    """

    # Settings and write checks: store_settings.py; creating, opening and listing runs:
    # store_runs.py. Here: whole-run maintenance, each delegated to storage/maintenance.py.

    def delete(
        self,
        run_id: str,
        *,
        keep_effects: bool = False,
        check: Callable[[RunMeta], None] | None = None,
    ) -> Path | None:
        """Delete a run whole. Refuses (RunLockedError) while its owner is alive.

        With ``keep_effects``, the run's effect journal (and meta) is first kept under
        ``<root>/removed/`` (:mod:`.removal`); returns that directory (None otherwise).
        ``check`` is called with the run's meta under the run's lock, before anything
        changes: it raises to keep the run (a status that changed since it was listed).
        """
        from afk_local.storage import maintenance  # noqa: PLC0415 - loaded by what maintains

        return maintenance.delete(
            self, run_id, only_final=False, keep_effects=keep_effects, check=check
        )[1]

    def gc(self, policy: RetentionPolicy | None = None, *, dry_run: bool = False) -> GcReport:
        """Compact runs and delete old final runs per ``policy`` (:mod:`.retention`).

        Runs whose owner is alive are never touched; only final runs (completed,
        cancelled) lose effects or are deleted, decided under each run's lock; kill -9
        at any instant leaves every run resumable.
        """
        from afk_local.storage import maintenance  # noqa: PLC0415 - loaded by what maintains

        return maintenance.gc(self, policy, dry_run=dry_run)

    def pack(
        self,
        run_ids: list[str] | None = None,
        *,
        full: bool = True,
        merge: bool = True,
        keep_loose: int = 1,
        dry_run: bool = False,
    ) -> list[PackReport]:
        """Fold the loose checkpoint files of runs into pack files (docs/format.md, "Packs").

        Every checkpoint stays readable by seq, through every reader, and a crash at
        any instant loses nothing. A run whose owner is alive is skipped (its writer
        packs as it goes); a run that cannot be packed (in a keyed store: one behind
        its head record, rolled back) is reported, never raised.

        Args:
            run_ids: the runs (default: every run of the store).
            full: merge each run's packs into as few as the size bounds allow.
            merge: False: add a pack per run and leave its existing packs alone (a run
                written before manifests existed is merged once, to adopt it).
            keep_loose: the newest loose files of each run that stay loose (>= 1).
            dry_run: say what would happen, change nothing.
        """
        from afk_local.storage import maintenance  # noqa: PLC0415 - loaded by what maintains

        return maintenance.pack(
            self, run_ids, full=full, merge=merge, keep_loose=keep_loose, dry_run=dry_run
        )

    def fork(
        self,
        run_id: str,
        at_seq: int | None,
        new_run_id: str | None = None,
        *,
        updates: dict[str, Any] | None = None,
        salvage: bool = False,
    ) -> RunInfo:
        """A new run whose history is ``run_id``'s up to checkpoint ``at_seq`` (:mod:`.fork`).

        ``updates`` (``{"state.total": 5}``) edits the state the fork continues from.
        ``salvage=True`` forks a run whose effect journal is damaged: the fork keeps the
        journal's intact prefix (calls recorded after the damage become in doubt) and,
        with ``at_seq=None``, continues from the newest checkpoint taken before the
        damage (docs/cli.md, ``fork --salvage``).
        """
        from afk_local.storage import maintenance  # noqa: PLC0415 - loaded by what maintains

        return maintenance.fork(self, run_id, at_seq, new_run_id, updates=updates, salvage=salvage)

    def ensure_unlocked(self, run_id: str) -> None:
        """Raise RunLockedError when the run's owner is alive."""

        paths = self.paths(run_id)
        if lock_is_held(paths.lock):
            raise RunLockedError(run_id, str(paths.lock))


StoreLike = Store | str | os.PathLike[str] | None
"""What a ``store=`` argument takes: a :class:`Store`, its root directory, or None (the default)."""


def as_store(store: StoreLike) -> Store:
    """``store`` itself, or a :class:`Store` on the root directory it names."""
    return store if isinstance(store, Store) else Store(store)
