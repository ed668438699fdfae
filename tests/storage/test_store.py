"""The store (afk_local/storage/store.py): creating runs when processes race or crashed before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.storage import fsio

# Creates the run id it reads on stdin, writes one checkpoint, closes; says how it went.
CREATOR = """
import sys, afk_local as afk
store, me = afk.Store(sys.argv[1]), sys.argv[2]
print("ready", flush=True)
for line in sys.stdin:
    try:
        with store.create(line.strip()) as run:
            run.checkpoint("runtime_state", {"by": me}, step=1)
        print("won", flush=True)
    except (afk.RunExistsError, afk.RunLockedError) as exc:
        print(type(exc).__name__, flush=True)
"""


@pytest.fixture
def fast_root(tmp_path: Path) -> Iterator[Path]:
    """A store root on tmpfs where there is one: fsync costs nothing, so races come often."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="afk-test-", dir=shm))
        try:
            yield root / "store"
        finally:
            shutil.rmtree(root, ignore_errors=True)
    else:
        yield tmp_path / "store"


def test_two_processes_creating_one_new_run_id_one_wins_cleanly(fast_root: Path, trials) -> None:
    """The loser gets RunExistsError or RunLockedError, never a run it shares with the winner."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    creators = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CREATOR), str(fast_root), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("a", "b")
    ]
    try:
        for creator in creators:
            assert creator.stdout is not None and creator.stdout.readline().strip() == "ready"
        both_won = []
        for i in range(trials(2000, 30000)):
            for creator in creators:
                assert creator.stdin is not None
                creator.stdin.write(f"race-{i}\n")
                creator.stdin.flush()
            said = [creator.stdout.readline().strip() for creator in creators]  # type: ignore[union-attr]
            assert said.count("won") >= 1, (i, said)
            if said == ["won", "won"]:
                both_won.append(f"race-{i}")
    finally:
        for creator in creators:
            creator.kill()
            creator.wait()
    store = afk.Store(fast_root)
    writers = {
        run_id: sorted({c.payload["by"] for c in store.open(run_id).history()})
        for run_id in both_won
    }
    assert not both_won, f"both creators won {len(both_won)} run(s); writers: {writers}"


def test_create_adopting_a_directory_a_crash_left_makes_its_entry_durable(tmp_path: Path) -> None:
    """A crash between mkdir and the parent's fsync: whoever adopts the directory fsyncs it."""
    store = afk.Store(tmp_path / "store")
    fsio.make_dirs(store.runs_dir)
    os.mkdir(store.paths("r").dir, 0o700)  # what the crash left: created, maybe not durable
    ops: list[tuple[str, str]] = []
    previous = fsio.set_io_hook(lambda operation, path: ops.append((operation, path)))
    try:
        with store.create("r") as run:
            run.checkpoint("runtime_state", {"i": 1}, step=1)
    finally:
        fsio.set_io_hook(previous)
    first_ack = ops.index(("fsync", str(store.paths("r").dir)))
    assert ("fsync", str(store.runs_dir)) in ops[:first_ack], ops


def test_paths_reads_nothing_unless_asked_to_refuse_links(tmp_path: Path) -> None:
    elsewhere = afk.Store(tmp_path / "elsewhere")
    elsewhere.create("r").close()
    store = afk.Store(tmp_path / "store")
    store.runs_dir.mkdir(parents=True)
    os.symlink(elsewhere.paths("r").dir, store.runs_dir / "r")
    assert store.paths("r").dir == store.runs_dir / "r"
    with pytest.raises(afk.UntrustedStoreError, match="symlink"):
        store.paths("r", refuse_links=True)
    assert store.paths("new", refuse_links=True).dir == store.runs_dir / "new"


def test_open_reads_the_meta_now_unless_lazy(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with pytest.raises(afk.RunNotFoundError):
        store.open("missing")
    reader = store.open("missing", lazy=True)  # a view of what is there: nothing yet
    assert reader.run_id == "missing"


def test_a_store_whose_directory_cannot_be_made_is_one_clear_error(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for root in ("/proc/afk-local-nope", str(blocker / "store")):
        store = afk.Store(root)
        with pytest.raises(afk.StoreUnusableError) as caught:
            store.create("r1")
        message = str(caught.value)
        assert message.startswith(f"cannot use {root} as a store: ")
        assert "\n" not in message
        assert isinstance(caught.value, OSError) and caught.value.errno is not None
