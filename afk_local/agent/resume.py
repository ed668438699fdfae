"""``afk.resume``: continue any run by its id, whatever made it.

A run made by an ``@afk.durable`` function is continued by
:func:`afk_local.runner.operations.resume.resume_job` (the function is found by its
entrypoint and called again from the top); a run made by an
:class:`~afk_local.AgentRunner` by :func:`afk_local.agent.rebuild.resume_agent`
(the ``Agent`` is rebuilt from the run's entrypoint). This module only chooses.

Example:
    >>> import afk_local as afk
    >>> @afk.durable(store="/tmp/afk-doc-runner")
    ... def total(ctx, numbers):
    ...     ctx.state.setdefault("sum", 0)
    ...     for n in ctx.iterate(numbers, progress=False):
    ...         ctx.state["sum"] += ctx.step("square", lambda x: x * x, n)
    ...     return ctx.state["sum"]
    >>> total.run([1, 2, 3])
    14
"""

from __future__ import annotations

import asyncio
from typing import Any

from afk_local.agent.rebuild import is_agent_run, resume_agent, resume_agent_run
from afk_local.errors import EntrypointError
from afk_local.runner.operations.resume import aresume_job, record_unresumable, resume_job
from afk_local.storage.store import StoreLike, as_store


def resume(
    run_id: str,
    *,
    store: StoreLike = None,
    input: Any = None,
    in_doubt: Any = None,
    pause_seq: int | None = None,
) -> Any:
    """Continue run ``run_id``: re-import its job and run it (see :meth:`DurableFunction.run`).

    Agent runs (:func:`~afk_local.agent.rebuild.is_agent_run`) are continued by
    :func:`~afk_local.agent.rebuild.resume_agent`, which rebuilds the ``Agent`` from the
    run's entrypoint and returns the :class:`~afk_local.AgentResult` (completed,
    failed or paused: it does not raise for those).

    Args:
        store: the run's store (default ``$AFK_LOCAL_ROOT`` else ``./.afk``).
        input: for a paused run, the value its ``ctx.pause`` returns; a paused run
            given no input raises :class:`~afk_local.RunPaused` and changes nothing.
        in_doubt: policy for steps a crash left in doubt (``"retry"`` once you checked).
        pause_seq: the seq of the paused checkpoint ``input`` answers (``RunMeta.pause.seq``).
            Given, the answer is applied only while the run still waits there (checked
            under the run's lock), else :class:`~afk_local.PauseMismatchError` and
            nothing changes: an answer sent twice is applied once, and never to a later
            pause.
    """
    the_store = as_store(store)
    options = {"input": input, "in_doubt": in_doubt, "pause_seq": pause_seq}
    if is_agent_run(the_store.read_meta(run_id)):
        return resume_agent(run_id, store=the_store, **options)
    return resume_job(the_store, run_id, **options)


async def aresume(
    run_id: str,
    *,
    store: StoreLike = None,
    input: Any = None,
    in_doubt: Any = None,
    pause_seq: int | None = None,
) -> Any:
    """The async form of :func:`resume` (an agent run is resumed in a worker thread)."""
    the_store = as_store(store)
    options = {"input": input, "in_doubt": in_doubt, "pause_seq": pause_seq}
    if is_agent_run(the_store.read_meta(run_id)):
        return await asyncio.to_thread(resume_agent, run_id, store=the_store, **options)
    return await aresume_job(the_store, run_id, **options)


def resume_run(
    run_id: str,
    store: StoreLike = None,
    input: Any = None,
    *,
    in_doubt: Any = None,
    reenter: bool = False,
    pause_seq: int | None = None,
) -> Any:
    """What ``afk-local resume RUN`` calls: :func:`resume` in the command line's terms.

    Dispatches on the run's kind. A durable job's run returns its result (or
    raises what the job raised, or :class:`~afk_local.RunPaused`); an agent run
    goes to :func:`afk_local.agent.rebuild.resume_agent_run`, which speaks the same
    terms: the final text, ``RunPaused``, or ``AgentFailedError`` for a failed run.
    ``reenter``: this process was started to continue this run, so it may go back
    to the job's recorded working directory, ``sys.path`` and script
    (:func:`afk_local.runner.operations.resume.load_job`).
    """
    the_store = as_store(store)
    if is_agent_run(the_store.read_meta(run_id)):
        try:
            return resume_agent_run(
                run_id, the_store, input, in_doubt=in_doubt, pause_seq=pause_seq
            )
        except EntrypointError as exc:
            if reenter and exc.gone:  # its agent's module or name is gone: retry no more
                record_unresumable(the_store, run_id, exc.reason)
            raise
    return resume_job(
        the_store, run_id, input=input, in_doubt=in_doubt, reenter=reenter, pause_seq=pause_seq
    )


__all__ = ["aresume", "resume", "resume_run"]
