"""Bytes and names, no policy: records, typed values, the checkpoint codec, packs,
the journal's frames, run-directory names and schema migrations.

Every module here is pure with respect to a run: it turns records into bytes and
back, or names files, and takes no lock. Above it only :mod:`afk_local.storage.fsio`.
"""
