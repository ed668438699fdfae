"""The storage engine: what a run directory holds and how it gets there durably.

In layers of its own, lowest first (import-linter keeps them; docs/architecture.md):

- ``fsio``: the one I/O seam every write-side system call goes through;
- ``format/``: bytes and names, no policy (records, values, codec, packs, the
  journal's frames, layout, migrations);
- ``rundir/``: one run directory while it is used (catalog, chain, reader, writer,
  ownership, heads, packing, verify, metrics, the mirror and journal seams);
- ``ops/``: whole-run rewrites and copies under the run lock (gc, fork, removal,
  state edits, export/import);
- ``views/``: what listings and notebooks show (run info, filters, progress);
- ``store`` (with ``store_key``) and ``trust`` on top.

Storage imports nothing above itself: the effect journal a run's writer hands out is
opened through ``rundir.effects``, which ``afk_local/__init__.py`` wires.
"""
