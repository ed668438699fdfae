"""Hostile pack files in a store (issue 33, findings 6 and 7; docs/security.md).

A store holds two healthy runs and one run whose only pack is hostile: an index with
an out-of-range seq (crc recomputed), a sparse 1 GiB file whose header declares an
index of all of it, or 4 blocks of zstd bombs (a few KB on disk). Every command runs in
a child process whose peak RSS is measured (a fresh parent's ``RUSAGE_CHILDREN``): it
stays under the bounds docs/security.md states, reports the hostile run as one damaged
run and goes on with the others.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from attacks import (
    Measured,
    bomb_pack,
    measure,
    measure_afk,
    packed_run,
    seq_out_of_range,
    sparse_index_pack,
)

import afk_local as afk
from afk_local.storage.format.pack import BLOCK_CACHE_BYTES, MAX_ENTRY_BYTES

MiB = 1 << 20
READ_BOUND = 320 * MiB
"""docs/security.md: what one read may cost in all (a record, one base)."""
PACK_READ_BOUND = MAX_ENTRY_BYTES + (128 << 10) + BLOCK_CACHE_BYTES
"""docs/security.md: what reading packs adds above a reader's baseline: one decoded
block and the block cache."""
SLACK = 16 * MiB  # allocator and interpreter noise between two children

HOSTILE: dict[str, Callable[[Path], object]] = {
    "seq_out_of_range": seq_out_of_range,
    "sparse_index": sparse_index_pack,
    # Four bombs: a reader that kept any two decoded blocks (128 MiB) would already be
    # over PACK_READ_BOUND + SLACK (88 MiB); more bombs only cost CI time.
    "zstd_bombs": functools.partial(bomb_pack, blocks=4),
}

LATEST = """
import sys, afk_local
print(afk_local.Store(sys.argv[1]).open("bad").latest())
"""


def healthy_run(store: afk.Store, run_id: str, n: int = 20) -> None:
    with store.create(run_id) as run:
        for i in range(n):
            run.checkpoint("runtime_state", {"i": i, "pad": "x" * 200}, step=i)


def hostile_store(root: Path, attack: Callable[[Path], object]) -> afk.Store:
    store = afk.Store(root)
    healthy_run(store, "a")
    attack(packed_run(root, "bad"))
    healthy_run(store, "c")
    return store


def loose_files(root: Path, run_id: str) -> int:
    return len(list((root / "runs" / run_id).glob("*.ckpt")))


def no_traceback(done: Measured) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


def within_bounds(done: Measured, baseline: int, what: str) -> None:
    assert done.peak < READ_BOUND, f"{what}: {done.peak / MiB:.0f} MiB"
    assert done.peak - baseline <= PACK_READ_BOUND + SLACK, (
        f"{what}: {done.peak / MiB:.0f} MiB, baseline {baseline / MiB:.0f} MiB"
    )


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_pack_is_one_damaged_run_within_the_memory_bound(
    tmp_path: Path, kind: str
) -> None:
    healthy = tmp_path / "healthy"
    healthy_run(afk.Store(healthy), "a")
    baseline = measure_afk(healthy, "verify").peak  # the same command on a healthy store
    root = tmp_path / "store"
    hostile_store(root, HOSTILE[kind])

    verify = measure_afk(root, "verify")
    no_traceback(verify)
    within_bounds(verify, baseline, "verify")
    assert verify.code == 1
    runs_lines = [line for line in verify.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split(":")[0] for line in runs_lines if "PROBLEM" in line] == ["bad"]
    assert "a: ok" in verify.stdout and "c: ok" in verify.stdout
    assert "1 of 3 run(s) damaged" in verify.stdout

    runs = measure_afk(root, "runs")
    no_traceback(runs)
    within_bounds(runs, baseline, "runs")
    assert runs.code == 1
    rows = {line.split()[0]: line for line in runs.stdout.splitlines()[1:4]}
    assert sorted(rows) == ["a", "bad", "c"]
    assert "(DAMAGED)" in rows["bad"] and "DAMAGED" not in rows["a"] + rows["c"]
    assert sum(line.startswith("bad: DAMAGED:") for line in runs.stdout.splitlines()) == 1

    listed = measure_afk(root, "runs", "--json")
    assert {r["run_id"]: r["damage"] is not None for r in json.loads(listed.stdout)} == {
        "a": False,
        "bad": True,
        "c": False,
    }

    show = measure_afk(root, "show", "bad")
    no_traceback(show)
    within_bounds(show, baseline, "show")
    assert show.code == 1 and "afk-local" in show.stdout and "verify bad" in show.stdout

    latest = measure(sys.executable, "-c", LATEST, str(root))
    no_traceback(latest)
    within_bounds(latest, baseline, "latest()")
    assert latest.code == 0 and latest.stdout.strip() == "None"

    before = {r: loose_files(root, r) for r in ("a", "c")}
    gc = measure_afk(root, "gc")
    no_traceback(gc)
    within_bounds(gc, baseline, "gc")
    assert gc.code == 1
    errors = [line for line in gc.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: run bad:"), gc.stdout
    for run_id, count in before.items():  # the healthy runs were compacted all the same
        assert loose_files(root, run_id) < count
        assert afk.Store(root).open(run_id).latest().payload["i"] == 19


def test_the_store_api_reports_the_hostile_run_and_goes_on(tmp_path: Path) -> None:
    store = hostile_store(tmp_path, seq_out_of_range)
    infos = {i.run_id: i for i in store.runs()}
    assert sorted(infos) == ["a", "bad", "c"]
    assert infos["bad"].damage is not None and "do not rise strictly" in infos["bad"].damage
    assert infos["a"].damage is None and infos["c"].damage is None
    assert "damaged:" in repr(infos["bad"])

    report = store.gc()
    assert [c.run_id for c in report.compacted] == ["a", "c"]
    assert len(report.errors) == 1 and report.errors[0].startswith("run bad:")

    packed = {r.run_id: r for r in store.pack()}
    assert packed["a"].errors == [] and packed["c"].errors == []
    assert store.open("a").latest() is not None and store.open("c").latest() is not None


def test_an_unexpected_error_in_one_run_is_reported_for_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damage no check catches (here: a bug planted in the reader) is still one run's line."""
    store = afk.Store(tmp_path)
    for run_id in ("a", "bad", "c"):
        healthy_run(store, run_id, n=3)
    from afk_local.storage.rundir.read.reader import RunReader  # noqa: PLC0415

    for name in ("latest", "checkpoint_files"):  # what listing and gc read first
        real = getattr(RunReader, name)

        def planted(self: RunReader, real: Callable[[RunReader], object] = real) -> object:
            if self.run_id == "bad":
                raise IndexError("planted")
            return real(self)

        monkeypatch.setattr(RunReader, name, planted)
    infos = {i.run_id: i for i in store.runs()}
    assert sorted(infos) == ["a", "bad", "c"]
    assert infos["bad"].damage == "unexpected IndexError: planted (please report it)"
    report = store.gc()
    assert {c.run_id for c in report.compacted} == {"a", "c"}
    assert report.errors == ["run bad: skipped: unexpected IndexError: planted (please report it)"]
