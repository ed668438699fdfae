"""``PATH=JSON`` settings (``fork --set``, the page's fork form) and applying them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from afk_local.errors import StateEditError
from afk_local.storage.ops.state_edit import apply_updates, parse_updates

PATHS = st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z0-9_]{1,8}){0,3}", fullmatch=True)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(st.dictionaries(PATHS, VALUES, max_size=5))
def test_settings_written_as_path_equals_json_read_back(updates: dict[str, object]) -> None:
    lines = [f"{path}={json.dumps(value)}" for path, value in updates.items()]
    assert parse_updates(lines) == updates


def test_spaces_around_the_path_are_ignored_and_the_last_setting_wins() -> None:
    assert parse_updates([" state.total = 1", "state.total=2 "]) == {"state.total": 2}
    assert parse_updates(['state.eq="a=b"']) == {"state.eq": "a=b"}


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("state.total", "expected PATH=JSON"),
        ("=1", "expected PATH=JSON"),
        ("  =1", "expected PATH=JSON"),
        ("state.name=x", "the value of state.name is not JSON"),
        ("state.total=", "the value of state.total is not JSON"),
    ],
)
def test_a_bad_setting_says_what_is_wrong(setting: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_updates([setting])


def test_apply_updates_sets_paths_and_refuses_a_missing_parent() -> None:
    payload = {"state": {"total": 1, "items": [1, 2]}}
    edited = apply_updates(payload, {"state.total": 5, "state.items.1": 9, "state.new": 0}, "r")
    assert edited == {"state": {"total": 5, "items": [1, 9], "new": 0}}
    assert payload == {"state": {"total": 1, "items": [1, 2]}}  # a copy, never in place
    with pytest.raises(StateEditError, match=r"no 'nope' in payload\.state"):
        apply_updates(payload, {"state.nope.x": 1}, "r")
