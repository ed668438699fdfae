"""A value the journal keeps but JSON cannot (a dict keyed by tuples) never stops the
commands that show it: ``effects``, ``show``, ``inspect``, ``export`` print the key as
its ``repr``, as they print other non-str keys as strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.cli import main


def by_cell(cell: str) -> dict[tuple[int, int], str]:
    return {(0, 0): cell, (0, 1): "b2"}


@afk.durable
def sheet(ctx: afk.RunContext) -> int:
    cells = ctx.step("read", by_cell, "a1")  # journaled: a tuple-keyed result
    ctx.state["cells"] = cells
    return len(cells)


def test_a_tuple_keyed_result_is_shown_by_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = afk.Store(tmp_path / ".afk")
    assert sheet.with_store(store).run(run_id="sheet") == 2
    root = str(store.root)
    shown: dict[str, str] = {}
    for command in (["effects"], ["effects", "--json"], ["show"], ["inspect"], ["export"]):
        code = main(["--root", root, *command, "sheet"])
        captured = capsys.readouterr()
        assert (code, captured.err) == (0, ""), command
        shown[" ".join(command)] = captured.out
    (effect,) = json.loads(shown["effects --json"])
    assert effect["result"] == {"(0, 0)": "a1", "(0, 1)": "b2"}
    assert '"(0, 1)": "b2"' in json.dumps(json.loads(shown["export"]))
