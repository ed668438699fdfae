"""fsio.exchange: two names swapped in one step, recorded as one call (or False, nothing done)."""

from __future__ import annotations

from pathlib import Path

import pytest

from afk_local.storage import fsio


def _dir_with(path: Path, name: str) -> Path:
    path.mkdir()
    (path / name).write_text(name)
    return path


def test_exchange_swaps_two_directories_and_the_recorder_sees_one_call(tmp_path: Path) -> None:
    old = _dir_with(tmp_path / "run", "old")
    new = _dir_with(tmp_path / ".tmp-new", "new")
    calls: list[fsio.IoCall] = []
    previous = fsio.set_io_recorder(calls.append)
    try:
        swapped = fsio.exchange(new, old)
    finally:
        fsio.set_io_recorder(previous)
    if not swapped:
        pytest.skip("this system or filesystem cannot exchange two names")
    assert sorted(p.name for p in old.iterdir()) == ["new"]
    assert sorted(p.name for p in new.iterdir()) == ["old"]
    assert calls == [fsio.IoCall("exchange", str(old), source=str(new))]


def test_exchange_of_a_missing_name_raises_and_changes_nothing(tmp_path: Path) -> None:
    kept = _dir_with(tmp_path / "run", "old")
    if not fsio.exchange(_dir_with(tmp_path / "a", "a"), _dir_with(tmp_path / "b", "b")):
        pytest.skip("this system or filesystem cannot exchange two names")
    with pytest.raises(FileNotFoundError):
        fsio.exchange(tmp_path / "missing", kept)
    assert sorted(p.name for p in kept.iterdir()) == ["old"]


def test_the_kill_switch_counts_an_exchange_as_a_rename(tmp_path: Path) -> None:
    seen: list[str] = []
    previous = fsio.set_io_hook(lambda operation, path: seen.append(operation))
    try:
        fsio.exchange(_dir_with(tmp_path / "a", "a"), _dir_with(tmp_path / "b", "b"))
    finally:
        fsio.set_io_hook(previous)
    assert seen == ["rename"]
