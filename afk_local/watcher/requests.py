"""Request files: how ``afk-local resume --via-watcher`` and ``afk-local submit`` reach the watcher.

A request is one small JSON file in ``<root>/requests/``, published by atomic
rename (:func:`afk_local.storage.fsio.atomic_write`), so the watcher never sees half a
request; temp files start with ``.`` and are ignored. The watcher handles a
request and deletes it. A request it cannot understand is moved to
``requests/rejected/`` next to a ``<name>.reason`` file saying why; it never
stops the watcher. Handling is idempotent, so two watchers reading the same
request do no harm (the run's lock decides who resumes it; a second submit of
the same run id finds the run already there).

An answer (a resume with input) names the pause it answers: ``pause_seq``, the
seq of the ``paused`` checkpoint the run waited at when the answer was given. The
watcher applies it only while the run still waits there and its child checks
again under the run's lock (``--pause-seq``), so a request that a killed watcher
left behind, or a second watcher read too, is applied at most once and never to
a later pause: once the run moved on, the request is moved to ``rejected/``.

Format (``kind`` decides the other fields; fields with their default value are
left out)::

    {"kind": "resume", "run_id": "RUN", "input": <JSON>, "has_input": true, "pause_seq": 7}
    {"kind": "submit", "run_id": "RUN", "entrypoint": "module:function",
     "args": [...], "kwargs": {...}}

In a keyed store the JSON is followed by a second line: the hex HMAC of the whole
first line (:meth:`~afk_local.storage.format.integrity.Signer.sign_document`), so any field,
including fields added later, is covered. The watcher acts only on request files
owned by its user, in a ``requests/`` directory nobody else can write, and — keyed —
carrying a valid MAC; a watcher without the key never acts on a keyed store.
A submit request only creates the run: the child that runs it resolves the
entrypoint through the trust gate and refuses anything but an ``@afk.durable``
function.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from afk_local.errors import AfkLocalError, RunExistsError
from afk_local.runner.code.entrypoints import is_entrypoint
from afk_local.runner.code.origin import cannot_resume
from afk_local.runner.run.answers import check_answer, waiting_at
from afk_local.storage import fsio
from afk_local.storage.format.layout import new_run_id, validate_run_id
from afk_local.storage.format.records import RunStatus, now_ms
from afk_local.storage.store import Store
from afk_local.storage.trust import request_file_problem
from afk_local.watcher.documents import open_document

MAX_REQUEST_BYTES = 1 << 20
REJECTED_DIR = "rejected"
REQUEST_TAG = "afk-local/request"
"""What a request's MAC is made for (a request's MAC never passes for another document's)."""


class Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One request file's content."""

    kind: str
    """``"resume"`` or ``"submit"``."""
    run_id: str
    entrypoint: str | None = None
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    input: Any = None
    has_input: bool = False
    created_ms: int = 0
    pause_seq: int = 0
    """For an answer: the seq of the paused checkpoint it answers (required with input)."""


def validate(request: Request) -> Request:
    """Raise ValueError naming what is wrong with ``request``."""
    try:
        validate_run_id(request.run_id)
    except AfkLocalError as exc:
        raise ValueError(str(exc)) from None
    if request.kind == "resume":
        if request.entrypoint is not None or request.args or request.kwargs:
            raise ValueError("a resume request takes no entrypoint, args or kwargs")
        if request.has_input and request.pause_seq < 1:
            raise ValueError(
                "an answer must name the pause it answers (pause_seq): write it with "
                "`afk-local resume RUN --via-watcher --input JSON`"
            )
        if not request.has_input and request.pause_seq:
            raise ValueError("pause_seq names the pause an input answers: give the input too")
    elif request.kind == "submit":
        if not is_entrypoint(request.entrypoint):
            raise ValueError(
                f"entrypoint {request.entrypoint!r} is not module:function (e.g. mypkg.jobs:crawl)"
            )
        if request.has_input:
            raise ValueError("a submit request takes no input")
    else:
        raise ValueError(f"unknown kind {request.kind!r}: use 'resume' or 'submit'")
    return request


def write_request(store: Store, request: Request) -> Path:
    """Publish ``request`` in ``<root>/requests/`` atomically; returns the file's path."""
    validate(request)
    fsio.make_dirs(store.requests_dir)
    if not request.created_ms:
        request = msgspec.structs.replace(request, created_ms=now_ms())
    name = f"{request.created_ms:013d}-{request.kind}-{secrets.token_hex(4)}.json"
    path = store.requests_dir / name
    body = msgspec.json.encode(request)
    signer = store.codec.signer
    fsio.atomic_write(path, body if signer is None else signer.sign_document(REQUEST_TAG, body))
    return path


def resume_request(
    store: Store,
    run_id: str,
    value: Any = None,
    *,
    has_input: bool = False,
    pause_seq: int | None = None,
) -> Path:
    """Ask the watcher to resume ``run_id`` (with ``value`` as the answer of a paused run).

    An answer is bound to the pause it answers: ``pause_seq``, by default the one the
    run waits at now.

    Raises:
        PauseMismatchError: ``has_input`` but the run waits at no pause (or not at ``pause_seq``).
    """
    seq = 0
    if has_input:
        meta = store.read_meta(run_id)
        seq = pause_seq if pause_seq is not None else (waiting_at(meta) or 0)
        check_answer(meta, seq)
    return write_request(
        store,
        Request(kind="resume", run_id=run_id, input=value, has_input=has_input, pause_seq=seq),
    )


def submit_request(
    store: Store,
    entrypoint: str,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
) -> tuple[str, Path]:
    """Ask the watcher to start ``entrypoint(*args, **kwargs)`` as a new run; returns its id."""
    rid = run_id or new_run_id()
    path = write_request(
        store,
        Request(
            kind="submit", run_id=rid, entrypoint=entrypoint, args=args or [], kwargs=kwargs or {}
        ),
    )
    return rid, path


def read_request(path: Path, store: Store | None = None) -> Request:
    """Read, check and validate one request file; ValueError saying why it is unusable.

    With ``store``: the file must be owned by this user in a ``requests/`` nobody else
    can write, and in a keyed store carry a valid MAC over its whole body.
    """
    try:
        fd = fsio.open_regular(path)  # a symlink, FIFO or device is refused, unblocked
    except OSError as exc:
        raise ValueError(f"cannot read: {exc.strerror or exc}") from None
    try:
        problem = None if store is None else request_file_problem(store, path, fd)
        if problem is not None:
            raise ValueError(f"untrusted: {problem}")
        size = os.fstat(fd).st_size
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"too large: {size} bytes, over the bound of {MAX_REQUEST_BYTES}")
        data = os.read(fd, MAX_REQUEST_BYTES + 1)
    finally:
        os.close(fd)
    signer = None if store is None else store.codec.signer
    request = open_document(data, signer, REQUEST_TAG, Request, "request")
    return validate(request)


def reject(store: Store, path: Path, reason: str) -> Path | None:
    """Move a bad request to ``requests/rejected/`` with ``<name>.reason``; None if it vanished."""
    rejected = store.requests_dir / REJECTED_DIR
    fsio.make_dir(rejected, exist_ok=True)
    target = rejected / path.name
    try:
        fsio.rename(path, target)  # another directory of the same store: one rename
    except FileNotFoundError:
        return None  # another watcher handled it
    fsio.fsync_dir(rejected)
    fsio.atomic_write(
        rejected / f"{path.name}.reason", (reason.rstrip() + "\n").encode("utf-8", "replace")
    )
    return target


def pending_requests(store: Store) -> list[Path]:
    """Request files waiting in ``requests/``, oldest first (temp files and dirs skipped)."""
    try:
        with os.scandir(store.requests_dir) as entries:
            names = [
                e.name
                for e in entries
                if not e.name.startswith(".") and not e.is_dir(follow_symlinks=False)
            ]
    except FileNotFoundError:
        return []
    return [store.requests_dir / name for name in sorted(names)]


class RequestHost(Protocol):
    """What handling a request needs of the :class:`~afk_local.watcher.watcher.Watcher`."""

    @property
    def store(self) -> Store:
        """The store the requests belong to."""

    @property
    def stop_event(self) -> threading.Event:
        """Set when the watcher is stopping."""

    @property
    def pending(self) -> deque[str]:
        """Run ids waiting for a free slot."""

    @property
    def children(self) -> Mapping[str, object]:
        """The runs being resumed right now, by run id."""

    @property
    def concurrency(self) -> int:
        """How many runs may be resumed at once."""

    def emit(self, kind: str, run_id: str | None = None, message: str = "", /) -> None:
        """Report an event."""

    def start(
        self,
        run_id: str,
        *,
        manual: bool = False,
        input_json: str | None = None,
        pause_seq: int | None = None,
    ) -> bool:
        """Start a child resuming ``run_id`` (answering the pause at ``pause_seq``)."""


def process_requests(watcher: RequestHost) -> None:
    """Handle every pending request; bad ones are rejected, none stops the watcher."""
    store = watcher.store
    for path in pending_requests(store):
        if watcher.stop_event.is_set():
            return
        try:
            request = read_request(path, store)
        except ValueError as exc:
            if os.path.lexists(path):
                _reject(watcher, path, str(exc), None)
            continue
        try:
            done = _handle(watcher, request)
        except (AfkLocalError, ValueError, TypeError, OSError) as exc:
            _reject(watcher, path, f"{type(exc).__name__}: {exc}", request.run_id)
            continue
        if done:
            fsio.unlink(path)


def _reject(watcher: RequestHost, path: Path, reason: str, run_id: str | None) -> None:
    try:
        reject(watcher.store, path, reason)
    except OSError as exc:  # requests/rejected is in the way (a file, a symlink): leave it be
        reason = f"{reason} (not moved to {REJECTED_DIR}/: {exc})"
        with contextlib.suppress(OSError):
            fsio.unlink(path)
    watcher.emit("rejected", run_id, f"{path.name}: {reason}")


def _handle(watcher: RequestHost, request: Request) -> bool:
    """Act on one request; False to keep it for later (no room under the concurrency limit)."""
    store = watcher.store
    if request.kind == "submit":
        assert request.entrypoint is not None
        try:
            writer = store.create(
                request.run_id,
                entrypoint=request.entrypoint,
                params={"args": list(request.args), "kwargs": dict(request.kwargs)},
                new_attempt=False,  # the child this watcher starts makes attempt 1
            )
        except RunExistsError:
            return True  # submitted already (by this request, read by another watcher)
        writer.close()  # status "created", lock free: resumed like any interrupted run
        watcher.emit("submitted", request.run_id, request.entrypoint)
        if request.run_id not in watcher.pending:
            watcher.pending.append(request.run_id)
        return True
    meta = store.read_meta(request.run_id)  # RunNotFoundError: rejected with the reason
    pause_seq = request.pause_seq if request.has_input else None
    check_answer(meta, pause_seq)  # a stale answer: applied already, or the run moved on
    if meta.status is RunStatus.COMPLETED:
        watcher.emit("request", request.run_id, "already completed; nothing to do")
        return True
    reason = cannot_resume(meta, recorded=False)  # a person asks: a recorded reason is retried
    if reason is not None:
        raise ValueError(f"run {request.run_id!r} cannot be resumed: {reason}")
    if request.run_id in watcher.children:
        watcher.emit("request", request.run_id, "already being resumed")
        return True
    if len(watcher.children) >= watcher.concurrency:
        return False
    input_json = json.dumps(request.input) if request.has_input else None
    if not watcher.start(request.run_id, manual=True, input_json=input_json, pause_seq=pause_seq):
        with contextlib.suppress(AfkLocalError):
            if store.owner_alive(request.run_id):
                watcher.emit("taken", request.run_id, "its owner is alive; left alone")
    return True
