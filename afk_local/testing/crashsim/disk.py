"""Directory trees as plain data: read one from disk, write one to disk, name its content.

A :data:`Tree` maps ``/``-separated paths (relative to its root) to nodes: a
directory, a file (its bytes and an inode number, so hard links are rebuilt as
hard links) or a symlink (its target text). The explorer reads the base
directory before a recording (the durable starting state), writes every crash
state it checks, and compares the model with the disk after a recording.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from afk_local.storage.fsio import TEMP_PREFIX


@dataclass(frozen=True)
class Node:
    """One entry of a tree: ``kind`` is ``dir``, ``file`` or ``symlink``."""

    kind: str
    data: bytes = b""
    """file: its content."""
    inode: int = 0
    """file: entries with the same inode are hard links of one file."""
    target: str = ""
    """symlink: the link's target text."""


Tree = dict[str, Node]
"""Path (relative, ``/``-separated, parents before children when sorted) -> node."""

DIR = "dir"
FILE = "file"
SYMLINK = "symlink"


def read_tree(root: Path) -> Tree:
    """The tree under ``root`` as it is on disk (symlinks are not followed)."""
    tree: Tree = {}
    inodes: dict[tuple[int, int], int] = {}

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                path = f"{prefix}{entry.name}"
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    tree[path] = Node(DIR)
                    walk(Path(entry.path), path + "/")
                elif stat.S_ISLNK(info.st_mode):
                    tree[path] = Node(SYMLINK, target=os.readlink(entry.path))
                elif stat.S_ISREG(info.st_mode):
                    inode = inodes.setdefault((info.st_dev, info.st_ino), len(inodes) + 1)
                    tree[path] = Node(FILE, data=Path(entry.path).read_bytes(), inode=inode)

    walk(root, "")
    return tree


def write_tree(tree: Tree, root: Path) -> None:
    """Create ``tree`` under the new directory ``root`` (dirs 0700, files 0600, links kept)."""
    os.mkdir(root, 0o700)
    first_path: dict[int, str] = {}
    for path in sorted(tree):
        node = tree[path]
        target = os.path.join(root, path)
        if node.kind == DIR:
            os.mkdir(target, 0o700)
        elif node.kind == SYMLINK:
            os.symlink(node.target, target)
        elif node.inode in first_path:
            os.link(first_path[node.inode], target)
        else:
            first_path[node.inode] = target
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(node.data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)


def is_temporary(path: str) -> bool:
    """True for an unpublished temp entry (``.tmp-*``) or anything inside one."""
    return any(part.startswith(TEMP_PREFIX) for part in path.split("/"))


def tree_digest(tree: Tree, *, temporaries_by_name: bool = False) -> str:
    """A name for the content of ``tree``: equal digests, equal trees.

    With ``temporaries_by_name``, unpublished temp entries count by name only
    (readers ignore them, writers remove them, so what is inside them changes no
    outcome): trees that differ only there get one digest.
    """
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(tree):
        node = tree[path]
        parts = path.split("/")
        inside = temporaries_by_name and any(p.startswith(TEMP_PREFIX) for p in parts[:-1])
        if inside:
            continue
        digest.update(path.encode() + b"\0" + node.kind.encode() + b"\0")
        if node.kind == SYMLINK:
            digest.update(node.target.encode())
        elif node.kind == FILE and not (temporaries_by_name and is_temporary(parts[-1])):
            digest.update(hashlib.blake2b(node.data, digest_size=16).digest())
        digest.update(b"\n")
    return digest.hexdigest()


def tree_differences(
    expected: Tree,
    actual: Tree,
    *,
    ignore: tuple[str, ...] = (),
    ignore_suffixes: tuple[str, ...] = (),
) -> list[str]:
    """What differs between two trees (paths whose last part is in ``ignore``, or ends
    with one of ``ignore_suffixes``, are skipped)."""

    def kept(path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        return name not in ignore and not name.endswith(ignore_suffixes or ("\0",))

    found = []
    for path in sorted(set(expected) | set(actual)):
        if not kept(path):
            continue
        want, got = expected.get(path), actual.get(path)
        if want is None:
            found.append(f"{path}: on disk, not in the model")
        elif got is None:
            found.append(f"{path}: in the model, not on disk")
        elif (want.kind, want.data, want.target) != (got.kind, got.data, got.target):
            found.append(
                f"{path}: differs ({want.kind} {len(want.data)} B vs {got.kind} {len(got.data)} B)"
            )
    return found


__all__ = [
    "DIR",
    "FILE",
    "SYMLINK",
    "Node",
    "Tree",
    "is_temporary",
    "read_tree",
    "tree_differences",
    "tree_digest",
    "write_tree",
]
