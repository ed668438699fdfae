"""The parts of a store's meta index, each a base of the next, under
:class:`~afk_local.storage.meta_index.MetaIndex` (the class the store hands out):

- :mod:`.scan`: ``runs/`` and each run's ``run.meta`` (a ``stat`` first, a read when it
  changed), and the mark a deletion leaves.
- :mod:`.index_file`: ``runs.index``: the summaries and the listing order it holds,
  loaded once and kept undecoded until needed, and saved.
- :mod:`.changes`: catching up from ``runs.changes``, the summaries the store's writers
  append, and starting it afresh when the index is saved.
- :mod:`.sweeps`: the full check of every run, and the steady one for a watcher that
  sweeps again and again (only what may have changed; the runs it may act on).
"""
