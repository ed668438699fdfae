"""The I/O seam (storage/fsio.py): every write-side call goes through an Env, one per store.

A store made with an Env of its own (``StoreOptions.env``) sends every durable call of
its own through it — writer, journal, gc, fork, delete — and none through the
process-wide one, so a test can fail one store's fsync while another store in the
same process writes undisturbed (LevelDB's per-database ``Env``).
"""

from __future__ import annotations

import ast
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.storage import fsio

STORAGE = Path(afk.__file__).parent / "storage"

# What only fsio.py may call: every system call that changes a directory or makes
# bytes durable. A call elsewhere would bypass the kill switch and the crash explorer.
_WRITE_SIDE = {
    "fdatasync",
    "fsync",
    "ftruncate",
    "link",
    "makedirs",
    "mkdir",
    "remove",
    "removedirs",
    "rename",
    "renames",
    "replace",
    "rmdir",
    "symlink",
    "truncate",
    "unlink",
}


def _direct_os_calls(source: str, name: str) -> list[str]:
    """``os.<write-side>(...)`` calls and ``from os import <write-side>`` in one module."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "os"
            and node.func.attr in _WRITE_SIDE
        ):
            found.append(f"{name}:{node.lineno}: os.{node.func.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"{name}:{node.lineno}: from os import {alias.name}"
                for alias in node.names
                if alias.name in _WRITE_SIDE
            ]
    return found


AROUND_THE_SEAM_ELSEWHERE = {
    "cli/commands/demo.py": "the demo writes its own example file, outside any store",
    "integrations/remote/pull.py": "a download's private temp directory, before it is published",
}
"""Modules outside storage/ that may make write-side calls directly, and why."""


def test_no_module_makes_a_write_side_call_around_the_seam() -> None:
    """storage/ and every layer above it that writes into a store (the watcher's requests,
    schedules and limits, the runner, the CLI): a call around the seam is a write the
    crash explorer never sees (``requests.reject`` moved a request with ``os.replace``)."""
    package = STORAGE.parent
    candidate = re.compile(r"\bos\.(?:" + "|".join(_WRITE_SIDE) + r")\b|from os import")
    modules = sorted(package.rglob("*.py"))
    assert len(modules) > 100  # the walk found the package
    bypasses = []
    for module in modules:
        relative = module.relative_to(package).as_posix()
        if relative in ("storage/fsio.py", *AROUND_THE_SEAM_ELSEWHERE) or relative.startswith(
            "testing/"
        ):
            continue
        source = module.read_text()
        if candidate.search(source):  # parse only what may hold one
            bypasses += _direct_os_calls(source, relative)
    assert bypasses == [], "call these through the store's fsio.Env instead:\n" + "\n".join(
        bypasses
    )
    for relative in AROUND_THE_SEAM_ELSEWHERE:  # each exception still exists and is needed
        assert _direct_os_calls((package / relative).read_text(), relative), relative


def test_a_rename_onto_its_own_hard_link_in_another_directory_removes_the_source(
    tmp_path: Path,
) -> None:
    """A crash between a cross-directory rename's two halves can leave the file under both
    names; rename(2) of a file onto itself does nothing, so moving it again must remove
    the old name, or it stays there for ever (a rejected watcher request, read again on
    every sweep)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    src, dst = tmp_path / "a" / "request.json", tmp_path / "b" / "request.json"
    src.write_bytes(b"{}")
    dst.hardlink_to(src)  # what the crash left
    recorder = _Recorder()
    env = fsio.Env(recorder=recorder)
    env.rename(src, dst)
    assert not src.exists() and dst.read_bytes() == b"{}"
    assert [c.operation for c in recorder.calls] == ["rename", "unlink"]
    other = tmp_path / "a" / "other.json"  # within one directory nothing changes
    other.write_bytes(b"x")
    env.rename(other, tmp_path / "a" / "moved.json")
    assert (tmp_path / "a" / "moved.json").read_bytes() == b"x"


def test_the_seam_check_catches_a_direct_call() -> None:
    source = "import os\nfrom os import replace\nos.unlink('x')\nos.path.join('a')\n"
    assert _direct_os_calls(source, "probe.py") == [
        "probe.py:2: from os import replace",
        "probe.py:3: os.unlink",
    ]


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[fsio.IoCall] = []

    def __call__(self, call: fsio.IoCall) -> None:
        self.calls.append(call)

    def operations(self) -> set[str]:
        return {c.operation for c in self.calls}


def _fail_fsync(operation: str, path: str) -> None:
    if operation == "fsync":
        raise OSError(5, f"Input/output error (injected into one store's Env): {path}")


def test_one_store_fails_through_its_own_env_while_another_writes(tmp_path: Path) -> None:
    faulty = afk.Store(tmp_path / "a", options=afk.StoreOptions(env=fsio.Env(hook=_fail_fsync)))
    healthy = afk.Store(tmp_path / "b")
    seen_globally: list[tuple[str, str]] = []
    previous = fsio.set_io_hook(lambda operation, path: seen_globally.append((operation, path)))
    try:
        with pytest.raises(OSError, match="injected into one store"):
            faulty.create("r")
        with healthy.create("r") as run:
            run.checkpoint("runtime_state", {"n": 1}, step=1)
    finally:
        fsio.set_io_hook(previous)
    assert healthy.open("r").latest().payload == {"n": 1}
    assert seen_globally, "the healthy store writes through the process-wide Env"
    assert not [p for _, p in seen_globally if str(tmp_path / "a") in p]


def test_every_write_of_a_store_goes_through_its_env(tmp_path: Path) -> None:
    recorder, hooked = _Recorder(), []
    env = fsio.Env(hook=lambda operation, path: hooked.append(operation), recorder=recorder)
    store = afk.Store(tmp_path, options=afk.StoreOptions(env=env, pack_loose_limit=4))
    process_wide = _Recorder()
    previous = fsio.set_io_recorder(process_wide)
    try:
        with store.create("r") as run:
            run.effects.record_intent("k", step=1, name="send", input_hash="h", idempotency_key="i")
            for step in range(1, 9):  # past pack_loose_limit: the writer packs
                run.checkpoint("runtime_state", {"n": step}, step=step)
            run.finish("done")
        store.fork("r", 9, "f")  # hard links, the journal up to seq 9
        store.gc()
        store.delete("r", keep_effects=True)
    finally:
        fsio.set_io_recorder(previous)
    assert process_wide.calls == [], "nothing of this store went through the process-wide Env"
    assert {"open", "write", "fsync", "rename", "symlink", "unlink", "mkdir", "link"} <= (
        recorder.operations()
    )
    assert any(c.path.endswith("effects.log") for c in recorder.calls)  # the journal too
    assert any(".pack" in c.path for c in recorder.calls)  # and the writer's packing
    # the deletion marker and the runs.changes records are written unsynced
    # (fsio.replace_unsynced, fsio.append_unsynced): recorded by this store's Env, not hooked
    unsynced = ("runs.deleted", "runs.changes")
    durable = [c for c in recorder.calls if not any(name in c.path for name in unsynced)]
    assert any("runs.deleted" in c.path for c in recorder.calls)
    assert any(c.path.endswith("runs.changes") and c.append for c in recorder.calls)
    assert len(hooked) >= len(durable)


def test_a_failed_checkpoint_is_taken_back_through_the_env(tmp_path: Path) -> None:
    """The unpublish after a failed directory fsync (unlink, ``latest`` swap) is seen too."""
    calls: list[tuple[str, str]] = []
    failing = {"on": False}

    def hook(operation: str, path: str) -> None:
        calls.append((operation, path))
        if failing["on"] and operation == "fsync" and path.endswith("/"):
            raise OSError(5, "Input/output error (injected)")

    store = afk.Store(tmp_path, options=afk.StoreOptions(env=fsio.Env(hook=hook)))
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"n": 1}, step=1)
        failing["on"] = True
        del calls[:]
        with pytest.raises(OSError, match="injected"):
            run.checkpoint("runtime_state", {"n": 2}, step=2)
        failing["on"] = False
    after = calls[[op for op, _ in calls].index("fsync", 1) :]
    assert ("unlink", str(tmp_path / "runs" / "r" / "000000000002.runtime_state.ckpt")) in after
    assert any(op == "symlink" for op, _ in after)  # latest pointed back at seq 1
    reader = store.open("r")
    assert reader.latest().seq == 1
    assert (tmp_path / "runs" / "r" / "latest").readlink().name == (
        "000000000001.runtime_state.ckpt"
    )


def test_module_functions_are_the_default_envs() -> None:
    assert fsio.atomic_write.__self__ is fsio.DEFAULT_ENV
    assert afk.StoreOptions().env is fsio.DEFAULT_ENV
    assert afk.Store("/tmp/afk-seam-unused").env is fsio.DEFAULT_ENV
    previous = fsio.set_io_hook(_fail_fsync)
    try:
        assert fsio.DEFAULT_ENV.hook is _fail_fsync
    finally:
        assert fsio.set_io_hook(previous) is _fail_fsync


def _system_calls(
    monkeypatch: pytest.MonkeyPatch,
    directory: Path,
    publish: Callable[[], None],
    dir_fd: int | None = None,
    relative: list[str] | None = None,
) -> list[tuple[str, ...]]:
    """The os calls ``publish`` makes, with temp names made comparable and a name
    relative to ``dir_fd`` (``openat``, ``renameat``...) shown as the path it names."""
    calls: list[tuple[str, ...]] = []
    real = {name: getattr(os, name) for name in _PUBLISH_CALLS}

    def shown(arg: object, at: object = None) -> str:
        text = (
            os.fsdecode(arg) if isinstance(arg, (str, bytes, os.PathLike)) else type(arg).__name__
        )
        if at is not None:  # a name relative to a directory descriptor: the test's only
            assert at == dir_fd and os.sep not in text, (at, text)
            if relative is not None:
                relative.append(text)
            text = f"{directory}{os.sep}{text}"
        text = text.replace(str(directory), "DIR")
        return re.sub(r"\.tmp-(.+?)\.\d+\.[0-9a-f]+$", r".tmp-\1", text)

    def spy(name: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            paths = [a for a in args if not isinstance(a, int)]
            # Which descriptor each path is relative to: symlink's first argument is the
            # link's content, not a path; replace names two (src_dir_fd, dst_dir_fd).
            ats = {
                "symlink": [None, kwargs.get("dir_fd")],
                "replace": [kwargs.get("src_dir_fd"), kwargs.get("dst_dir_fd")],
                "rename": [kwargs.get("src_dir_fd"), kwargs.get("dst_dir_fd")],
            }.get(name, [kwargs.get("dir_fd")] * len(paths))
            calls.append((name, *(shown(a, at) for a, at in zip(paths, ats, strict=False))))
            return real[name](*args, **kwargs)

        return call

    with monkeypatch.context() as patched:
        for name in _PUBLISH_CALLS:
            patched.setattr(os, name, spy(name))
        publish()
    return calls


_PUBLISH_CALLS = ("open", "write", "fsync", "close", "replace", "rename", "symlink", "unlink")


@pytest.mark.parametrize("symlinks", [True, False])
def test_an_unobserved_publish_makes_the_observed_ones_system_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, symlinks: bool
) -> None:
    """A sync checkpoint's publish skips the seam's bookkeeping when nothing observes the
    Env (no hook, no recorder: the crash explorer always has one). What reaches the
    disk must not depend on that: the same calls, in the same order."""
    if not symlinks:  # a file system without symlinks: latest is a pointer file
        monkeypatch.setattr(os, "symlink", _no_symlink)
    traces = []
    relative: list[list[str]] = []
    fast: list[str] = []
    unobserved_publish = fsio._publish_unobserved
    monkeypatch.setattr(
        fsio,
        "_publish_unobserved",
        lambda *args, **kwargs: fast.append(args[2]) or unobserved_publish(*args, **kwargs),
    )
    for watched in (False, True):
        directory = tmp_path / f"watched-{watched}"
        directory.mkdir()
        env = fsio.Env(recorder=(lambda call: None) if watched else None)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:

            def publish(
                env: fsio.Env = env, directory: Path = directory, dir_fd: int = dir_fd
            ) -> None:
                for seq in (1, 2):
                    name = f"{seq:012d}.runtime_state.ckpt"
                    env.publish_with_link(
                        f"{directory}{os.sep}", name, b"frame %d" % seq, "latest", dir_fd=dir_fd
                    )
                env.publish_with_link(f"{directory}{os.sep}", "x.ckpt", b"x", "latest")

            relative.append([])
            traces.append(_system_calls(monkeypatch, directory, publish, dir_fd, relative[-1]))
        finally:
            os.close(dir_fd)
        assert fsio.read_link(directory / "latest") == "x.ckpt"
        assert (directory / "000000000002.runtime_state.ckpt").read_bytes() == b"frame 2"
        assert sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-")) == []
    assert fast == ["000000000001.runtime_state.ckpt", "000000000002.runtime_state.ckpt", "x.ckpt"]
    unobserved, observed = traces
    # Each publish: the file, (a pointer file's,) the directory.
    assert [c[0] for c in unobserved].count("fsync") == (6 if symlinks else 9)
    assert unobserved == observed
    # The unobserved publish names its files relative to the directory's descriptor
    # (openat, renameat, symlinkat: one name to resolve, not the whole path): the file,
    # its rename's two names, and the link's (its temp name, its rename's two names).
    unobserved_relative, observed_relative = relative
    assert observed_relative == []
    assert len(unobserved_relative) == (2 * 6 if symlinks else 2 * 3 + 2)


def _no_symlink(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EPERM, "symlinks are not supported here")


def test_an_unobserved_publish_that_fails_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(afk.DiskFullError):
        fsio.Env().publish_with_link(f"{tmp_path}{os.sep}", "a.ckpt", b"a", "latest")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("watched", [False, True])
def test_unlink_names_removes_each_name_once_observed_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watched: bool
) -> None:
    """A rewrite's deletions: unobserved, each name relative to one descriptor of the
    directory (unlinkat); observed, one unlink per file by its path, each recorded. The
    same files go either way, a missing one is fine, nothing else is touched."""
    for name in ("a.ckpt", "b.ckpt", "keep.ckpt"):
        (tmp_path / name).write_bytes(b"x")
    recorder = _Recorder()
    env = fsio.Env(recorder=recorder if watched else None)
    names = ["a.ckpt", "gone.ckpt", "b.ckpt"]
    seen: list[tuple[str, int | None]] = []
    real_unlink = os.unlink

    def spy(path: str, *, dir_fd: int | None = None) -> None:
        seen.append((os.fspath(path), dir_fd))
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", spy)
    fsio.unlink_names(env, f"{tmp_path}{os.sep}", names)
    monkeypatch.undo()
    if watched:
        assert seen == [(f"{tmp_path}{os.sep}{n}", None) for n in names]
        assert [c.path for c in recorder.calls] == [
            f"{tmp_path}{os.sep}a.ckpt",
            f"{tmp_path}{os.sep}b.ckpt",
        ]
    else:
        assert [path for path, _ in seen] == names
        assert all(fd is not None for _, fd in seen)
    assert sorted(os.listdir(tmp_path)) == ["keep.ckpt"]
