"""What the page's forms do: settle, answer a pause, cancel, resume, restart or fork a run.

Each action calls the code the command line calls:
:func:`~afk_local.runner.operations.settle.settle`
(``afk-local settle``), :func:`~afk_local.runner.operations.settle.unsettle` (``afk-local settle
--undo``), :func:`~afk_local.watcher.requests.resume_request`
(``afk-local resume --via-watcher [--input JSON]``: the running watcher resumes the
run, an answer bound to the pause the page showed),
:func:`~afk_local.runner.operations.cancel.cancel` (``afk-local cancel``),
:func:`~afk_local.runner.operations.restart.restart_run` (``afk-local restart --no-start``: a
watcher starts the new run) and :meth:`~afk_local.Store.fork` (``afk-local fork
[--as NEW_ID] [--set PATH=JSON ...]``). An
action returns what the page says and which run it shows next; bad input raises
``ValueError`` and what the run's state refuses raises an
:class:`~afk_local.errors.AfkLocalError`, both shown as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from afk_local.errors import InvalidRunIdError
from afk_local.runner.code.origin import cannot_resume
from afk_local.runner.operations.cancel import cancel
from afk_local.runner.operations.restart import restart_run
from afk_local.runner.operations.settle import settle, unsettle
from afk_local.storage.format.layout import validate_run_id
from afk_local.storage.format.records import RunStatus
from afk_local.storage.ops.state_edit import parse_updates
from afk_local.storage.store import Store
from afk_local.ui.views import require_run
from afk_local.watcher.requests import resume_request

MAX_FIELD_CHARS = 1 << 20
"""The longest form value accepted (a result or an answer as JSON)."""


@dataclass(frozen=True)
class Done:
    """What an action did: the sentence the page shows, on the page of ``run_id``."""

    said: str
    run_id: str


def _json(field: str, text: str) -> Any:
    if len(text) > MAX_FIELD_CHARS:
        raise ValueError(f"{field} is over {MAX_FIELD_CHARS} characters")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'{field} must be JSON (e.g. null, 42, "text", {{"id": 7}}): {exc}'
        ) from None


def settle_effect(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``settle RUN KEY --done --result JSON`` or ``--failed MESSAGE`` from the effects form."""
    require_run(store, run_id)
    key = form.get("key", "")
    outcome = form.get("outcome", "")
    if outcome == "done":
        result = _json("the result", form.get("result", "").strip() or "null")
        settle(run_id, key, store=store, done=True, result=result)
        return Done(f"effect {key} settled as done; a resume replays its result", run_id)
    if outcome == "failed":
        message = (
            form.get("message", "").strip()[:2000] or "it did not happen (settled from the page)"
        )
        settle(run_id, key, store=store, done=False, message=message)
        return Done(f"effect {key} settled as failed; a resume calls it again", run_id)
    raise ValueError("choose what happened: done (it happened) or failed (it did not)")


def undo_settlement(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``settle RUN KEY --undo``: the effect is in doubt again, to be settled anew."""
    require_run(store, run_id)
    key = form.get("key", "")
    if not key:
        raise ValueError("the form names no effect; reload the page")
    unsettle(run_id, key, store=store)
    return Done(f"settlement of effect {key} undone: it is in doubt again", run_id)


def answer_pause(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``resume RUN --via-watcher --input JSON``, bound to the pause the page showed."""
    require_run(store, run_id)
    try:
        pause_seq = int(form.get("pause_seq", ""))
    except ValueError:
        raise ValueError("the form names no pause; reload the page") from None
    value = _json("the answer", form.get("answer", "").strip())
    resume_request(store, run_id, value, has_input=True, pause_seq=pause_seq)
    return Done(
        "answer handed to the watcher: it resumes the run with it "
        "(`afk-local watch` must be running for this store)",
        run_id,
    )


def resume_run(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``resume RUN --via-watcher``: the watcher continues an interrupted or failed run."""
    del form
    require_run(store, run_id)
    meta = store.read_meta(run_id)
    if meta.status is RunStatus.PAUSED:
        raise ValueError("the run waits for an answer: use the answer form")
    if meta.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise ValueError(f"the run is {meta.status.value}; there is nothing to resume")
    reason = cannot_resume(meta)
    if reason is not None:
        raise ValueError(f"the run cannot be resumed: {reason}")
    resume_request(store, run_id)
    return Done(
        "resume handed to the watcher (`afk-local watch` must be running for this store)", run_id
    )


def cancel_run(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``cancel RUN --reason TEXT``: the run becomes cancelled and is never resumed.

    It destroys the run's future, so the form must say so: ``confirm=yes`` (a checkbox).
    """
    require_run(store, run_id)
    if form.get("confirm") != "yes":
        raise ValueError("tick 'for good' to cancel: a cancelled run is never resumed")
    reason = form.get("reason", "").strip()[:2000] or "cancelled from the web page"
    cancel(run_id, store=store, reason=reason)
    return Done("run cancelled; nothing resumes it", run_id)


def restart(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``restart RUN --no-start``: a new run of the job with the same inputs, for a watcher."""
    del form
    require_run(store, run_id)
    new_id = restart_run(run_id, store=store)
    return Done(
        f"restarted from {run_id} as a new run (created): a running `afk-local watch` "
        f"starts it, or `afk-local resume {new_id}`",
        new_id,
    )


MAX_SETTINGS = 100
"""The most ``PATH=JSON`` lines one fork form may set."""


def fork(store: Store, run_id: str, form: Mapping[str, str]) -> Done:
    """``fork RUN --at SEQ [--as NEW_ID] [--set PATH=JSON ...]``: a new run from one checkpoint.

    The form's ``set`` field holds one ``PATH=JSON`` a line, read by the CLI's own rules
    (:func:`~afk_local.storage.ops.state_edit.parse_updates`); the state's paths are then
    checked on the checkpoint by :meth:`~afk_local.Store.fork`, before anything is created.
    """
    require_run(store, run_id)
    try:
        at_seq = int(form.get("seq", "").strip())
    except ValueError:
        raise ValueError("say which checkpoint to fork from (its seq, a number)") from None
    new_id = form.get("as", "").strip() or None
    if new_id is not None:
        try:
            validate_run_id(new_id)
        except InvalidRunIdError as exc:
            raise ValueError(f"the new run's id: {exc}") from None
    settings = [line for line in form.get("set", "").splitlines() if line.strip()]
    if len(settings) > MAX_SETTINGS:
        raise ValueError(f"at most {MAX_SETTINGS} values can be set in one fork")
    updates = parse_updates(settings)
    info = store.fork(run_id, at_seq, new_id, updates=updates or None)
    said = f"forked from {run_id} at checkpoint {at_seq}"
    if updates:
        said += f", with {', '.join(sorted(updates))} set in its state (checkpoint {info.seq})"
    reason = cannot_resume(store.read_meta(info.run_id))
    if reason is None:
        said += f"; continue it with `afk-local resume {info.run_id}`"
    else:
        said += f"; afk-local cannot resume it: {reason}"
    return Done(said, info.run_id)


Action = Callable[[Store, str, Mapping[str, str]], Done]
"""An action: the store, the run it acts on, the form; what it did."""

ACTIONS: dict[str, Action] = {
    "settle": settle_effect,
    "unsettle": undo_settlement,
    "answer": answer_pause,
    "resume": resume_run,
    "cancel": cancel_run,
    "restart": restart,
    "fork": fork,
}
"""The actions by the name in their URL (``POST /runs/RUN/<name>``)."""


__all__ = [
    "ACTIONS",
    "MAX_SETTINGS",
    "Action",
    "Done",
    "answer_pause",
    "cancel_run",
    "fork",
    "restart",
    "resume_run",
    "settle_effect",
    "undo_settlement",
]
