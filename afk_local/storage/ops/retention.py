"""Retention and compaction: which checkpoints and effects a run keeps, and the gc that applies it.

The decisions are pure (:func:`plan_run`, :func:`plan_effects`, :func:`runs_to_delete`):
they take file names, frame headers and run facts, and say what to keep. The acting
part (:func:`compact_run`, :func:`gc`) runs while holding the run's ``owner.lock`` and
never touches a run whose lock another process holds.

Crash safety (kill -9 at any instant leaves every run resumable):

0. in a keyed store, ``run.meta`` first records the MAC of every checkpoint about
   to be deleted whose successor stays (the chain links of docs/format.md,
   "Tamper evidence"), so the survivors still verify;
1. every kept delta whose base would be deleted is first rewritten as a keyframe
   (decoded bytes unchanged, so its signature stays valid and is kept; temp +
   fsync + rename + directory fsync), so no kept file ever depends on a deleted one;
2. only then are files deleted, in rounds made durable one by one
   (:func:`deletion_rounds`): a delta before its base, a signed checkpoint before
   its predecessor, so no crash leaves a file whose base is gone; the highest seq
   and ``latest``'s target are never deleted (before any round, the metrics of the
   doomed checkpoints are copied into ``metrics.archive``, :mod:`.metrics`);
3. the effect journal is replaced atomically (temp + rename), never edited.

A store without a key does not compact runs whose files are signed: it could not
record the chain links, and the run would no longer verify under its key.

Example:
    >>> import afk_local as afk
    >>> from afk_local.storage.ops.retention import RetentionPolicy
    >>> report = afk.Store("/tmp/afk-doc-gc").gc(RetentionPolicy(keep_runtime_states=2))
    >>> report.errors
    []
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from afk_local.errors import AfkLocalError, CheckpointCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import chain_links, with_chain_links
from afk_local.storage.format.journal_format import read_journal, write_journal_file
from afk_local.storage.format.layout import (
    CheckpointFile,
    RunPaths,
    parse_checkpoint_name,
)
from afk_local.storage.format.pack import PackEntry
from afk_local.storage.format.records import Effect, Phase, RunStatus, now_ms
from afk_local.storage.ops.fork import JOURNAL_TRIMMED_KEY
from afk_local.storage.rundir.packing import live_view
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.chain import is_signed_file
from afk_local.storage.rundir.read.metrics import archive_metrics
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.rundir.rewrite import publish_manifest, remove_garbage, write_packs
from afk_local.storage.rundir.run_changes import tell_meta

log = logging.getLogger("afk_local")

STALE_BUILD_SECONDS = 3600.0
"""Age after which gc removes a half-built fork or import directory (``runs/.tmp-*``)."""
_HEAD = struct.Struct("<4sBBQ")  # the leading fields of the AFK1 header (codec.py)

DEFAULT_ALWAYS_KEEP = frozenset(
    {
        Phase.RUN_STARTED.value,
        Phase.PAUSED.value,
        Phase.RESUMED.value,
        Phase.RUN_TERMINAL.value,
        # LangGraph threads (integrations/langgraph/): their history, subgraph
        # namespaces and fork points are the user's data; they shrink through prune().
        "langgraph",
    }
)


@dataclass(frozen=True)
class RetentionPolicy:
    """What a compaction keeps (docs/cli.md, gc).

    Args:
        keep_runtime_states: newest ``runtime_state`` checkpoints kept per run (at least
            one is always kept: resume starts from it).
        always_keep_phases: phases whose checkpoints are never compacted away.
        keep_latest_step: keep every checkpoint from the last ``step_started`` on (the
            step in flight).
        max_effects_per_run: for final runs (``completed``, ``cancelled``), keep the
            journal records of at most this many effect keys (the newest). Every other run
            keeps every effect: a resume may replay any of them, and a ``failed`` run is
            resumed by its retry.
        max_runs: keep at most this many runs; the oldest final runs are deleted whole.
        max_age_days: delete final runs not updated for this many days.
        max_bytes: delete the oldest final runs while the store is larger than this.

    Only final runs ever lose effects or are deleted: a ``failed`` run counts towards
    the limits like a live, paused or interrupted one, but stays whole until a person
    removes it (``afk-local rm``) or a retry completes it.
    """

    keep_runtime_states: int = 3
    always_keep_phases: frozenset[str] = DEFAULT_ALWAYS_KEEP
    keep_latest_step: bool = True
    max_effects_per_run: int | None = None
    max_runs: int | None = None
    max_age_days: float | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.keep_runtime_states < 0:
            raise ValueError("keep_runtime_states must be >= 0")
        for name in ("max_effects_per_run", "max_runs", "max_age_days", "max_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 (or None for no limit)")
        object.__setattr__(
            self, "always_keep_phases", frozenset(str(p) for p in self.always_keep_phases)
        )


@dataclass(frozen=True)
class FileFacts:
    """One checkpoint file as compaction sees it: name, delta base (0 = keyframe), size."""

    seq: int
    phase: str
    name: str
    base_seq: int = 0
    size: int = 0
    pack: str | None = None
    """The pack holding it (None: a loose file)."""


@dataclass(frozen=True)
class RunPlan:
    """What compacting one run does: files kept, deltas rewritten as keyframes, files deleted."""

    run_id: str
    keep: tuple[FileFacts, ...]
    rewrite: tuple[FileFacts, ...]
    delete: tuple[FileFacts, ...]

    @property
    def bytes_freed(self) -> int:
        """Sizes of the deleted files (rewrites grow a little; not counted)."""
        return sum(f.size for f in self.delete)


@dataclass
class RunCompaction:
    """What :func:`compact_run` did (or, in a dry run, would do) to one run."""

    run_id: str
    deleted_files: int = 0
    rewritten_files: int = 0
    bytes_freed: int = 0
    effects_dropped: int = 0


@dataclass
class GcReport:
    """The result of :func:`gc`; nothing in it is raised."""

    dry_run: bool = False
    compacted: list[RunCompaction] = field(default_factory=list)
    deleted_runs: list[str] = field(default_factory=list)
    skipped_locked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    removed_temp_dirs: int = 0

    @property
    def bytes_freed(self) -> int:
        """Bytes freed by compaction (whole-run deletions not included)."""
        return sum(c.bytes_freed for c in self.compacted)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "dry_run": self.dry_run,
            "compacted": [vars(c) for c in self.compacted],
            "deleted_runs": list(self.deleted_runs),
            "skipped_locked": list(self.skipped_locked),
            "errors": list(self.errors),
            "removed_temp_dirs": self.removed_temp_dirs,
            "bytes_freed": self.bytes_freed,
        }


# -- pure decisions -------------------------------------------------------------------


def plan_run(
    run_id: str,
    files: Sequence[FileFacts],
    policy: RetentionPolicy,
    *,
    latest_name: str | None = None,
) -> RunPlan:
    """Decide which checkpoint files of one run to keep, rewrite and delete.

    Kept: the highest seq, ``latest``'s target, the newest ``keep_runtime_states``
    (at least one) ``runtime_state`` files, every file of ``always_keep_phases``, and
    with ``keep_latest_step`` everything from the last ``step_started`` on. A kept
    delta whose base is not kept is rewritten as a keyframe, so every delta that
    stays has its whole chain among the kept files.
    """
    ordered = sorted(files, key=lambda f: f.seq)
    if not ordered:
        return RunPlan(run_id, (), (), ())
    keep: set[int] = {ordered[-1].seq}
    for f in ordered:
        if f.phase in policy.always_keep_phases or f.name == latest_name:
            keep.add(f.seq)
    states = [f for f in ordered if f.phase == Phase.RUNTIME_STATE.value]
    keep.update(f.seq for f in states[-max(1, policy.keep_runtime_states) :])
    if policy.keep_latest_step:
        starts = [f.seq for f in ordered if f.phase == Phase.STEP_STARTED.value]
        if starts:
            keep.update(f.seq for f in ordered if f.seq >= starts[-1])
    by_seq = {f.seq: f for f in ordered}
    rewrite = []
    for f in ordered:
        if f.seq in keep and f.base_seq and f.base_seq not in keep:
            rewrite.append(f)
        elif f.seq in keep and f.base_seq and f.base_seq not in by_seq:
            rewrite.append(f)  # pragma: no cover - a missing base makes the run skipped earlier
    delete = [f for f in ordered if f.seq not in keep]
    kept = [f for f in ordered if f.seq in keep]
    return RunPlan(run_id, tuple(kept), tuple(rewrite), tuple(delete))


def plan_effects(records: Sequence[Effect], max_effects: int | None) -> list[Effect]:
    """The journal records a final run keeps: those of the newest ``max_effects`` keys."""
    if max_effects is None:
        return list(records)
    last_seen: dict[str, int] = {}
    for index, record in enumerate(records):
        last_seen[record.key] = index
    newest = sorted(last_seen, key=last_seen.__getitem__)[-max_effects:] if max_effects else []
    wanted = set(newest)
    return [r for r in records if r.key in wanted]


class ListedRun(Protocol):
    """What gc's run-level policy reads of a listed run (``views.run_info.RunInfo`` has it).

    Declared here so that gc, an operation, does not import the listing view above it.
    """

    @property
    def run_id(self) -> str: ...
    @property
    def status(self) -> RunStatus: ...
    @property
    def updated_ms(self) -> int: ...
    @property
    def owner_alive(self) -> bool: ...
    @property
    def bytes(self) -> int: ...


def runs_to_delete(
    infos: Iterable[ListedRun], policy: RetentionPolicy, *, now_ms: int
) -> list[str]:
    """Final runs past ``max_age_days``, then the oldest over ``max_runs`` / ``max_bytes``.

    Only final runs (``completed``, ``cancelled``) are ever chosen; live, paused,
    interrupted and failed runs count towards the limits but are never deleted: each
    of them may still be resumed, and a deleted run's retry would start over and
    repeat every side effect.
    """
    infos = sorted(infos, key=lambda i: i.updated_ms)  # oldest first
    doomed: list[str] = []
    if policy.max_age_days is not None:
        cutoff = now_ms - int(policy.max_age_days * 86_400_000)
        doomed += [
            i.run_id
            for i in infos
            if i.status.is_final and not i.owner_alive and i.updated_ms < cutoff
        ]
    count = len(infos) - len(doomed)
    total = sum(i.bytes for i in infos if i.run_id not in doomed)
    for info in infos:
        over_count = policy.max_runs is not None and count > policy.max_runs
        over_bytes = policy.max_bytes is not None and total > policy.max_bytes
        if not (over_count or over_bytes):
            break
        if info.status.is_final and info.run_id not in doomed and not info.owner_alive:
            doomed.append(info.run_id)
            count -= 1
            total -= info.bytes
    return doomed


# -- acting ---------------------------------------------------------------------------


def read_file_facts(
    run_dir: str | os.PathLike[str],
    files: Sequence[CheckpointFile],
    catalog: RunCatalog | None = None,
) -> list[FileFacts]:
    """Sizes and delta bases of ``files``, from their headers only.

    Packed files are read through ``catalog`` (required when there are any).

    Raises:
        CheckpointCorruptionError: a header is unreadable (the run should be verified).
    """
    facts = []
    for f in files:
        path = os.path.join(run_dir, f.name)
        try:
            if f.pack is not None:
                if catalog is None:
                    raise ValueError("packed checkpoints need the run's catalog")
                image = catalog.packed_image(f)
                head, size, path = image[: codec.HEADER_SIZE], len(image), catalog.location(f)
            else:
                with open(path, "rb", buffering=0) as fh:
                    head = fh.read(codec.HEADER_SIZE)
                    size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise CheckpointCorruptionError(path, f"cannot read: {exc.strerror}") from None
        if len(head) < _HEAD.size:
            raise CheckpointCorruptionError(path, f"{len(head)} bytes, shorter than the header")
        magic, kind, flags, base_seq = _HEAD.unpack_from(head)
        if magic != codec.MAGIC or kind != codec.KIND_CHECKPOINT:
            raise CheckpointCorruptionError(path, "bad header")
        base = base_seq if flags & codec.FLAG_DELTA else 0
        facts.append(FileFacts(f.seq, f.phase, f.name, base, size, f.pack))
    return facts


def compact_run(
    reader: RunReader, policy: RetentionPolicy, *, dry_run: bool = False
) -> RunCompaction:
    """Apply ``policy`` to one run. The caller must hold the run's lock.

    Raises:
        CheckpointCorruptionError: a file could not be read; nothing was deleted.
    """
    paths = reader.paths
    facts = read_file_facts(paths.dir, reader.checkpoint_files(), reader.catalog)
    if reader.catalog.manifest_problem is not None:
        raise reader.catalog.manifest_problem  # never plan a rewrite on a guess
    target = fsio.read_link(paths.latest)
    latest = parse_checkpoint_name(target) if target else None
    plan = plan_run(paths.run_id, facts, policy, latest_name=latest.name if latest else None)
    result = RunCompaction(
        paths.run_id,
        deleted_files=len(plan.delete),
        rewritten_files=len(plan.rewrite),
        bytes_freed=plan.bytes_freed,
    )
    status = reader.meta.status
    effects_keep: list[Effect] | None = None
    if policy.max_effects_per_run is not None and status.is_final:
        records = _journal_records(reader)
        if records is not None:
            kept = plan_effects(records, policy.max_effects_per_run)
            if len(kept) < len(records):
                effects_keep = kept
                result.effects_dropped = len(records) - len(kept)
    if (plan.delete or effects_keep is not None) and _signed_without_key(reader):
        raise AfkLocalError(
            f"run {paths.run_id!r}: not compacted: its files are signed and this store has no "
            "key, so it cannot re-sign what compaction changes; run gc with AFK_LOCAL_KEY set"
        )
    if dry_run:
        return result
    # 0. the files a resume starts from must decode before anything older goes away.
    for f in plan.keep:
        if f.phase == Phase.RUNTIME_STATE.value or f.seq == plan.keep[-1].seq:
            reader.load(CheckpointFile(f.seq, f.phase, f.name, pack=f.pack))
    # 0b. keyed: record the chain links of the survivors before their predecessors go.
    extra = chain_links_after_delete(
        reader,
        {f.seq for f in plan.delete},
        [CheckpointFile(f.seq, f.phase, f.name, pack=f.pack) for f in plan.keep],
    )
    if extra is not None:
        # updated_ms stays: compaction does not make a run younger (gc's age order)
        meta = msgspec.structs.replace(reader.meta, extra=extra)
        reader.env.atomic_write(paths.meta, codec.encode_meta(reader.record_codec, meta))
        tell_meta(paths, meta, reader.record_codec.signer, reader.env)
        reader.refresh()
    # 0c. the metrics the doomed checkpoints carry go to the run's metrics.archive (durably).
    archive_metrics(
        reader,
        [CheckpointFile(f.seq, f.phase, f.name, pack=f.pack) for f in plan.delete],
        reader.env,
    )
    # 1-2. rewrite what would lose its base, then delete, in crash-safe order.
    remove_checkpoints(reader, plan)
    # 3. replace the journal atomically, once run.meta says it is trimmed: the positions
    #    its checkpoints recorded no longer hold, so a fork must refuse it (storage/fork.py).
    if effects_keep is not None:
        _mark_journal_trimmed(reader, result.effects_dropped)
        _rewrite_journal(reader, effects_keep)
    return result


def remove_checkpoints(reader: RunReader, plan: RunPlan) -> None:
    """Delete ``plan.delete`` after rewriting ``plan.rewrite``, crash-safely (steps 1-2 above).

    1. every kept loose delta whose base goes is rewritten as a loose keyframe with the
       same decoded bytes (temp + rename over it: either copy decodes the same);
    2. every live pack holding a doomed checkpoint or one to rewrite (every pack, in a
       run without a manifest) is replaced by new packs of its kept entries, the
       rewritten ones as keyframes, and the run's ``MANIFEST`` naming them is published
       (:mod:`~afk_local.storage.rundir.rewrite`): the instant the packed part changes;
    3. everything the manifest no longer names is deleted.

    The doomed live loose files are deleted between steps 1 and 2, in durable rounds
    (:func:`deletion_rounds`): after the publish, a loose file the kill left behind
    would be live again by the manifest's rule, with its base gone.

    No copy is ever both kept and deleted, and no pack is deleted before the manifest
    that stops naming it is durable, so a kill at any point, then any rewrite, loses
    nothing. The caller holds the run's lock and, in a keyed store, has recorded the
    chain links first (:func:`chain_links_after_delete`) and narrowed the run's head
    record durably (``HeadStore.loosen``, or its writer's ``loosen_head``): the head
    names the newest checkpoint, and one left naming a deleted checkpoint by a crash is
    reported as a rollback.
    """
    paths, env = reader.paths, reader.env
    view = live_view(reader.catalog)
    for f in plan.rewrite:
        if f.pack is None and f.seq >= view.loose_from:
            rewrite_as_keyframe(reader, CheckpointFile(f.seq, f.phase, f.name))
    # The doomed loose files go before the manifest changes: a loose file at or above
    # loose_from is live by the manifest's own rule, so one left behind by a kill after
    # the publish would come back to life with its base (a doomed packed checkpoint)
    # gone. Deleting them first is safe: a kept loose delta on one of them was just
    # rewritten as a keyframe, and no packed checkpoint has a loose base.
    loose = [f for f in plan.delete if f.pack is None and f.seq >= view.loose_from]
    for batch in deletion_rounds(loose, keyed=reader.record_codec.signer is not None):
        for f in batch:
            env.unlink(paths.dir / f.name)
        env.fsync_dir(paths.dir)
    touched = {f.seq for f in (*plan.delete, *plan.rewrite) if f.pack is not None}
    if view.legacy:
        touched |= {f.seq for f in (*plan.delete, *plan.rewrite) if f.seq < view.loose_from}
    replace = [p for p in view.packs if view.legacy or any(p.first <= s <= p.last for s in touched)]
    manifest = view.manifest
    if replace:
        names = {p.name for p in replace}
        rewritten = {f.seq for f in plan.rewrite}
        entries = []
        for f in plan.keep:
            file = CheckpointFile(f.seq, f.phase, f.name, pack=f.pack)
            if not (f.pack in names or (view.legacy and f.seq < view.loose_from)):
                continue
            image = (
                keyframe_image(reader, file) if f.seq in rewritten else reader.stored_bytes(file)
            )
            entries.append(PackEntry(f.seq, f.phase, image))
        signer = reader.record_codec.signer
        written = write_packs(paths, entries, signer, env)
        kept = [p.name for p in view.packs if p.name not in names]
        manifest = publish_manifest(
            paths, view.manifest, kept + written, view.loose_from, signer=signer, env=env
        )
    if manifest is not None:
        remove_garbage(paths, manifest, env, just_published=bool(replace), sync=True)
    reader.catalog.scan()


def deletion_rounds(doomed: Sequence[FileFacts], *, keyed: bool) -> list[list[FileFacts]]:
    """The order compaction deletes ``doomed`` in: rounds, each made durable before the next.

    Unlinks that no directory fsync separates may reach the disk in any order
    (POSIX promises nothing else), so deleting a delta and its base in one round
    could leave the delta without its base after a crash: a damaged file to
    ``verify``. A file therefore goes in a later round than every doomed file that
    depends on it: the deltas based on it and, in a keyed store, the checkpoint
    right after it (whose signature chains on its MAC). Within a round, highest seq
    first. As many rounds as the longest such chain among the doomed files.
    """
    seqs = {f.seq for f in doomed}
    dependents: dict[int, list[int]] = {}
    for f in doomed:
        if f.base_seq in seqs:
            dependents.setdefault(f.base_seq, []).append(f.seq)
        if keyed and f.seq - 1 in seqs:
            dependents.setdefault(f.seq - 1, []).append(f.seq)
    after: dict[int, int] = {}  # seq -> its round; dependents have higher seqs, so go first
    for f in sorted(doomed, key=lambda f: f.seq, reverse=True):
        after[f.seq] = max((after[d] + 1 for d in dependents.get(f.seq, ())), default=0)
    rounds: list[list[FileFacts]] = [[] for _ in range(max(after.values(), default=-1) + 1)]
    for f in sorted(doomed, key=lambda f: f.seq, reverse=True):
        rounds[after[f.seq]].append(f)
    return rounds


def _mark_journal_trimmed(reader: RunReader, dropped: int) -> None:
    extra = dict(reader.meta.extra) if isinstance(reader.meta.extra, dict) else {}
    extra[JOURNAL_TRIMMED_KEY] = int(extra.get(JOURNAL_TRIMMED_KEY) or 0) + dropped
    meta = msgspec.structs.replace(reader.meta, extra=extra)
    reader.env.atomic_write(reader.paths.meta, codec.encode_meta(reader.record_codec, meta))
    tell_meta(reader.paths, meta, reader.record_codec.signer, reader.env)
    reader.refresh()


def keyframe_image(reader: RunReader, file: CheckpointFile) -> bytes:
    """The bytes of a keyframe with ``file``'s decoded bytes and signature.

    Its signature covers the decoded bytes, so a signed file keeps its MAC unchanged.
    """
    reader.load(file)  # checks the record decodes, belongs here and (keyed) is signed
    raw, mac = reader.record_bytes(file)  # exact bytes: kept deltas use them
    return codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw), mac=mac)


def rewrite_as_keyframe(reader: RunReader, file: CheckpointFile) -> None:
    """Replace a loose checkpoint file by a keyframe of the same decoded bytes (temp + rename)."""
    reader.env.atomic_write(reader.paths.dir / file.name, keyframe_image(reader, file))


def chain_links_after_delete(
    reader: RunReader, doomed: set[int], kept: Sequence[CheckpointFile]
) -> dict[str, Any] | None:
    """The ``RunMeta.extra`` a keyed run needs once checkpoints ``doomed`` are deleted.

    Each kept checkpoint whose predecessor is doomed gets that predecessor's MAC
    as its chain link (checked: the survivor must verify with it); links of doomed
    checkpoints stay until a later compaction finds them gone. None when nothing
    changes or the store has no key.
    Write it to ``run.meta`` before deleting anything.

    Raises:
        CheckpointCorruptionError: a survivor does not verify.
    """
    if reader.record_codec.signer is None or not doomed:
        return None
    extra = reader.meta.extra if isinstance(reader.meta.extra, dict) else {}
    old = chain_links(extra)
    # The doomed keep their links until they are gone: a crash before the rewrite that
    # drops them is published leaves them live, and they must still verify. Links of
    # checkpoints an earlier, finished compaction removed are pruned now.
    present = doomed | {f.seq for f in kept}
    links = {seq: mac for seq, mac in old.items() if seq in present}
    for file in kept:
        if file.seq - 1 in doomed:
            links[file.seq] = reader.chain_value(file)
    if links == old:
        return None
    return with_chain_links(extra, links)


def _signed_without_key(reader: RunReader) -> bool:
    return reader.record_codec.signer is None and is_signed_file(reader.paths.meta)


def _journal_records(reader: RunReader) -> list[Effect] | None:
    if not reader.paths.journal.is_file():
        return None
    return read_journal(reader.paths.journal, reader.run_id, reader.record_codec).records


def _rewrite_journal(reader: RunReader, records: Sequence[Effect]) -> None:
    path, env = reader.paths.journal, reader.env
    tmp = fsio.temp_path(path.parent, path.name)
    try:
        write_journal_file(tmp, records, reader.record_codec, run_id=reader.run_id, env=env)
        env.rename(tmp, path)
    except BaseException:
        env.unlink(tmp)
        raise
    env.fsync_dir(path.parent)


def remove_stale_builds(runs_dir: Path) -> int:
    """Remove temp directories a crash left in ``runs/``.

    ``.tmp-deleted-*`` (a delete cut short) go at once; half-built forks and imports
    only after :data:`STALE_BUILD_SECONDS`, since one may be being built right now.
    """
    removed = 0
    old = now_ms() / 1000 - STALE_BUILD_SECONDS  # compared with st_mtime: wall seconds
    try:
        with os.scandir(runs_dir) as entries:
            stale = [
                e.path
                for e in entries
                if e.name.startswith(fsio.TEMP_PREFIX)
                and e.is_dir(follow_symlinks=False)
                and (
                    e.name.startswith(fsio.TEMP_PREFIX + "deleted-")
                    or e.stat(follow_symlinks=False).st_mtime < old
                )
            ]
    except FileNotFoundError:
        return 0
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def runtime_state_count(run_dir: str | os.PathLike[str]) -> int:
    """How many ``runtime_state`` checkpoints a run holds, loose or packed (checks, tests)."""
    paths = RunPaths(os.path.basename(os.path.normpath(run_dir)), Path(run_dir))
    return sum(1 for f in RunCatalog(paths).files() if f.phase == Phase.RUNTIME_STATE.value)


__all__ = [
    "DEFAULT_ALWAYS_KEEP",
    "FileFacts",
    "GcReport",
    "RetentionPolicy",
    "RunCompaction",
    "RunPlan",
    "compact_run",
    "deletion_rounds",
    "plan_effects",
    "plan_run",
    "remove_checkpoints",
    "remove_stale_builds",
    "runs_to_delete",
]
