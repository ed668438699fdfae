"""The effect journal: every side-effecting call recorded as intent, then outcome.

:mod:`afk_local.journal.journal` holds the :class:`~afk_local.Journal` (index,
group commit, lookup, ``call`` with the replay and in-doubt policies);
:mod:`afk_local.journal.replay` says what a journaled call is (input hashes,
idempotency keys, replayed errors). The byte format of ``effects.log`` lives in
:mod:`afk_local.storage.format.journal_format`, below both this package and the storage
modules that read the log (verify, gc, fork, export).
"""
