"""Adopting a copied or moved store: make the directory it is in now its home.

A store's identity (:mod:`afk_local.storage.store_identity`) records where it was
created; a copy or a move is refused by the trust gate until it is adopted, because
its runs' origins (:mod:`afk_local.runner.code.origin`) still name the old working
directory, ``sys.path`` and script. :func:`adopt_store` records the new path; when the
project moved too (``project_moved=True``: the scripts were copied or moved along with
the store) it first re-homes each run — every origin path inside the directory that
held the store moves with it, so a script job copied along with its store runs from
the copy. Otherwise (only the store moved) the recorded scripts are kept: they are still
where they were. ``afk-local adopt [--project-moved | --project-stayed]`` calls it.

Example:
    >>> report = adopt_store(Store("/tmp/b/.afk"), project_moved=True)  # doctest: +SKIP
    >>> report.moved_from
    '/tmp/a/.afk'
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import msgspec

from afk_local.errors import AfkLocalError
from afk_local.runner.code.origin import ORIGIN_KEY, origin_of
from afk_local.storage.store import Store
from afk_local.storage.store_identity import adopt_identity, home_of, read_identity

log = logging.getLogger("afk_local")


@dataclass
class AdoptReport:
    """What :func:`adopt_store` did."""

    root: str
    """The store's home now."""
    moved_from: str | None
    """The path it recorded before (None: it was already at home, or had no identity)."""
    rehomed: list[str] = field(default_factory=list)
    """Runs whose recorded origin now points into the new location."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Runs left as they were, with why (a process holds them, say)."""
    project_moved: bool = False
    """Whether the runs' recorded paths were re-homed along with the store."""


def _moved(path: str, old_base: str, new_base: str) -> str | None:
    """``path`` under ``new_base`` when it is under ``old_base``; else None."""
    if not os.path.isabs(path):
        return None
    try:
        if os.path.commonpath([path, old_base]) != old_base:
            return None
    except ValueError:
        return None
    return os.path.join(new_base, os.path.relpath(path, old_base))


def rehome_origin(origin: dict[str, Any], old_base: str, new_base: str) -> dict[str, Any]:
    """The origin record with every path under ``old_base`` moved under ``new_base``.

    The working directory, ``sys.path`` and the script move; the interpreter and its
    prefix move only when the moved one exists (a virtualenv copied along).
    """
    out = dict(origin)
    for name in ("cwd", "script"):
        value = out.get(name)
        if isinstance(value, str):
            out[name] = _moved(value, old_base, new_base) or value
    paths = out.get("sys_path")
    if isinstance(paths, list):
        out["sys_path"] = [
            (_moved(p, old_base, new_base) or p) if isinstance(p, str) else p for p in paths
        ]
    for name in ("python", "prefix"):
        value = out.get(name)
        moved = _moved(value, old_base, new_base) if isinstance(value, str) else None
        if moved is not None and os.path.exists(moved):
            out[name] = moved
    return out


def adopt_store(store: Store, *, project_moved: bool = False) -> AdoptReport:
    """Make ``store.root`` the home of a store that was copied or moved; returns what changed.

    With ``project_moved`` each run's origin is first re-homed under its lock (a run a
    process holds now is skipped and named in the report: adopt again once it
    stopped); without it the runs keep the working directories and scripts they
    recorded. Then the store's identity records the new path. Adopting a store already
    at home changes nothing.

    Raises:
        UntrustedStoreError: the store is keyed and this process has no key (or
            another key), or its identity file is damaged and this is not a keyed
            store's owner fixing it.
    """
    store.prepare_write()  # the key checks; a store without identity gets one here
    here = home_of(store.root)
    identity = read_identity(store.root, store.codec.signer)
    old = identity.path if identity is not None else None
    report = AdoptReport(
        root=here, moved_from=old if old != here else None, project_moved=project_moved
    )
    if report.moved_from is None:
        # adopted before with the project left behind, and now told it moved after all
        if identity is None or identity.adopted_from is None or identity.adopted_project:
            return report
        if not project_moved:
            return report
        old = report.moved_from = identity.adopted_from
    assert old is not None
    old_base, new_base = os.path.dirname(old), os.path.dirname(here)
    # never re-home everything under "/"
    if project_moved and old_base != os.path.dirname(old_base):
        for run_id in store.run_ids():
            try:
                _rehome_run(store, run_id, old_base, new_base, report)
            except (AfkLocalError, OSError) as exc:
                report.skipped[run_id] = str(exc)
                log.warning("adopt: run %s left as it was: %s", run_id, exc)
    adopt_identity(
        store.root, store.codec.signer, store.env, project_moved=project_moved, moved_from=old
    )
    return report


def _rehome_run(
    store: Store, run_id: str, old_base: str, new_base: str, report: AdoptReport
) -> None:
    meta = store.read_meta(run_id)
    if origin_of(meta) is None:
        return
    raw = meta.extra.get(ORIGIN_KEY)
    assert isinstance(raw, dict)
    moved = rehome_origin(raw, old_base, new_base)
    if moved == raw:
        return
    with store.resume_writer(run_id, lock_timeout=0.0, new_attempt=False) as run:
        extra = dict(run.meta.extra)
        extra[ORIGIN_KEY] = msgspec.to_builtins(moved)
        run.update_meta(extra=extra)
    report.rehomed.append(run_id)


__all__ = ["AdoptReport", "adopt_store", "rehome_origin"]
