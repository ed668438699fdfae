"""pandas DataFrames and Arrow tables round-trip as typed values: dtypes, index and names kept.

In process (state, results, StateCheckpoint, hypothesis), and across processes: a
frame written by one child is read by another.
"""

from __future__ import annotations

import datetime as dt
import os
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import proc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import afk_local as afk
from afk_local.errors import UnstorableValueError
from afk_local.storage.format import values


@pytest.fixture(autouse=True)
def _needs_pandas() -> None:
    """The tests need pandas and numpy: imported as they run, not as every worker collects
    the module."""
    pytest.importorskip("pandas")
    pytest.importorskip("numpy")


class Celsius:
    """A type afk_local does not store itself: StateCheckpoint's hooks do."""

    def __init__(self, degrees: float) -> None:
        self.degrees = degrees


def round_trip(value: Any) -> Any:
    data = msgspec.msgpack.encode(values.tag(value))
    return msgspec.msgpack.decode(data, ext_hook=values.ext_decoder())


def sample_frame() -> Any:
    import numpy as np  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415

    frame = pd.DataFrame(
        {
            "count": np.array([1, 2, 3], dtype="int64"),
            "small": np.array([1, 2, 3], dtype="int8"),
            "score": [0.5, float("nan"), 2.25],
            "name": pd.array(["ada", None, "alan"], dtype="string"),
            "label": ["x", "y", "z"],
            "when": pd.to_datetime(["2024-01-02 03:04:05", "2024-02-03 00:00:00", None]),
            "zoned": pd.to_datetime(
                ["2024-01-01 10:00:00", "2024-06-01 12:00:00", None]
            ).tz_localize("Europe/Paris"),
            "took": pd.to_timedelta([1.5, 2, 3], unit="s"),
            "kind": pd.Categorical(["b", "a", "b"], categories=["b", "a"], ordered=True),
            "maybe": pd.array([1, None, 3], dtype="Int64"),
            "flag": pd.array([True, None, False], dtype="boolean"),
            "mixed": pd.Series(["s", 7, dt.date(2020, 1, 1)], dtype=object),
        },
        index=pd.Index([10, 20, 30], name="row"),
    )
    frame.columns.name = "field"
    return frame


def assert_same(got: Any, want: Any) -> None:
    import pandas as pd  # noqa: PLC0415

    pd.testing.assert_frame_equal(
        got, want, check_exact=True, check_index_type=True, check_column_type=True
    )
    assert got.index.name == want.index.name and got.columns.name == want.columns.name


def test_a_frame_keeps_its_dtypes_index_and_names() -> None:
    frame = sample_frame()
    got = round_trip({"df": frame})["df"]
    assert_same(got, frame)
    assert got.dtypes.to_dict() == frame.dtypes.to_dict()


def test_series_indexes_and_odd_shapes() -> None:
    import pandas as pd  # noqa: PLC0415

    multi = pd.MultiIndex.from_tuples([("a", 1), ("b", 2)], names=["key", "n"])
    series = pd.Series([1.0, 2.0], index=multi, name="total")
    pd.testing.assert_series_equal(round_trip(series), series)
    index = pd.DatetimeIndex(["2024-01-01", "2024-01-02"], name="day")
    pd.testing.assert_index_equal(round_trip(index), index, exact=True)
    for frame in (
        pd.DataFrame(),
        pd.DataFrame({"a": []}),
        pd.DataFrame([[1, 2]], columns=["same", "same"]),
        pd.DataFrame({1: [1], 2: [2]}, index=pd.RangeIndex(5, 6, name="r")),
        pd.DataFrame({("a", "x"): [1], ("a", "y"): [2]}),
    ):
        pd.testing.assert_frame_equal(round_trip(frame), frame, check_exact=True)


def test_a_frame_is_a_step_argument_and_result_with_a_stable_input_hash(tmp_path: Path) -> None:
    import pandas as pd  # noqa: PLC0415

    frame = sample_frame()
    assert afk.input_hash("f", (frame,), {}) == afk.input_hash("f", (frame.copy(),), {})
    assert afk.input_hash("f", (frame,), {}) != afk.input_hash("f", (frame.head(2),), {})
    calls: list[int] = []

    def total(df: Any) -> Any:
        calls.append(1)
        return df[["count"]] * 2

    @afk.durable(store=tmp_path)
    def job(ctx: afk.RunContext) -> Any:
        ctx.state["df"] = frame
        return ctx.step("total", total, frame)

    first = job.run(run_id="r")
    again = job.run(run_id="r")  # the stored result, replayed
    pd.testing.assert_frame_equal(again, first)
    assert calls == [1]
    state = afk.Store(tmp_path).open("r").resume_state()
    pd.testing.assert_frame_equal(state.result, frame[["count"]] * 2)


def test_an_unstorable_object_in_a_column_is_named() -> None:
    import pandas as pd  # noqa: PLC0415

    frame = pd.DataFrame({"o": pd.Series([object()], dtype=object)})
    with pytest.raises(UnstorableValueError, match=r"state\.df\.o"):
        values.tag({"df": frame}, where=(None, "state"))


def test_state_checkpoint_stores_a_frame_and_takes_hooks(tmp_path: Path) -> None:
    def enc(obj: Any) -> Any:
        if isinstance(obj, Celsius):
            return obj.degrees
        raise NotImplementedError

    def dec(cls: type, data: Any) -> Any:
        if cls is Celsius:
            return Celsius(data)
        raise NotImplementedError

    ckpt = afk.StateCheckpoint(tmp_path / "c", enc_hook=enc, dec_hook=dec)
    ckpt.save({"df": sample_frame(), "t": Celsius(21.5)})
    ckpt.close()
    loaded = afk.StateCheckpoint(tmp_path / "c", enc_hook=enc, dec_hook=dec).load()
    assert_same(loaded["df"], sample_frame())
    assert isinstance(loaded["t"], Celsius) and loaded["t"].degrees == 21.5
    with pytest.raises(UnstorableValueError, match=r"state\.t"):
        afk.StateCheckpoint(tmp_path / "d").save({"t": Celsius(1.0)})


WRITE = """
import sys
import test_tables_frames as frames
import afk_local as afk
ckpt = afk.StateCheckpoint(sys.argv[1])
ckpt.save({"df": frames.sample_frame(), "step": 1})
ckpt.close()
print("saved", flush=True)
"""

READ = """
import sys
import pandas as pd
import test_tables_frames as frames
import afk_local as afk
state = afk.StateCheckpoint(sys.argv[1]).load()
frames.assert_same(state["df"], frames.sample_frame())
print("same", state["step"], sorted(str(t) for t in state["df"].dtypes), flush=True)
"""


def test_a_frame_written_in_one_process_is_read_in_another(tmp_path: Path) -> None:
    helper = tmp_path / "mods" / "test_tables_frames.py"
    helper.parent.mkdir()
    source = Path(__file__).read_text()
    helper.write_text(  # sample_frame and assert_same, for the children
        "import datetime as dt\nimport numpy as np\nimport pandas as pd\nfrom typing import Any\n"
        + textwrap.dedent(source[source.index("def sample_frame") : source.index("def test_")])
    )
    env = {"PYTHONPATH": os.pathsep.join([str(helper.parent), os.environ.get("PYTHONPATH", "")])}
    wrote = proc.run(WRITE, str(tmp_path / "c"), env=env)
    assert wrote.returncode == 0, wrote.stderr
    read = proc.run(READ, str(tmp_path / "c"), env=env)
    assert read.returncode == 0, read.stderr
    assert read.stdout.startswith("same 1 ")


rows = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.one_of(st.none(), st.text(max_size=8)),
        st.datetimes(min_value=dt.datetime(1700, 1, 1), max_value=dt.datetime(2200, 1, 1)),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(rows, st.one_of(st.none(), st.text(max_size=5)))
def test_round_trips_of_generated_frames(data: list[Any], index_name: str | None) -> None:
    import pandas as pd  # noqa: PLC0415

    frame = pd.DataFrame(
        {
            "i": pd.Series([r[0] for r in data], dtype="int64"),
            "f": pd.Series([r[1] for r in data], dtype="float64"),
            "s": pd.Series([r[2] for r in data], dtype=object),
            "t": pd.Series([r[3] for r in data], dtype="datetime64[us]"),
        }
    )
    frame.index = pd.Index(list(range(len(data))), name=index_name, dtype="int64")
    got = round_trip(frame)
    pd.testing.assert_frame_equal(got, frame, check_exact=True)
    assert got.index.name == index_name


def test_arrow_tables_round_trip_where_pyarrow_is_installed() -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.table(
        {"n": [1, 2, None], "s": ["a", None, "c"], "t": [dt.datetime(2024, 1, 1)] * 3},
        metadata={"source": "test"},
    )
    got = round_trip({"t": table, "b": table.to_batches()[0]})
    assert got["t"].equals(table) and got["t"].schema.metadata == table.schema.metadata
    assert got["b"].equals(table.to_batches()[0])
    frame = sample_frame()
    assert_same(round_trip(frame), frame)  # pandas with pyarrow strings too


def test_a_frame_is_shown_as_rows_by_the_cli(tmp_path: Path) -> None:
    stored = msgspec.msgpack.decode(msgspec.msgpack.encode(values.tag(sample_frame()[["count"]])))
    assert values.plain({"df": stored}) == {
        "df": {"columns": ["count"], "index": [10, 20, 30], "data": [[1], [2], [3]]}
    }
