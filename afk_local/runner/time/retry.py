"""Retry policies for journaled steps: :class:`Retry` (``ctx.step(..., retry=afk.Retry(...))``).

Each attempt of a retried step is one intent/outcome pair under the step's key in
the effect journal (failed ones carry their error); the wait between two attempts
is a durable sleep (:mod:`afk_local.runner.time.sleeps`) under the key
``<step key>@retry<n>``, so a kill during a backoff resumes only the rest of it.

The delays are exponential with a cap and optional jitter; for any other shape,
``wait=`` takes a tenacity wait strategy (extra ``afk_local[retry]``), so the
policy pieces people already use carry over.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from afk_local.errors import EffectInDoubtError
from afk_local.journal.journal import Journal
from afk_local.journal.replay import idempotency_key
from afk_local.journal.replaying import RETRY_MARK

R = TypeVar("R")


@dataclass(frozen=True)
class Retry:
    """How often a failing step is tried and how long to wait in between.

    Args:
        attempts: tries in all (the first included); past them the last error is raised.
        initial: seconds before the 2nd try.
        backoff: each further wait is this many times the previous one.
        max_delay: the longest wait between two tries.
        jitter: up to this fraction of a wait is added at random (0.1: +0..10%).
        on: the exception types that are retried; any other is raised at once.
        wait: a tenacity wait strategy (``tenacity.wait_random_exponential(max=60)``)
            used instead of ``initial``/``backoff``/``max_delay``/``jitter``.

    Example:
        >>> policy = afk.Retry(5, initial=2, on=(IOError,))  # doctest: +SKIP
        >>> ctx.step("fetch", fetch, url, retry=policy)  # doctest: +SKIP
    """

    attempts: int = 3
    initial: float = 1.0
    backoff: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.0
    on: tuple[type[BaseException], ...] = (Exception,)
    wait: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry.attempts must be an int >= 1, not {self.attempts!r}")
        for name in ("initial", "backoff", "max_delay", "jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"Retry.{name} must be >= 0, not {getattr(self, name)!r}")
        on = self.on if isinstance(self.on, tuple) else (self.on,)
        if not on or not all(isinstance(t, type) and issubclass(t, BaseException) for t in on):
            raise TypeError(f"Retry.on must be exception types, not {self.on!r}")
        object.__setattr__(self, "on", on)

    def retries(self, error: BaseException) -> bool:
        """True when ``error`` is one this policy retries."""
        return isinstance(error, Exception) and isinstance(error, self.on)

    def delay(self, failed: int, error: BaseException | None = None) -> float:
        """Seconds to wait after the ``failed``-th failed try (1 for the first)."""
        if self.wait is not None:
            return _tenacity_delay(self.wait, failed, error)
        base = min(self.initial * self.backoff ** max(failed - 1, 0), self.max_delay)
        return base + base * self.jitter * random.random()


def _tenacity_delay(wait: Any, failed: int, error: BaseException | None) -> float:
    try:
        import tenacity  # noqa: PLC0415 - an extra, needed only with Retry(wait=...)
    except ImportError:
        raise ImportError(
            "Retry(wait=...) takes a tenacity wait strategy: pip install 'afk_local[retry]'"
        ) from None
    state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = failed
    if error is not None:
        state.outcome = tenacity.Future.construct(failed, error, True)
    return float(wait(state))


Wait = Callable[[str, float], None]
"""Durably sleeps ``seconds`` under a key (the backoff between two tries)."""


def call_with_retry(
    journal: Journal, key: str, retry: Retry, attempt: Callable[[], R], wait: Wait
) -> R:
    """Run ``attempt()`` (one journaled try of step ``key``) until it succeeds or gives up.

    Every started try counts against ``retry.attempts``, a try left in doubt by a kill
    included: a resume continues the same round, first waiting the rest of the backoff
    owed, and a round whose last try is in doubt raises :class:`EffectInDoubtError`
    rather than starting more tries. A round that ran out (the run failed with its last
    error) starts over when the run is restarted.
    """
    error: BaseException | None = None
    while True:
        tries, in_doubt = _started_tries(journal, key)
        if in_doubt and tries % retry.attempts == 0:
            raise EffectInDoubtError(
                journal.run_id, key, idempotency_key(journal.run_id, key), str(journal.path)
            )
        if tries % retry.attempts:  # a backoff is owed before the next try of this round
            wait(f"{key}{RETRY_MARK}{tries}", retry.delay(tries % retry.attempts, error))
        try:
            return attempt()
        except Exception as exc:
            now_tries, _ = _started_tries(journal, key)
            if now_tries == tries:  # no try was started (in doubt, mismatch): no retry
                raise
            if not retry.retries(exc) or now_tries % retry.attempts == 0:
                raise
            error = exc


def _started_tries(journal: Journal, key: str) -> tuple[int, bool]:
    """How many tries of ``key`` were started (0 once one succeeded), and is the newest in doubt."""
    state = journal.lookup(key)
    if state is None or state.status == "ok":
        return 0, False
    return state.attempts, state.in_doubt


__all__ = ["Retry", "Wait", "call_with_retry"]
