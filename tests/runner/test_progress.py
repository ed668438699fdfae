"""The progress display of ctx.iterate picks what suits where its output goes."""

from __future__ import annotations

import io
import sys
import types
import warnings

import pytest

from afk_local.runner.observe import progress as progress_module
from afk_local.runner.observe.progress import Progress, in_notebook


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(bar: Progress, items: int) -> None:
    for _ in range(items):
        bar.update()
    bar.close()


def test_a_log_gets_plain_lines_never_a_carriage_return() -> None:
    log = io.StringIO()
    bar = Progress(10, 4, desc="iterate#1", file=log)
    assert bar.kind == "lines"
    drive(bar, 6)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("iterate#1: 4/10 (40%)")
    assert lines[-1].startswith("iterate#1: 10/10 (100%)")


def test_plain_lines_are_periodic(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    bar = Progress(100, file=log)
    for _ in range(50):  # within one interval: no line per item
        clock[0] += 0.01
        bar.update()
    assert len(log.getvalue().splitlines()) == 1
    clock[0] += progress_module.LOG_INTERVAL_S
    bar.update()
    assert len(log.getvalue().splitlines()) == 2


def test_the_rate_counts_only_this_attempts_items(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [50.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    bar = Progress(1000, 900, file=io.StringIO())  # 900 done by an earlier attempt
    clock[0] += 10.0
    for _ in range(20):
        bar.update()
    assert "2.0 it/s" in bar.text()  # 20 items in 10 s, not 920
    assert "ETA 40s" in bar.text()


def test_a_terminal_gets_tqdm_when_installed() -> None:
    pytest.importorskip("tqdm")
    screen = Terminal()
    bar = Progress(5, 2, desc="loop", file=screen)
    assert bar.kind == "tqdm"
    drive(bar, 3)
    assert "5/5" in screen.getvalue()


def test_a_terminal_without_tqdm_gets_rich_or_an_inline_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.std", None)
    screen = Terminal()
    bar = Progress(5, desc="loop", file=screen)
    assert bar.kind == ("rich" if _importable("rich") else "inline")
    drive(bar, 5)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    screen = Terminal()
    bar = Progress(5, desc="loop", file=screen)
    assert bar.kind == "inline"
    drive(bar, 5)
    assert screen.getvalue().startswith("\rloop: 0/5") and screen.getvalue().endswith("\n")


def on_screen(written: str) -> str:
    """What a terminal shows of one line after ``written``: each ``\r`` writes from column 0."""
    shown = ""
    for part in written.rstrip("\n").split("\r"):
        shown = part + shown[len(part) :]
    return shown


def test_the_inline_line_blanks_what_a_longer_previous_line_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.std", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    screen = Terminal()
    bar = Progress(5, desc="loop", file=screen)
    assert bar.kind == "inline"
    for _ in range(4):
        clock[0] += 1.0
        bar.update()
    longer = bar.text()
    assert "ETA" in longer  # 4/5 with an ETA; the last line has none and is shorter
    clock[0] += 1.0
    bar.update()
    bar.close()

    last = bar.text()
    assert len(last) < len(longer)
    assert on_screen(screen.getvalue()).rstrip() == last


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def fake_jupyter(monkeypatch: pytest.MonkeyPatch) -> None:
    class ZMQInteractiveShell:
        pass

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)


def test_a_notebook_without_ipywidgets_gets_plain_text_and_no_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("tqdm")  # installed: it must still not be used (nor warn)
    fake_jupyter(monkeypatch)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed
    assert in_notebook()
    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bar = Progress(3, desc="cell", file=out)
        drive(bar, 3)
    assert bar.kind == "lines"
    assert "\r" not in out.getvalue() and "cell: 3/3 (100%)" in out.getvalue()


def test_outside_jupyter_there_is_no_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert not in_notebook()
    disabled = Progress(3, enabled=False, file=io.StringIO())
    drive(disabled, 3)
    assert disabled.kind == "none"
