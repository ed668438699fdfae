"""Answers to pauses: an answer may name the pause it is for, and then answers no other.

A run pauses at a ``paused`` checkpoint whose seq ``run.meta`` records
(``RunMeta.pause.seq``). An answer bound to that seq (``afk.resume(run_id,
input=..., pause_seq=N)``, ``afk-local resume RUN --input JSON --pause-seq N``,
every answer the watcher delivers) is applied only while the run still waits
there, checked again under the run's lock; otherwise it raises
:class:`~afk_local.errors.PauseMismatchError` and changes nothing. So an answer
delivered twice (a watcher that died before removing its request) is applied
once, and an answer given for one approval never approves the next.
"""

from __future__ import annotations

from afk_local.errors import PauseMismatchError
from afk_local.storage.format.records import RunMeta, RunStatus


def waiting_at(meta: RunMeta) -> int | None:
    """The seq of the paused checkpoint the run waits at, or None when it is not paused."""
    if meta.status is not RunStatus.PAUSED or meta.pause is None or not meta.pause.seq:
        return None
    return meta.pause.seq


def check_answer(meta: RunMeta, pause_seq: int | None) -> None:
    """Raise :class:`PauseMismatchError` unless the run waits at ``pause_seq`` (None: unbound)."""
    if pause_seq is None:
        return
    at = waiting_at(meta)
    if at == pause_seq:
        return
    now = f"paused at checkpoint {at}" if at is not None else str(meta.status)
    raise PauseMismatchError(meta.run_id, pause_seq, now)


__all__ = ["check_answer", "waiting_at"]
