"""The one definitions records.py owns: the error record, the clock."""

from __future__ import annotations

import re
import time
import traceback
from pathlib import Path
from typing import Any, cast

import pytest

import afk_local
from afk_local import clock
from afk_local.errors import RunFailed
from afk_local.integrations.fanout import run_task
from afk_local.storage.format import records
from afk_local.storage.format.records import ErrorInfo, error_info, later_ms, now_ms


def _raised() -> ValueError:
    try:
        raise ValueError("bad item")
    except ValueError as exc:
        return exc


def test_error_info_of_an_exception_keeps_type_message_and_traceback() -> None:
    exc = _raised()
    info = error_info(exc)
    assert (info.type, info.message) == ("ValueError", "bad item")
    assert info.traceback == "".join(traceback.format_exception(exc))
    assert "_raised" in (info.traceback or "")


def test_error_info_of_a_string_or_a_record() -> None:
    assert error_info("gave up") == ErrorInfo(type="Error", message="gave up")
    record = ErrorInfo(type="KeyError", message="'x'", traceback="tb")
    assert error_info(record) is record


class _BrokenSite:
    """A fan-out worker site whose store cannot be opened."""

    def __init__(self) -> None:
        self.error = ValueError("disk gone")

    def open(self) -> Any:
        raise self.error


def test_fanout_reports_the_same_record() -> None:
    site = _BrokenSite()
    with pytest.raises(RunFailed) as failed:
        run_task(cast(Any, None), cast(Any, site), "item", "run-1")
    info = error_info(site.error)
    assert (failed.value.error_type, failed.value.message, failed.value.traceback_text) == (
        info.type,
        info.message,
        info.traceback,
    )
    assert failed.value.error_type == "ValueError"


def test_now_ms_is_the_wall_clock_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    stamp = now_ms()
    assert before <= stamp <= time.time_ns() // 1_000_000
    assert later_ms(stamp + 10_000) == stamp + 10_001  # a stamp from a clock that ran ahead


_WALL_CLOCK = re.compile(r"\btime\.(time|time_ns)\b|\bdatetime\.(now|utcnow|today)\b")


def test_records_now_ms_is_the_only_reader_of_the_wall_clock() -> None:
    """Every stored stamp comes from one clock: a time-skipping test clock or a fix to
    it then reaches every record. Monotonic timers (durations) are not the clock."""
    package = Path(afk_local.__file__).parent
    readers = [
        f"{path.relative_to(package)}:{n}"
        for path in sorted(package.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _WALL_CLOCK.search(line.split("#", 1)[0])
    ]
    assert readers == ["clock.py:" + str(_line_of_wall_ns())]
    assert records.now_ms.__doc__ and "afk_local.clock" in records.now_ms.__doc__


def _line_of_wall_ns() -> int:
    source = Path(clock.__file__).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(source, 1) if "time.time_ns()" in line)


def test_records_are_stamped_by_the_installed_clock() -> None:
    from afk_local.testing import skipping_clock  # noqa: PLC0415

    with skipping_clock(start=1_000_000.0) as fake:
        assert now_ms() == 1_000_000_000
        fake.sleep(2.5)
        assert now_ms() == 1_000_002_500
    assert abs(now_ms() - time.time_ns() // 1_000_000) < 60_000
