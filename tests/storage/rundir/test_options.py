"""StoreOptions (storage/rundir/options.py): every setting, its default, one environment read."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.storage import fsio
from afk_local.storage.format.codec import DEFAULT_LEVEL, DEFAULT_MAX_RECORD_BYTES
from afk_local.storage.format.layout import DEFAULT_LOOSE_LIMIT
from afk_local.storage.rundir.options import (
    DEFAULT_DELTA_FRACTION,
    DEFAULT_MAX_CHAIN,
    StoreOptions,
    default_root,
    state_head_dir,
)

STORAGE = Path(afk.__file__).parent / "storage"
DOCS = Path(afk.__file__).parent.parent / "docs" / "options.md"
KEY = "a store key of sufficient length"


def test_the_defaults() -> None:
    options = StoreOptions()
    assert options.enc_hook is None and options.dec_hook is None and options.key is None
    assert options.max_record_bytes == DEFAULT_MAX_RECORD_BYTES == 256 << 20
    assert options.lock_timeout == 0.0
    assert options.max_chain == DEFAULT_MAX_CHAIN == 32
    assert options.delta_fraction == DEFAULT_DELTA_FRACTION == 0.5
    assert options.level == DEFAULT_LEVEL
    assert options.pack_loose_limit == DEFAULT_LOOSE_LIMIT == 256
    assert options.mirror is None and options.head_dir is None
    assert options.env is fsio.DEFAULT_ENV
    assert afk.StoreOptions is StoreOptions


def test_the_key_is_never_shown() -> None:
    assert KEY not in repr(StoreOptions(key=KEY))


def test_options_are_frozen_and_replaced() -> None:
    options = StoreOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_chain = 4  # type: ignore[misc]
    assert dataclasses.replace(options, max_chain=4).max_chain == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_chain": 1025}, "max_chain must be 0..1024"),
        ({"max_chain": -1}, "max_chain must be 0..1024"),
        ({"max_record_bytes": 0}, "max_record_bytes must be >= 1"),
        ({"delta_fraction": -0.1}, "delta_fraction must be >= 0"),
        ({"pack_loose_limit": -1}, "pack_loose_limit must be >= 0"),
    ],
)
def test_out_of_range_settings_are_refused(change: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StoreOptions(**change)  # type: ignore[arg-type]
    if "delta_fraction" not in change:  # a Store keyword too
        with pytest.raises(ValueError, match=message):
            afk.Store("/tmp/afk-options-unused", **change)  # type: ignore[arg-type]


def test_from_environ_reads_every_variable(tmp_path: Path) -> None:
    environ = {
        "AFK_LOCAL_KEY": KEY,
        "AFK_LOCAL_MAX_RECORD_BYTES": "4096",
        "AFK_LOCAL_MIRROR": "file:///somewhere",
        "AFK_LOCAL_HEAD_DIR": str(tmp_path / "heads"),
    }
    options = StoreOptions.from_environ(environ)
    assert options.key == KEY
    assert options.max_record_bytes == 4096
    assert options.mirror == "file:///somewhere"
    assert options.head_dir == tmp_path / "heads"
    empty = StoreOptions.from_environ(dict.fromkeys(environ, ""))  # empty counts as unset
    assert empty == StoreOptions()
    assert StoreOptions.from_environ({}) == StoreOptions()


@pytest.mark.parametrize("value", ["lots", "0", "-5"])
def test_a_bad_max_record_bytes_variable_names_itself(value: str) -> None:
    with pytest.raises(ValueError, match="AFK_LOCAL_MAX_RECORD_BYTES"):
        StoreOptions.from_environ({"AFK_LOCAL_MAX_RECORD_BYTES": value})


def test_store_reads_the_environment_only_without_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AFK_LOCAL_MAX_RECORD_BYTES", "12345")
    monkeypatch.setenv("AFK_LOCAL_KEY", KEY)
    monkeypatch.setenv("AFK_LOCAL_HEAD_DIR", str(tmp_path / "heads"))
    from_env = afk.Store(tmp_path / "a")
    assert from_env.max_record_bytes == 12345
    assert from_env.keyed and from_env.head_dir == tmp_path / "heads"
    assert from_env.options == StoreOptions.from_environ()
    explicit = afk.Store(tmp_path / "b", options=StoreOptions())
    assert explicit.max_record_bytes == DEFAULT_MAX_RECORD_BYTES
    assert not explicit.keyed


def test_a_keyword_wins_over_options(tmp_path: Path) -> None:
    base = StoreOptions(max_chain=8, lock_timeout=2.0, pack_loose_limit=None)
    store = afk.Store(tmp_path, options=base, max_chain=4, pack_loose_limit=16)
    assert store.options == dataclasses.replace(base, max_chain=4, pack_loose_limit=16)
    assert (store.max_chain, store.lock_timeout, store.pack_loose_limit) == (4, 2.0, 16)
    kept = afk.Store(tmp_path, options=base)  # keywords left out leave the options alone
    assert kept.options is base


def test_store_keywords_keep_working(tmp_path: Path) -> None:
    store = afk.Store(
        tmp_path,
        options=StoreOptions(),
        max_record_bytes=1 << 20,
        lock_timeout=1.5,
        max_chain=7,
        key=KEY,
        mirror="",
        head_dir=tmp_path / "heads",
        pack_loose_limit=None,
    )
    assert store.max_record_bytes == 1 << 20 and store.lock_timeout == 1.5
    assert store.max_chain == 7 and store.pack_loose_limit is None
    assert store.keyed and store.mirror_url is None and store.mirror is None
    assert store.head_dir == tmp_path / "heads" and store.head_dir_given


def test_store_attributes_are_views_of_its_options(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, options=StoreOptions())
    store.pack_loose_limit = 3  # the crash explorer's workloads do this
    store.max_chain = 0
    assert store.options.pack_loose_limit == 3 and store.options.max_chain == 0
    with pytest.raises(ValueError, match="max_chain"):
        store.max_chain = 5000


def test_the_writer_gets_its_settings_from_the_options(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, options=StoreOptions(max_chain=0, pack_loose_limit=None))
    with store.create("r") as run:
        for step in range(1, 6):
            run.checkpoint("runtime_state", {"text": "same " * 200, "step": step}, step=step)
    reader = store.open("r")
    files = reader.checkpoint_files()
    assert len(files) == 5  # no packing
    assert all(reader.stored_bytes(f)[5] & 1 == 0 for f in files)  # max_chain=0: no delta


def test_without_a_head_dir_the_state_directory_is_used(tmp_path: Path) -> None:
    environ = {"XDG_STATE_HOME": str(tmp_path)}
    resolved = StoreOptions().resolved_head_dir(environ)
    assert resolved == state_head_dir(environ)
    assert StoreOptions(head_dir=tmp_path / "h").resolved_head_dir(environ) == tmp_path / "h"


def test_default_root() -> None:
    assert default_root({}) == Path(".afk")
    assert default_root({"AFK_LOCAL_ROOT": "/x"}) == Path("/x")


def test_the_environment_is_read_in_one_module() -> None:
    readers = []
    for module in sorted(STORAGE.rglob("*.py")):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in ("environ", "getenv", "environb")
            ):
                readers.append(str(module.relative_to(STORAGE)))
    assert set(readers) == {"rundir/options.py"}


def test_every_option_is_documented() -> None:
    text = DOCS.read_text()
    for option in dataclasses.fields(StoreOptions):
        assert f"`{option.name}`" in text, f"docs/options.md does not list {option.name}"
    for variable in ("AFK_LOCAL_ROOT", "AFK_LOCAL_KEY", "AFK_LOCAL_MAX_RECORD_BYTES"):
        assert variable in text
    for variable in ("AFK_LOCAL_MIRROR", "AFK_LOCAL_HEAD_DIR"):
        assert variable in text
