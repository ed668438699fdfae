"""The writer's journal: opened once, on first use, and never for a run without one."""

from __future__ import annotations

import threading
from pathlib import Path

import afk_local as afk
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.rundir.write.writer_journal import WriterJournal


def test_a_run_without_a_journal_is_at_zero_and_opens_nothing(tmp_path: Path) -> None:
    journal = WriterJournal(tmp_path / "effects.log", "r", record_codec=RecordCodec())
    assert journal.records() == 0
    assert journal.log is None
    assert not (tmp_path / "effects.log").exists()


def test_threads_that_ask_at_once_share_one_journal(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        seen: list[object] = []
        threads = [threading.Thread(target=lambda: seen.append(run.effects)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({id(journal) for journal in seen}) == 1


def test_an_existing_journal_is_opened_to_count_its_records(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        run.effects.call("k", lambda: 1)  # type: ignore[attr-defined]
    with store.resume_writer("r") as run:
        assert run.journal_records() == 2  # intent and outcome


def test_closing_the_writer_closes_the_journal(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    run = store.create("r")
    journal = run.effects
    run.close()
    assert journal._closed  # type: ignore[attr-defined]
