"""The program actions that make or remove whole runs: fork, export and import, delete.

A base of :class:`~.execute.Execution`, which holds the state these methods read and
change (the store, the model of its runs, the runs removed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from afk_local.errors import AfkLocalError
from afk_local.storage.format.records import RunStatus
from afk_local.storage.ops.export import export_records, import_run, to_jsonable
from afk_local.storage.store import Store
from afk_local.testing.fuzz.model import RunModel


@dataclass
class Pending:
    """The model change an action makes once it is acknowledged, and what to do when a
    power cut came while it ran (``in_flight``: look at the disk and decide)."""

    commit: Callable[[], None] = lambda: None
    in_flight: Callable[[], None] = lambda: None
    undone: Callable[[], None] = lambda: None
    """The power cut came before the action started: it never happened."""


class StoreActions:
    """Fork, export/import and delete, each returning the model change it makes."""

    store: Store
    runs: dict[str, RunModel]
    removed: set[str]
    gone: set[str]
    counter: int

    def _completed_on_disk(self, run_id: str) -> bool:
        return (
            self.store.exists(run_id) and self.store.read_meta(run_id).status is RunStatus.COMPLETED
        )

    def _fork(self, run_id: str, pick: int) -> Pending:
        if run_id not in self.runs or not self._completed_on_disk(run_id):
            return Pending()
        history = self.store.open(run_id).history()
        new_id = f"{run_id}-f{self.counter}"
        try:
            self.store.fork(run_id, history[pick % len(history)].seq, new_id)
        except AfkLocalError as exc:
            if "gc trimmed its effect journal" not in str(exc):
                raise
            return Pending()  # documented refusal (docs/cli.md, fork): nothing changes
        return self._made(new_id, self.runs[run_id], "fork")

    def _export(self, run_id: str) -> Pending:
        if run_id not in self.runs or not self._completed_on_disk(run_id):
            return Pending()
        records = export_records(self.store.open(run_id))
        text = "\n".join(json.dumps(to_jsonable(r)) for r in records)
        new_id = f"{run_id}-i{self.counter}"
        import_run(self.store, text, new_run_id=new_id, source="fuzz export")
        return self._made(new_id, self.runs[run_id], "import")

    def _made(self, new_id: str, source: RunModel, kind: str) -> Pending:
        made = RunModel(source.spec, kind, source.expected, exists=True, completed=kind == "import")

        def commit() -> None:
            self.runs[new_id] = made

        def in_flight() -> None:
            if self.store.exists(new_id):
                made.exists = made.completed = False  # not acknowledged: must merely work
                self.runs[new_id] = made

        return Pending(commit, in_flight)

    def _remove(self, run_id: str) -> Pending:
        if run_id not in self.runs or not self.store.exists(run_id):
            return Pending()
        self.store.delete(run_id)
        self.gone.add(run_id)
        return self._removal(run_id)

    def _removal(self, run_id: str) -> Pending:
        def commit() -> None:
            self.runs.pop(run_id, None)
            self.removed.add(run_id)

        def in_flight() -> None:
            if self.store.exists(run_id):
                self.gone.discard(run_id)
            else:
                commit()

        return Pending(commit, in_flight, lambda: self.gone.discard(run_id))
