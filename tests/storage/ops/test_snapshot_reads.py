"""Export and fork read one consistent view of a run while rewrites change it (issue 33).

- a writer process packing (and merging packs) as it goes runs while this process
  exports the run again and again (the API, and the CLI in a new process): every
  export is complete and right (no checkpoint missing: a listing taken while a merge
  removed a pack it named used to skip that pack's checkpoints), or fails with one
  line that says to export again; every export imports into a new store and resumes
  from its newest checkpoint;
- a gc that trims the journal between the export's read of the checkpoints and its
  read of the effects makes the export read again, so an exported trimmed journal
  always comes with the meta that says so (a fork of the import refuses it); a fork
  reads the journal before run.meta for the same reason.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import proc
import pytest
from proc import REPO, SUPPORT, spawn

import afk_local as afk
from afk_local.journal.journal import journal_of
from afk_local.storage.ops.export import export_records, import_run
from afk_local.storage.ops.fork import JOURNAL_TRIMMED_KEY
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.read.reader import RunReader

WRITER = "import sys, rewrite_jobs; rewrite_jobs.writer(*sys.argv[1:])"


def _env() -> dict[str, str]:
    path = [str(REPO), str(SUPPORT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _check_export(records: list[dict[str, Any]], tmp: Path, n: int) -> None:
    """The export holds the run as at one instant: what the writer wrote, nothing else."""
    sys.path.insert(0, str(SUPPORT))
    try:
        from rewrite_jobs import payload  # noqa: PLC0415
    finally:
        sys.path.remove(str(SUPPORT))
    checkpoints = [r["checkpoint"] for r in records if r["type"] == "checkpoint"]
    seqs = [c["seq"] for c in checkpoints]
    assert seqs == sorted(set(seqs)), seqs
    states = [c for c in checkpoints if c["phase"] == "runtime_state"]
    assert states, "an export of a live run with no runtime state"
    steps = [c["step"] for c in states]
    # gc deletes the oldest: what stays is every runtime state from the oldest kept on
    assert steps == list(range(steps[0], steps[0] + len(steps))), steps
    for c in states:
        assert c["payload"] == payload(c["step"]), f"checkpoint {c['seq']} holds another state"
    target = afk.Store(tmp / f"import-{n}")
    text = "".join(json.dumps(r) + "\n" for r in records)
    import_run(target, text, new_run_id="copy")
    state = target.open("copy").resume_state()
    assert state.state == payload(steps[-1])


def test_exports_while_a_writer_packs_are_whole_or_one_line(tmp_path: Path) -> None:
    root = tmp_path / "store"
    env = _env()
    writer = spawn(WRITER, str(root), "0", "0", "0", "0.005", env=env)
    try:
        assert writer.stdout is not None
        for _ in range(6):  # the run exists, with a few checkpoints, before anyone reads it
            assert writer.stdout.readline().startswith("ack"), writer.stderr
        store = afk.Store(root)
        exported = refused = 0
        for n in range(12):
            try:
                records = export_records(store.open("r"))
            except afk.errors.AfkLocalError as exc:
                assert "export it again" in str(exc) and "\n" not in str(exc), exc
                refused += 1
                continue
            _check_export(records, tmp_path, n)
            exported += 1
        assert exported >= 6, f"{refused} of 12 exports refused"
        for n in range(2):  # the CLI, in a new process: the whole document or one line
            done = proc.python(
                ["-m", "afk_local", "--root", str(root), "export", "r", "--format", "jsonl"],
                env={**os.environ, **env},
                timeout=120,
            )
            if done.returncode != 0:
                assert len(done.stderr.strip().splitlines()) == 1, done.stderr
                assert "export it again" in done.stderr
                continue
            lines = [json.loads(line) for line in done.stdout.splitlines()]
            _check_export(lines, tmp_path, 100 + n)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate()


def _finished_run(store: afk.Store) -> None:
    with store.create("done") as run:
        for i in range(6):
            if i < 4:
                journal_of(run).call(f"e{i}", lambda i: i, (i,))
            run.checkpoint("runtime_state", {"i": i}, step=i)
        run.finish("done result")


def test_a_journal_trimmed_while_exporting_comes_with_its_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = afk.Store(tmp_path / "store")
    _finished_run(store)
    reader = store.open("done")
    read_history = reader.history
    trims: list[int] = []

    def history_then_gc(**kwargs: Any) -> Any:
        checkpoints = read_history(**kwargs)
        if not trims:  # gc trims the journal between the checkpoints and the effects
            report = store.gc(RetentionPolicy(keep_runtime_states=8, max_effects_per_run=2))
            trims.append(sum(c.effects_dropped for c in report.compacted))
        return checkpoints

    monkeypatch.setattr(reader, "history", history_then_gc)
    records = export_records(reader)
    assert trims == [4]  # records: two intents, two outcomes
    meta = next(r["meta"] for r in records if r["type"] == "meta")
    effects = {r["effect"]["key"] for r in records if r["type"] == "effect"}
    assert effects == {"e2", "e3"}  # the trimmed journal, read again after the gc
    assert meta["extra"][JOURNAL_TRIMMED_KEY] == 4  # and the meta that says so
    target = afk.Store(tmp_path / "copy")
    import_run(target, "".join(json.dumps(r) + "\n" for r in records), new_run_id="copy")
    first_two = next(c.seq for c in target.open("copy").history() if c.journal_records == 4)
    with pytest.raises(afk.errors.AfkLocalError, match="trimmed"):
        target.fork("copy", first_two, "forked")


def test_export_gives_up_with_one_line_when_every_read_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = afk.Store(tmp_path / "store")
    _finished_run(store)
    reader: RunReader = store.open("done")

    def always_moved(**_kwargs: Any) -> Any:
        raise afk.errors.CheckpointCorruptionError("x", "file vanished while reading", moved=True)

    monkeypatch.setattr(reader, "history", always_moved)
    with pytest.raises(afk.errors.AfkLocalError, match="export it again") as caught:
        export_records(reader)
    assert not isinstance(caught.value, afk.errors.CheckpointCorruptionError)


def test_a_fork_whose_reader_predates_a_trimming_gc_refuses(tmp_path: Path) -> None:
    """The fork reads the journal, then run.meta: a gc that trimmed the journal after the
    source's reader read its meta is seen, and the fork refuses, as for any trimmed run
    (it used to take the first records of the trimmed journal: two later effects)."""
    from afk_local.storage.ops.fork import fork_run  # noqa: PLC0415

    store = afk.Store(tmp_path / "store")
    _finished_run(store)
    source = store.open("done")
    assert JOURNAL_TRIMMED_KEY not in (source.meta.extra or {})  # read before the gc
    at = next(c.seq for c in source.history() if c.journal_records == 4)
    report = store.gc(RetentionPolicy(keep_runtime_states=8, max_effects_per_run=2))
    assert sum(c.effects_dropped for c in report.compacted) == 4
    with pytest.raises(afk.errors.AfkLocalError, match="trimmed"):
        fork_run(source, at, store.paths("forked"))
    assert not store.exists("forked")
