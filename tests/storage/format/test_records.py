"""The one definitions records.py owns: the error record, the clock."""

from __future__ import annotations

import traceback
from typing import Any, cast

import pytest

from afk_local.errors import RunFailed
from afk_local.integrations.fanout import run_task
from afk_local.storage.format.records import ErrorInfo, error_info


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
