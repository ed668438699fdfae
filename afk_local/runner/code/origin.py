"""Where a job ran: the origin a durable run records, and what that allows another process.

A job defined in a script (``python my_job.py``: the function lives in ``__main__``)
cannot be imported by name. So every durable run records its *origin* in
``run.meta`` (``extra["origin"]``, docs/format.md): the interpreter, its prefix
(which virtualenv), the working directory, ``sys.path``, the script or the
``python -m`` module that was ``__main__``, and the script's arguments. To
continue the run elsewhere:

- the watcher starts the child (``python -m afk_local resume RUN``) with the
  recorded interpreter and working directory (:func:`reentry_plan`), and
  ``afk-local resume`` hands over to that interpreter when it is another one;
- in that process :mod:`afk_local.runner.operations.reentry` goes back to the recorded
  working directory and ``sys.path`` and, for a script job, runs the script again
  as ``__main__`` until the job is defined.

:func:`cannot_resume` says, without running anything, when no other process can
continue a run (its script is gone, it was defined in a notebook...), so the CLI
can say so in one line and the watcher can leave it alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from afk_local.storage.format.records import RunMeta

ORIGIN_KEY = "origin"
"""The key of the origin record in ``RunMeta.extra``."""

UNRESUMABLE_KEY = "unresumable"
"""The key in ``RunMeta.extra`` of why the last resume found the run's code gone (a str).

Written by a resume that could not find the job (a renamed function, a removed
module or script), cleared by the next attempt that starts. While it is there
:func:`cannot_resume` says it, so ``runs``, ``show`` and the watcher leave the run
alone; a person's ``afk-local resume`` tries again.
"""

IN_PROCESS_KEY = "in_process_only"
"""The key in ``RunMeta.extra`` of why only the code that started the run can continue it (a str).

Written when the run is created by code that knows no other process can rebuild
what it runs (a wrapped agent defined in a script, or started with arguments that
are not stored); unlike :data:`UNRESUMABLE_KEY` it stays for the run's life.
"""

REENTERED_ENV = "AFK_LOCAL_REENTERED"
"""Set in a process started under a run's recorded interpreter: it hands over no further."""

AFK_LOCAL_HOME = str(Path(__file__).resolve().parents[2])
"""The ``sys.path`` entry this afk_local is imported from."""


class Origin(msgspec.Struct, kw_only=True, frozen=True):
    """Where a job ran: enough to run it again in another process (``extra["origin"]``)."""

    python: str
    """``sys.executable`` of the process that ran the job."""
    prefix: str
    """``sys.prefix``: which installation or virtualenv the interpreter used."""
    cwd: str
    """The working directory (relative paths in the job resolve against it)."""
    sys_path: list[str] = []
    """``sys.path`` as absolute paths (where the job's imports were found)."""
    script: str | None = None
    """For a job defined in ``__main__``: the script file (absolute)."""
    module: str | None = None
    """For a job defined in ``__main__`` started with ``python -m``: the module's name."""
    argv: list[str] = []
    """The script's arguments (``sys.argv[1:]``), given to it again on re-entry."""
    afk_local: str | None = None
    """The ``sys.path`` entry afk_local was imported from (for the resuming child)."""


def origin_here(fn: Callable[..., Any]) -> dict[str, Any]:
    """The origin record of job function ``fn`` running in this process (``extra["origin"]``)."""
    cwd = os.getcwd()
    paths: list[str] = []
    for entry in sys.path:
        absolute = os.path.join(cwd, entry) if entry else cwd
        if absolute not in paths:
            paths.append(absolute)
    script = module = None
    argv: list[str] = []
    if getattr(fn, "__module__", None) == "__main__":
        main = sys.modules.get("__main__")
        main_file = getattr(main, "__file__", None)
        code_file = getattr(getattr(fn, "__code__", None), "co_filename", None)
        if (
            isinstance(main_file, str)
            and isinstance(code_file, str)
            and os.path.abspath(main_file) == os.path.abspath(code_file)
            and os.path.isfile(main_file)
        ):
            script = os.path.abspath(main_file)
            spec = getattr(main, "__spec__", None)
            name = getattr(spec, "name", None)
            if isinstance(name, str) and name != "__main__":
                module = name  # started as `python -m name`
            argv = [str(a) for a in sys.argv[1:]]
    origin = Origin(
        python=sys.executable,
        prefix=sys.prefix,
        cwd=cwd,
        sys_path=paths,
        script=script,
        module=module,
        argv=argv,
        afk_local=AFK_LOCAL_HOME,
    )
    return msgspec.to_builtins(origin)  # type: ignore[no-any-return]


def origin_of(meta: RunMeta) -> Origin | None:
    """The origin a run recorded (None: none, or not readable as one)."""
    raw = meta.extra.get(ORIGIN_KEY) if isinstance(meta.extra, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return msgspec.convert(raw, Origin)
    except msgspec.ValidationError:
        return None


def cannot_resume(meta: RunMeta, *, recorded: bool = True) -> str | None:
    """Why no other process can continue this run, when that is known without running it.

    None when a resume can be tried: a module job, or a script job whose script is
    there. Nothing is imported or executed to decide. With ``recorded`` (the default)
    the reason an earlier resume recorded (:data:`UNRESUMABLE_KEY`: the job's code was
    gone) counts too; a person resuming by hand passes False to try again.
    """
    marked = meta.extra.get(UNRESUMABLE_KEY) if isinstance(meta.extra, dict) else None
    if recorded and isinstance(marked, str) and marked:
        return marked
    in_process = meta.extra.get(IN_PROCESS_KEY) if isinstance(meta.extra, dict) else None
    if isinstance(in_process, str) and in_process:
        return in_process
    entrypoint = meta.entrypoint
    if entrypoint is None and meta.pause is not None and meta.pause.idle:
        prompt = meta.pause.prompt if isinstance(meta.pause.prompt, str) else ""
        return (
            "it is an idle thread (a LangGraph thread or a RunSession conversation): the "
            f"code that keeps it continues it{': ' + prompt if prompt else ''}"
        )
    if entrypoint is None:
        if meta.extra.get("subagent") and meta.parent_run_id:
            return (
                f"it is a subagent's run: its parent run {meta.parent_run_id!r} resumes it "
                f"(`afk-local resume {meta.parent_run_id}`)"
            )
        return (
            "it records no entrypoint (a StateCheckpoint loop, a LangGraph thread, a run "
            "written with store.create, or an agent built inside a function): only the code "
            "that writes it can continue it"
        )
    module, _, qualname = entrypoint.partition(":")
    if module != "__main__":
        if "<locals>" in qualname:
            return (
                f"{entrypoint} is defined inside a function, which no other process can "
                "reach: define the job at module level"
            )
        return None
    if meta.extra.get("kind") == "agent":
        return (
            "its agent was defined in a script run as __main__, which no other process can "
            "rebuild: run the script again with the same run id, or move the agent (or a "
            "function returning it) into an importable module"
        )
    origin = origin_of(meta)
    if origin is None or (origin.script is None and origin.module is None):
        return (
            "its job was defined in __main__ without a script file (a notebook, an "
            "interactive session, `python -c`, or a run made before afk_local recorded "
            "scripts): continue it where it was defined, with job.run(run_id=...)"
        )
    if origin.script is not None and not os.path.isfile(origin.script):
        return (
            f"its script {origin.script} no longer exists: put it back there (or restore it "
            "from version control), then resume the run"
        )
    return None


@dataclass(frozen=True)
class ReentryPlan:
    """How to start a process that continues a run (the watcher's child, a hand-over)."""

    python: str | None = None
    """The interpreter to run (the recorded one); None: the caller's own."""
    cwd: str | None = None
    """The working directory to start in; None: the caller's."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables to set (``PYTHONPATH`` so the interpreter finds afk_local)."""
    other_interpreter: bool = False
    """True when the recorded interpreter is another installation than this process's."""


def reentry_plan(meta: RunMeta, environ: dict[str, str] | None = None) -> ReentryPlan:
    """The interpreter, working directory and environment to continue ``meta``'s run with."""
    origin = origin_of(meta)
    if origin is None:
        return ReentryPlan()
    env = os.environ if environ is None else environ
    python = origin.python if os.path.isfile(origin.python) else None
    if python is not None and not os.access(python, os.X_OK):
        python = None
    extra_env: dict[str, str] = {}
    home = origin.afk_local
    if (
        python is not None
        and home
        and os.path.isdir(home)
        and Path(home).name not in ("site-packages", "dist-packages")
    ):
        current = env.get("PYTHONPATH", "")
        if home not in current.split(os.pathsep):
            extra_env["PYTHONPATH"] = os.pathsep.join(p for p in (home, current) if p)
    return ReentryPlan(
        python=python,
        cwd=origin.cwd if os.path.isdir(origin.cwd) else None,
        env=extra_env,
        other_interpreter=python is not None
        and os.path.realpath(origin.prefix) != os.path.realpath(sys.prefix),
    )


__all__ = [
    "AFK_LOCAL_HOME",
    "IN_PROCESS_KEY",
    "ORIGIN_KEY",
    "REENTERED_ENV",
    "UNRESUMABLE_KEY",
    "Origin",
    "ReentryPlan",
    "cannot_resume",
    "origin_here",
    "origin_of",
    "reentry_plan",
]
