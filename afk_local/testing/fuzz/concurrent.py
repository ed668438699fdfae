"""What the fuzzer runs beside an attempt or instead of it: a maintainer, the watcher.

- :class:`Maintainer`: ``gc`` and ``verify`` of the whole store in a thread, over and
  over, while an attempt runs (in this process, or in a child SIGKILLed mid-attempt):
  a person's ``afk-local gc`` and ``afk-local verify`` during a run, not between two.
  A verify that reports a run damaged, or a gc or verify that raises, is a divergence.
- :func:`watch_once`: ``afk-local watch --once`` in a child, the watcher resuming every
  interrupted run it finds (each in a child of its own) and waiting for them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from afk_local.errors import AfkLocalError, RunNotFoundError
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.store import Store
from afk_local.testing.fuzz.command import CommandResult, afk_local_command

WATCH_ARGS = ("--json", "--interval", "0.2", "--backoff", "0.2", "--grace", "10")
"""``afk-local watch --once`` options for the fuzzer: short waits, a short grace."""


class Maintainer:
    """``gc`` and ``verify`` in a thread while the ``with`` block runs (module docstring).

    Args:
        open_store: opens the store as another process would (its own Store object).
        policy: the retention policy gc applies.
    """

    def __init__(self, open_store: Callable[[], Store], policy: RetentionPolicy) -> None:
        self._open_store = open_store
        self._policy = policy
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fuzz-maintainer", daemon=True)
        self.problems: list[str] = []
        """Divergences seen: damage reported on a healthy store, an error raised."""
        self.rounds = 0
        """Rounds of gc and verify made."""

    def __enter__(self) -> Maintainer:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self.problems:
            self._round()
            self.rounds += 1
            if self._stop.is_set():
                return  # at least one whole round, the last one after the attempt ended
            time.sleep(0.001)

    def _round(self) -> None:
        try:
            store = self._open_store()
            report = store.gc(self._policy)
            self.problems += [f"gc during an attempt: {error}" for error in report.errors]
            for run_id in store.run_ids():
                try:
                    verified = store.open(run_id, lazy=True).verify()
                except RunNotFoundError:
                    continue  # removed since it was listed
                if not verified.ok:
                    self.problems.append(
                        f"verify during an attempt: run {run_id}: {verified.problems}"
                    )
        except (AfkLocalError, OSError) as exc:
            self.problems.append(f"gc or verify during an attempt raised {exc!r}")


def watch_once(root: Path) -> CommandResult:
    """``afk-local watch --once`` on the store at ``root``, in a child, to its end."""
    return afk_local_command(root, ["watch", "--once", *WATCH_ARGS], kill_at=None, timeout=300)


IN_DOUBT = "was started but has no recorded outcome"
"""How an effect in doubt is worded (EffectInDoubtError): a kill between an intent and its
outcome leaves one, and the watcher's child rightly stops there."""


FLAKY = "fails the first time"
"""How a ``flaky`` instruction's step fails (:mod:`.jobs`): its run fails and is retried, so
the watcher rightly reports it failed."""


def watch_problems(done: CommandResult) -> list[str]:
    """What a ``watch --once`` child did that the model does not allow: any exit but 0,
    unless every run it reported failing (exit 1) stopped at an effect in doubt (the
    liveness phase settles it, as a person would) or at a step made to fail once."""
    if done.returncode == 0:
        return []
    if done.returncode != 1:
        return [f"exit {done.returncode}: {done.stderr[-500:]}"]
    problems = []
    for line in done.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        bad = event.get("event") in ("failed", "gave_up", "backoff", "damaged", "refused")
        text = _log_text(event)
        if bad and IN_DOUBT not in text and FLAKY not in text:
            problems.append(f"{event.get('event')} {event.get('run_id')}: {event.get('message')}")
    return problems or ([] if done.stdout.strip() else [f"no events: {done.stderr[-500:]}"])


def _log_text(event: dict[str, object]) -> str:
    """The event's message and the tail of the attempt log it names."""
    text = str(event.get("message", ""))
    log = event.get("log")
    if isinstance(log, str):
        with contextlib.suppress(OSError):
            text += Path(log).read_text(encoding="utf-8", errors="replace")[-4000:]
    return text


__all__ = ["FLAKY", "IN_DOUBT", "WATCH_ARGS", "Maintainer", "watch_once", "watch_problems"]
