"""Re-entering a job in a process started to continue its run (``afk-local resume``, the watcher).

:func:`enter_origin` makes the process look like the one that ran the job: the
recorded working directory, the recorded ``sys.path`` entries importable. For a
job defined in a script (``__main__``), :func:`run_main` runs the script again as
``__main__`` with its recorded arguments until its first durable run starts;
by then the job is defined and registered, and that call is stopped before it
does anything. :func:`afk_local.runner.operations.resume.load_job` is the one caller.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path

from afk_local.errors import EntrypointError
from afk_local.runner.code.origin import cannot_resume, origin_of
from afk_local.runner.run.durable_function import JobReached, stop_at_first_run
from afk_local.storage.format.records import RunMeta


def enter_origin(meta: RunMeta) -> None:
    """Make this process look like the one that ran the job: working directory, ``sys.path``.

    Only for processes started to continue one run (``afk-local resume``, the
    watcher's child): it changes the process's working directory.
    """
    origin = origin_of(meta)
    if origin is None:
        return
    with contextlib.suppress(OSError):
        os.chdir(origin.cwd)
    first = None
    if origin.script is not None and origin.module is None:
        first = os.path.dirname(origin.script)  # `python script.py` puts its directory first
    elif origin.module is not None:
        first = origin.cwd  # `python -m module` puts the working directory first
    if first is not None:
        with contextlib.suppress(ValueError):
            sys.path.remove(first)
        sys.path.insert(0, first)
    for entry in origin.sys_path:  # after this interpreter's own: its stdlib stays first
        if entry not in sys.path:
            sys.path.append(entry)


def run_main(meta: RunMeta) -> None:
    """Run the script (or ``python -m`` module) of a ``__main__`` job again, as ``__main__``.

    It runs with the recorded arguments until its first durable run starts, which is
    stopped there: by then the job is defined. Call :func:`enter_origin` first.

    Raises:
        EntrypointError: no script recorded, or the script failed or exited first.
    """
    origin = origin_of(meta)
    run_id, entrypoint = meta.run_id, meta.entrypoint
    if origin is None or (origin.script is None and origin.module is None):
        raise EntrypointError(run_id, entrypoint, cannot_resume(meta) or "no script recorded")
    where = origin.module if origin.module is not None else origin.script
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    try:
        if origin.module is not None:
            spec = importlib.util.find_spec(origin.module)
            if spec is None or spec.loader is None:
                raise ImportError(f"no module named {origin.module!r}")
            main.__spec__ = spec
            main.__file__ = spec.origin
            main.__package__ = spec.parent
            main.__loader__ = spec.loader
            code = spec.loader.get_code(origin.module)  # type: ignore[attr-defined]
        else:
            assert origin.script is not None
            main.__file__ = origin.script
            main.__spec__ = None
            source = Path(origin.script).read_bytes()
            code = compile(source, origin.script, "exec", dont_inherit=True)
    except (OSError, ImportError, SyntaxError, ValueError) as exc:
        raise EntrypointError(
            run_id, entrypoint, f"cannot load {where} to re-enter the job: {exc}"
        ) from exc
    sys.modules["__main__"] = main  # classes of the script are found as __main__:Name
    sys.argv = [origin.script or origin.module or "", *origin.argv]
    with stop_at_first_run():
        try:
            exec(code, main.__dict__)  # noqa: S102 - the job's own script, recorded by its run
        except JobReached:
            return
        except SystemExit as exc:
            raise EntrypointError(
                run_id,
                entrypoint,
                f"{where} exited (code {exc.code}) before it started a durable run; it "
                f"ran with the arguments {origin.argv}",
            ) from None
        except Exception as exc:
            raise EntrypointError(
                run_id,
                entrypoint,
                f"running {where} again to re-enter the job raised {type(exc).__name__}: {exc}",
            ) from exc


__all__ = ["enter_origin", "run_main"]
