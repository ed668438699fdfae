"""The store identity file: created once, private, validated and bounded, signed when keyed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.storage.store_identity import (
    MAX_IDENTITY_BYTES,
    adopt_identity,
    identity_path,
    read_identity,
    require_home,
)
from afk_local.storage.trust import require_trusted_run


def make_run(root: Path, **kwargs: object) -> afk.Store:
    store = afk.Store(root, **kwargs)  # type: ignore[arg-type]
    with store.create("r", entrypoint="m:f") as run:
        run.checkpoint("runtime_state", {"a": 1}, step=1)
    return store


def test_the_first_write_records_the_store_id_and_its_resolved_path(tmp_path: Path) -> None:
    store = make_run(tmp_path / "s")
    path = identity_path(store.root)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text().splitlines()[0])
    assert doc["path"] == os.path.realpath(tmp_path / "s")
    assert len(doc["store_id"]) == 32
    with store.create("r2"):  # never rewritten
        pass
    assert json.loads(path.read_text().splitlines()[0]) == doc
    assert store.moved_from() is None


def test_a_store_from_before_identities_gets_one_on_its_next_write(tmp_path: Path) -> None:
    store = make_run(tmp_path / "s")
    identity_path(store.root).unlink()
    with store.resume_writer("r"):
        pass
    assert read_identity(store.root, None) is not None


def test_a_symlinked_path_to_the_store_is_not_a_move(tmp_path: Path) -> None:
    make_run(tmp_path / "s")
    (tmp_path / "link").symlink_to(tmp_path / "s")
    assert afk.Store(tmp_path / "link").moved_from() is None


def test_a_moved_store_is_refused_by_the_trust_gate_until_adopted(tmp_path: Path) -> None:
    make_run(tmp_path / "s")
    os.rename(tmp_path / "s", tmp_path / "t")
    moved = afk.Store(tmp_path / "t")
    assert moved.moved_from() == os.path.realpath(tmp_path / "s")
    require_trusted_run(moved, "r")  # continuing it with this process's own code is fine
    with pytest.raises(afk.StoreMovedError) as caught:  # from where it ran, never
        require_trusted_run(moved, "r", from_origin=True)
    assert caught.value.run_id == "r"
    assert "copied or moved" in str(caught.value) and "adopt" in str(caught.value)
    with pytest.raises(afk.StoreMovedError):
        require_home(moved.root, None, "r")
    before, _ = adopt_identity(moved.root, None)
    assert before == os.path.realpath(tmp_path / "s")
    require_trusted_run(moved, "r")


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"store_id": "x"}', b'{"store_id": "x", "path": "relative"}'],
)
def test_a_damaged_identity_is_refused_with_what_to_do(tmp_path: Path, content: bytes) -> None:
    store = make_run(tmp_path / "s")
    identity_path(store.root).write_bytes(content)
    with pytest.raises(afk.UntrustedStoreError, match="afk-local adopt"):
        require_trusted_run(store, "r", from_origin=True)


def test_an_oversized_or_special_identity_is_not_read(tmp_path: Path) -> None:
    store = make_run(tmp_path / "s")
    path = identity_path(store.root)
    path.write_bytes(b"x" * (MAX_IDENTITY_BYTES + 1))
    with pytest.raises(afk.UntrustedStoreError):
        read_identity(store.root, None)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(afk.UntrustedStoreError):  # never blocks on a FIFO
        read_identity(store.root, None)


def test_a_keyed_store_signs_its_identity(tmp_path: Path) -> None:
    heads = tmp_path / "heads"
    store = make_run(tmp_path / "s", key=b"k" * 32, head_dir=heads)
    path = identity_path(store.root)
    assert len(path.read_text().splitlines()) == 2  # the body and its MAC
    assert read_identity(store.root, store.codec.signer) is not None
    body = path.read_text().splitlines()[0].replace(str(tmp_path), "/elsewhere")
    path.write_text(body + "\n")  # edited, unsigned
    with pytest.raises(afk.UntrustedStoreError, match="does not verify"):
        require_trusted_run(store, "r", from_origin=True)
