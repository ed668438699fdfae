"""What a crash may leave on disk: POSIX plus the ext4 ``data=ordered`` rules we rely on.

:class:`DiskModel` replays a recorded trace onto inodes and directories. Each
file has its current bytes and the bytes its last fsync made durable; each
directory has its current entries, the entries its last fsync made durable and
the entry changes made since (creates, renames, links, symlinks, unlinks,
mkdirs). After any call a crash may leave (:class:`Frontier`):

- for every file: its durable bytes, its current bytes, or its current bytes cut
  at any page boundary past the durable ones (never garbage, never a hole: ext4
  ``data=ordered`` writes data before the size that exposes it);
- for every directory: its durable entries plus any subset of the changes made
  since its last fsync, applied in the order they were made. A subset may leave
  out an early change and keep a later one: unsynced directory operations may
  persist out of order. A rename within one directory is one change (both names
  or neither), and so is an exchange of two names in one directory
  (``renameat2(RENAME_EXCHANGE)``); a removal only takes effect if the name still
  points at the removed inode.

Only an fsync of a file makes its data durable and only an fsync of a directory
makes its entries durable: an fsync of a file does not persist its name (POSIX
does not promise it, whatever ext4 happens to do).

An fsync that failed (``fsync-failed``, recorded by a workload that makes the disk
fail one, see :mod:`.suites.faults`) made nothing durable for sure, but the disk may
have written any part of what it covered before it failed: from then on, until the
next fsync of the file succeeds, a crash may leave the file's durable bytes, or any
of the states it could have left at that failed fsync.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cached_property

from afk_local.testing.crashsim.disk import DIR, FILE, SYMLINK, Node, Tree
from afk_local.testing.crashsim.trace import Op, RecordingError

PAGE_SIZE = 4096
"""Unsynced file data survives a crash in whole pages (a prefix cut at a multiple of this)."""

FSYNC_KINDS = ("file", "dir", "journal")
"""What an fsync made durable: a file's data, a directory's entries, or an appended log's data."""


@dataclass(frozen=True)
class DirChange:
    """One directory operation since its directory's last fsync: names set or removed."""

    op: Op
    changes: tuple[tuple[str, int, bool], ...]
    """(name, inode, present): present sets ``name`` to the inode, else removes it if it
    still points there."""


@dataclass
class _Inode:
    kind: str
    data: bytes = b""
    synced: bytes = b""
    target: str = ""
    append: bool = False
    unsure: tuple[bytes, ...] = ()
    """Durable bytes a failed fsync may have left besides ``synced`` (until one succeeds)."""
    entries: dict[str, int] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)
    pending: list[DirChange] = field(default_factory=list)


def content_candidates(synced: bytes, current: bytes) -> tuple[bytes, ...]:
    """What a crash may leave of a file: durable bytes first, current bytes last."""
    if synced == current:
        return (current,)
    common = 0
    limit = min(len(synced), len(current))
    while common < limit and synced[common] == current[common]:
        common += 1
    cuts = range((common // PAGE_SIZE + 1) * PAGE_SIZE, len(current), PAGE_SIZE)
    found = [synced, *(current[:cut] for cut in cuts), current]
    unique: list[bytes] = []
    for data in found:
        if data not in unique:
            unique.append(data)
    return tuple(unique)


class DiskModel:
    """The state of a directory tree under a recorded trace, durable part and volatile part.

    Args:
        initial: the tree when the recording started, all of it durable.
        ignored_fsyncs: kinds of fsync (``file``, ``dir``, ``journal``) to treat as
            never made: the mutants of the explorer.
        ignored_sites: ``(site, kind)`` pairs: the fsyncs of that kind asked for by that
            call site (:attr:`Op.site`) are treated as never made (the site mutants).
    """

    def __init__(
        self,
        initial: Tree,
        *,
        ignored_fsyncs: frozenset[str] = frozenset(),
        ignored_sites: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        unknown = set(ignored_fsyncs) - set(FSYNC_KINDS)
        unknown |= {kind for _, kind in ignored_sites} - set(FSYNC_KINDS)
        if unknown:
            raise ValueError(f"unknown fsync kinds {sorted(unknown)}")
        self._ignored_sites = ignored_sites
        self.fsyncs: list[tuple[Op, str]] = []
        """Every fsync replayed, with its kind (``file``, ``dir``, ``journal``)."""
        self._inodes: dict[int, _Inode] = {}
        self._ignored = ignored_fsyncs
        self.ignored: list[Op] = []
        """The fsyncs this model treated as never made (``ignored_fsyncs``)."""
        self.root = self._new(DIR)
        by_tree_inode: dict[int, int] = {}
        for path in sorted(initial):
            node = initial[path]
            parent, name = self._parent(path)
            if node.kind == FILE and node.inode in by_tree_inode:
                ino = by_tree_inode[node.inode]
            elif node.kind == FILE:
                ino = by_tree_inode[node.inode] = self._new(FILE)
                self._inodes[ino].data = self._inodes[ino].synced = node.data
            else:
                ino = self._new(node.kind)
                self._inodes[ino].target = node.target
            self._inodes[parent].entries[name] = ino
            self._inodes[parent].durable[name] = ino

    def _new(self, kind: str) -> int:
        ino = len(self._inodes) + 1
        self._inodes[ino] = _Inode(kind)
        return ino

    def _lookup(self, path: str) -> int | None:
        ino = self.root
        if path == ".":
            return ino
        for part in path.split("/"):
            node = self._inodes[ino]
            if node.kind != DIR or part not in node.entries:
                return None
            ino = node.entries[part]
        return ino

    def _parent(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        parent = self._lookup(head or ".")
        if parent is None or self._inodes[parent].kind != DIR:
            raise RecordingError(f"{path}: its directory is not in the model")
        return parent, name

    def _existing(self, path: str, op: Op) -> int:
        ino = self._lookup(path)
        if ino is None:
            raise RecordingError(f"{op.describe()}: {path} is not in the model")
        return ino

    def _change(self, directory: int, op: Op, *changes: tuple[str, int, bool]) -> None:
        node = self._inodes[directory]
        for name, ino, present in changes:
            if present:
                node.entries[name] = ino
            elif node.entries.get(name) == ino:
                del node.entries[name]
        node.pending.append(DirChange(op, changes))

    def apply(self, op: Op) -> None:
        """Replay one recorded call."""
        kind = op.operation
        if kind == "open":
            parent, name = self._parent(op.path)
            ino = self._inodes[parent].entries.get(name)
            if ino is None:
                ino = self._new(FILE)
                self._change(parent, op, (name, ino, True))
            self._inodes[ino].append |= op.append
        elif kind in ("write", "truncate"):
            node = self._inodes[self._existing(op.path, op)]
            data = node.data
            if kind == "truncate":
                node.data = data[: op.offset].ljust(op.offset, b"\0")
            else:
                head = data[: op.offset].ljust(op.offset, b"\0")
                node.data = head + op.data + data[op.offset + len(op.data) :]
        elif kind == "fsync":
            self._fsync(op)
        elif kind == "fsync-failed":
            node = self._inodes[self._existing(op.path, op)]
            if node.kind != DIR:
                partial = content_candidates(node.synced, node.data)[1:]
                node.unsure = tuple(dict.fromkeys((*node.unsure, *partial)))
        elif kind in ("rename", "link"):
            src_dir, src_name = self._parent(op.source)
            ino = self._existing(op.source, op)
            dst_dir, dst_name = self._parent(op.path)
            if kind == "link":
                self._change(dst_dir, op, (dst_name, ino, True))
            elif src_dir == dst_dir:
                self._change(dst_dir, op, (src_name, ino, False), (dst_name, ino, True))
            else:
                self._change(src_dir, op, (src_name, ino, False))
                self._change(dst_dir, op, (dst_name, ino, True))
        elif kind == "exchange":
            a_dir, a_name = self._parent(op.source)
            a, b = self._existing(op.source, op), self._existing(op.path, op)
            b_dir, b_name = self._parent(op.path)
            if a_dir == b_dir:  # one change: both names swapped, or neither
                self._change(a_dir, op, (a_name, b, True), (b_name, a, True))
            else:
                self._change(a_dir, op, (a_name, b, True))
                self._change(b_dir, op, (b_name, a, True))
        elif kind in ("symlink", "mkdir"):
            parent, name = self._parent(op.path)
            ino = self._new(SYMLINK if kind == "symlink" else DIR)
            self._inodes[ino].target = op.source
            self._change(parent, op, (name, ino, True))
        elif kind == "unlink":
            parent, name = self._parent(op.path)
            self._change(parent, op, (name, self._existing(op.path, op), False))
        else:
            raise RecordingError(f"{op.describe()}: unknown operation")

    def _fsync(self, op: Op) -> None:
        ino = self._existing(op.path, op)
        node = self._inodes[ino]
        kind = "dir" if node.kind == DIR else "journal" if node.append else "file"
        self.fsyncs.append((op, kind))
        if kind in self._ignored or (op.site, kind) in self._ignored_sites:
            self.ignored.append(op)
        elif node.kind == DIR:
            node.durable = dict(node.entries)
            node.pending = []
        else:
            node.synced = node.data
            node.unsure = ()

    def tree(self) -> Tree:
        """The tree as the running process sees it (everything, durable or not)."""
        return self.frontier(0).tree(Choice({}, {}), current=True)

    def frontier(self, at: int, op: Op | None = None) -> Frontier:
        """What a crash right now may leave (``at``: calls replayed so far)."""
        entries, pending, contents, targets, kinds, current = {}, {}, {}, {}, {}, {}
        for ino, node in self._inodes.items():
            kinds[ino] = node.kind
            if node.kind == DIR:
                entries[ino] = node.durable  # replaced, never mutated, on fsync
                current[ino] = dict(node.entries)
                if node.pending:
                    pending[ino] = tuple(node.pending)
            elif node.kind == SYMLINK:
                targets[ino] = node.target
            else:
                contents[ino] = _file_candidates(node)
        return Frontier(at, op, self.root, kinds, entries, current, pending, contents, targets)


def _file_candidates(node: _Inode) -> tuple[bytes, ...]:
    """What a crash may leave of a file: :func:`content_candidates`, and after a failed
    fsync those of each state it may have left (durable bytes first, current last)."""
    found = content_candidates(node.synced, node.data)
    if not node.unsure:
        return found
    synced, current = node.synced, node.data
    more = [c for unsure in node.unsure for c in content_candidates(unsure, current)]
    between = dict.fromkeys(c for c in (*found, *more) if c not in (synced, current))
    return (synced, *between, current)  # index 0 stays the durable bytes, even if current


@dataclass(frozen=True)
class Choice:
    """One crash state of a frontier: which pending changes persisted, what file data did."""

    kept: dict[int, int]
    """directory inode -> bit mask of its pending changes that persisted."""
    content: dict[int, int]
    """file inode -> index into its content candidates."""


@dataclass(frozen=True)
class Frontier:
    """Everything a crash after call ``at`` may leave, and how to pick one state of it."""

    at: int
    op: Op | None
    root: int
    kinds: dict[int, str]
    durable: dict[int, dict[str, int]]
    current: dict[int, dict[str, int]]
    pending: dict[int, tuple[DirChange, ...]]
    contents: dict[int, tuple[bytes, ...]]
    targets: dict[int, str]

    @cached_property
    def dimensions(self) -> list[tuple[str, int, int]]:
        """(``dir``/``file``, inode, number of options) for every open choice, in a fixed order."""
        dims = [("dir", ino, 1 << len(changes)) for ino, changes in sorted(self.pending.items())]
        dims += [
            ("file", ino, len(options))
            for ino, options in sorted(self.contents.items())
            if len(options) > 1
        ]
        return dims

    @cached_property
    def combinations(self) -> int:
        """How many crash states this frontier allows (before identical trees are merged)."""
        total = 1
        for _, _, options in self.dimensions:
            total *= options
        return total

    def choice(self, index: int) -> Choice:
        """The ``index``-th state: 0 loses all that is unsynced, ``combinations - 1`` keeps all."""
        kept: dict[int, int] = {}
        content: dict[int, int] = {}
        for kind, ino, options in self.dimensions:
            index, digit = divmod(index, options)
            (kept if kind == "dir" else content)[ino] = digit
        return Choice(kept, content)

    def random_choice(self, rng: random.Random) -> Choice:
        """A state drawn uniformly."""
        return self.choice(rng.randrange(self.combinations))

    def variants(self) -> list[Choice]:
        """States that lose (or keep) one thing at a time: one change, or one file's data."""
        dims = self.dimensions
        full = {ino: options - 1 for kind, ino, options in dims if kind == "dir"}
        current = {ino: options - 1 for kind, ino, options in dims if kind == "file"}
        synced = dict.fromkeys(current, 0)
        found = []
        for ino, changes in sorted(self.pending.items()):
            for bit in range(len(changes)):
                found.append(Choice({**full, ino: full[ino] & ~(1 << bit)}, current))
                found.append(Choice({**dict.fromkeys(full, 0), ino: 1 << bit}, synced))
        for kind, ino, options in dims:
            if kind == "file":
                found += [Choice(full, {**current, ino: i}) for i in range(options - 1)]
        return found

    def tree(self, choice: Choice, *, current: bool = False) -> Tree:
        """The directory tree of one state (``current``: the running process's view)."""
        tree: Tree = {}

        def walk(directory: int, prefix: str, seen: frozenset[int]) -> None:
            entries = self.current[directory] if current else self.entries_of(directory, choice)
            for name in sorted(entries):
                ino, path = entries[name], prefix + name
                kind = self.kinds[ino]
                if kind == DIR:
                    if ino not in seen:
                        tree[path] = Node(DIR)
                        walk(ino, path + "/", seen | {ino})
                elif kind == SYMLINK:
                    tree[path] = Node(SYMLINK, target=self.targets[ino])
                else:
                    options = self.contents[ino]
                    pick = (
                        len(options) - 1 if current else choice.content.get(ino, len(options) - 1)
                    )
                    tree[path] = Node(FILE, data=options[pick], inode=ino)

        walk(self.root, "", frozenset({self.root}))
        return tree

    def entries_of(self, directory: int, choice: Choice) -> dict[str, int]:
        """A directory's entries in one state: durable ones plus the chosen pending changes."""
        entries = dict(self.durable[directory])
        mask = choice.kept.get(directory, 0)
        for bit, change in enumerate(self.pending.get(directory, ())):
            if not mask >> bit & 1:
                continue
            for name, ino, present in change.changes:
                if present:
                    entries[name] = ino
                elif entries.get(name) == ino:
                    del entries[name]
        return entries

    def lost(self, choice: Choice) -> list[str]:
        """What the state leaves out, as a person reads it: dropped calls and cut files."""
        found = []
        for ino, changes in sorted(self.pending.items()):
            mask = choice.kept.get(ino, 0)
            found += [
                f"dropped {change.op.describe()}"
                for bit, change in enumerate(changes)
                if not mask >> bit & 1
            ]
        names = {node.inode: path for path, node in self.tree(choice, current=True).items()}
        for ino, options in sorted(self.contents.items()):
            pick = choice.content.get(ino, len(options) - 1)
            if pick < len(options) - 1:
                name = names.get(ino, f"inode {ino}")
                found.append(
                    f"{name}: {len(options[pick])} of {len(options[-1])} bytes survived "
                    f"({len(options[0])} were synced)"
                )
        return found


__all__ = [
    "FSYNC_KINDS",
    "PAGE_SIZE",
    "Choice",
    "DirChange",
    "DiskModel",
    "Frontier",
    "content_candidates",
]
