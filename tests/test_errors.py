"""Every error class lives in ``afk_local.errors`` and survives pickle with its fields.

Dask, Ray and the watcher carry exceptions between processes, so each one must
come back as the same type, with the same message and the same fields. The classes
are found, not listed: a child process imports every module of the package and
walks ``AfkLocalError.__subclasses__()``, so an error class added anywhere is
checked (a child, because importing every integration here would load Dask, Ray and
OpenTelemetry into this test process).
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from proc import REPO, run

import afk_local
import afk_local.errors as errors
from afk_local.errors import AfkLocalError
from afk_local.journal.replay import ReplayedError, replayed_error
from afk_local.storage.format.records import ErrorInfo

_DISCOVER = """
import importlib, json, pkgutil, sys
import afk_local, afk_local.errors
from afk_local.errors import AfkLocalError

skipped = []
for info in pkgutil.walk_packages(afk_local.__path__, "afk_local.", onerror=skipped.append):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # an extra that is not installed here
        if (exc.name or "").startswith("afk_local"):
            raise
        skipped.append(info.name)

def walk(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from walk(sub)

found = {
    f"{cls.__module__}:{cls.__qualname__}": getattr(afk_local.errors, cls.__name__, None) is cls
    for cls in walk(AfkLocalError)
    if cls.__module__.startswith("afk_local")
}
print(json.dumps({"found": found, "skipped": skipped, "modules": len(sys.modules)}))
"""


def _walk(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _walk(sub)


def _error_classes() -> list[type[BaseException]]:
    """Every exception class ``afk_local.errors`` holds, and every AfkLocalError subclass."""
    held = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, BaseException)
    ]
    walked = [c for c in _walk(AfkLocalError) if c.__module__.startswith("afk_local")]
    return sorted(set(held) | set(walked), key=lambda c: c.__name__)


# A sample for each parameter annotation the constructors use; a new annotation
# fails the test below with its name, asking for a sample here.
_SAMPLES: dict[Any, Any] = {
    int: 7,
    float: 2.5,
    bool: True,
    BaseException: ValueError("boom"),
    dict[str, str]: {"r1": "ValueError: bad item"},
    list[str]: ["a message differs", "a tool is new"],
    Any: {"question": ["a", 1]},
}


def _sample(name: str, annotation: Any) -> Any:
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    if annotation in (str, object) or str in options:
        return f"{name}-value"  # distinct per parameter, so swapped fields would show
    if annotation in _SAMPLES:
        return _SAMPLES[annotation]
    for option in options:
        if option in _SAMPLES:
            return _SAMPLES[option]
    raise AssertionError(f"no sample for a parameter {name}: {annotation!r}; add one")


def _instance(cls: type[BaseException]) -> BaseException:
    """``cls`` built from sample arguments, one per parameter of its ``__init__``."""
    init = cls.__init__
    hints = typing.get_type_hints(init)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for param in list(inspect.signature(init).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):  # Exception's own (*args)
            args.append("the message")
            continue
        value = _sample(param.name, hints.get(param.name, str))
        if param.kind is param.KEYWORD_ONLY:
            kwargs[param.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def _fields(error: BaseException) -> dict[str, Any]:
    return {k: v for k, v in vars(error).items() if not k.startswith("_")}


@pytest.mark.fresh_interpreter  # the classes a fresh interpreter finds
def test_every_error_class_is_defined_in_or_reachable_from_afk_local_errors() -> None:
    child = run(_DISCOVER, env={"PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])})
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.splitlines()[-1])
    found: dict[str, bool] = report["found"]
    assert report["modules"] > 100, report  # the walk did import the package
    outside = sorted(name for name, reachable in found.items() if not reachable)
    assert outside == [], f"define these in afk_local/errors.py (or re-export them): {outside}"
    here = {f"{c.__module__}:{c.__qualname__}" for c in _error_classes()}
    assert set(found) <= here


def test_every_exported_error_is_checked_here() -> None:
    exported = [
        value
        for value in (getattr(afk_local, name) for name in afk_local.__all__)
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and not issubclass(value, Warning)  # CodeChangedWarning: a plain UserWarning
    ]
    assert exported
    unchecked = set(exported) - set(_error_classes()) - {ReplayedError}
    assert unchecked == set()


@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_error_round_trips_through_pickle(cls: type[BaseException], protocol: int) -> None:
    error = _instance(cls)
    error.add_note("a note added on the way")
    back = pickle.loads(pickle.dumps(error, protocol=protocol))
    assert type(back) is cls
    assert str(back) == str(error)
    assert back.args == error.args
    assert _fields(back) == _fields(error)
    assert back.__notes__ == ["a note added on the way"]
    if isinstance(error, OSError):  # errno, strerror and filename are slots, not fields
        assert isinstance(back, OSError)
        assert (back.errno, back.strerror, back.filename) == (
            error.errno,
            error.strerror,
            error.filename,
        )


def test_replayed_error_round_trips_through_pickle() -> None:
    info = ErrorInfo(type="KeyError", message="'missing'", traceback="Traceback ...")
    error = replayed_error(info, "fetch:1")
    back = pickle.loads(pickle.dumps(error))
    assert type(back).__name__ == "KeyError"
    assert isinstance(back, ReplayedError)
    assert isinstance(back, KeyError)  # ``except KeyError`` still catches it
    assert str(back) == str(error)
    assert (back.info, back.key) == (info, "fetch:1")
