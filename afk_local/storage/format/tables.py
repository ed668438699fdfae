"""pandas DataFrames, Series and Indexes, and Arrow tables, as typed values (never pickle).

Neither pandas nor pyarrow is a dependency: this module is imported by
:mod:`afk_local.storage.format.values` only when a value of theirs is seen, and it
imports them only then. Two extension values (docs/format.md, "Typed values"):

- ``EXT_PANDAS`` (15): a DataFrame, Series or Index in a column-wise encoding that
  needs nothing but pandas to read (not pyarrow, whichever wrote it). Each column
  keeps its dtype: numpy dtypes as a numpy array (bytes), ``category`` as codes and
  categories, time-zone-aware datetimes as UTC values and their dtype, other
  extension dtypes (``string``/``str``, ``Int64``, ``boolean``, ``Float64``,
  ``int64[pyarrow]``...) as their values and the dtype's name, object columns value
  by value (each one a storable value). Indexes (``RangeIndex``, ``MultiIndex``,
  any other) keep their names; column labels are an Index too.
- ``EXT_ARROW`` (16): a ``pyarrow.Table`` or ``RecordBatch`` as an Arrow IPC stream.

A process without pandas (or pyarrow) reading such a value keeps it in its stored
form (:class:`msgspec.msgpack.Ext`) and writes it back unchanged, as for any typed
value whose class is not loaded.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import msgspec

EXT_PANDAS = 15
EXT_ARROW = 16

Tag = Callable[[Any, Any], Any]
"""``tag(value, where)``: a value in its storable form (values.py's walk, with its hook)."""

_inner = msgspec.msgpack.Encoder()


def _ext(code: int, inner: Any) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, _inner.encode(inner))


def is_table(value: Any) -> bool:
    """True for a pandas DataFrame, Series or Index, or a pyarrow Table or RecordBatch."""
    module = type(value).__module__
    if module.startswith("pandas"):
        pd = sys.modules.get("pandas")
        return pd is not None and isinstance(value, (pd.DataFrame, pd.Series, pd.Index))
    if module.startswith("pyarrow"):
        pa = sys.modules.get("pyarrow")
        return pa is not None and isinstance(value, (pa.Table, pa.RecordBatch))
    return False


def encode(value: Any, tag: Tag, where: Any) -> msgspec.msgpack.Ext:
    """The extension value of a table (call only when :func:`is_table` says so)."""
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(value, pd.DataFrame):
        columns = [
            _column(pd, value.iloc[:, i], tag, (where, str(label)))
            for i, label in enumerate(value.columns)
        ]
        body = {
            "columns": _index(pd, value.columns, tag, where),
            "data": columns,
            "index": _index(pd, value.index, tag, where),
        }
        return _ext(EXT_PANDAS, ["frame", body])
    if pd is not None and isinstance(value, pd.Series):
        body = {
            "name": tag(value.name, where),
            "data": _column(pd, value, tag, where),
            "index": _index(pd, value.index, tag, where),
        }
        return _ext(EXT_PANDAS, ["series", body])
    if pd is not None and isinstance(value, pd.Index):
        return _ext(EXT_PANDAS, ["index", _index(pd, value, tag, where)])
    import pyarrow as pa  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, value.schema) as writer:
        writer.write(value)
    kind = "table" if isinstance(value, pa.Table) else "batch"
    return _ext(EXT_ARROW, [kind, sink.getvalue().to_pybytes()])


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    pd = sys.modules["pandas"]
    return value is pd.NA or value is pd.NaT


def _column(pd: Any, series: Any, tag: Tag, where: Any) -> list[Any]:
    """One column (or an Index's values) with its dtype."""
    dtype = series.dtype
    numpy = sys.modules["numpy"]
    if isinstance(dtype, numpy.dtype):
        if dtype.kind == "O":
            return ["obj", tag(series.tolist(), where)]
        return ["np", tag(series.to_numpy(copy=False), where)]
    if isinstance(dtype, pd.CategoricalDtype):
        values = pd.Series(series, copy=False)
        return [
            "cat",
            tag(values.cat.codes.to_numpy(), where),
            _index(pd, dtype.categories, tag, where),
            bool(dtype.ordered),
        ]
    if isinstance(dtype, pd.DatetimeTZDtype):
        utc = pd.Series(series, copy=False).dt.tz_convert("UTC").dt.tz_localize(None)
        return ["dttz", str(dtype), tag(utc.to_numpy(), where)]
    values = [None if _missing(v) else v for v in pd.Series(series, copy=False).astype(object)]
    return ["ext", str(dtype), tag(values, where)]


def _index(pd: Any, index: Any, tag: Tag, where: Any) -> list[Any]:
    if isinstance(index, pd.RangeIndex):
        return ["range", index.start, index.stop, index.step, tag(index.name, where)]
    if isinstance(index, pd.MultiIndex):
        levels = [_column(pd, index.get_level_values(i), tag, where) for i in range(index.nlevels)]
        return ["multi", levels, tag(list(index.names), where)]
    return ["index", _column(pd, index, tag, where), tag(index.name, where)]


# -- decoding -------------------------------------------------------------------------------


def decode(code: int, inner: Any) -> tuple[Any] | None:
    """``(value,)`` rebuilt from an ``EXT_PANDAS`` or ``EXT_ARROW`` value; None to keep it
    as stored (pandas or pyarrow, or a dtype's backend, is not installed here)."""
    try:
        return _decode(code, inner)
    except ImportError:  # e.g. a "string[pyarrow]" column where pyarrow is missing
        return None


def _decode(code: int, inner: Any) -> tuple[Any] | None:
    if code == EXT_ARROW:
        try:
            import pyarrow as pa  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415
        except ImportError:
            return None
        kind, data = inner
        table = pa.ipc.open_stream(pa.py_buffer(bytes(data))).read_all()
        if kind == "batch":
            batches = table.to_batches()
            return (batches[0] if batches else pa.RecordBatch.from_pylist([], table.schema),)
        return (table,)
    try:
        import pandas as pd  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
    except ImportError:
        return None
    kind, body = inner
    if kind == "index":
        return (_read_index(pd, body),)
    index = _read_index(pd, body["index"])
    if kind == "series":
        series = _read_column(pd, body["data"])
        series.index, series.name = index, body["name"]
        return (series,)
    if kind != "frame":
        raise ValueError(f"unknown pandas value kind {kind!r}")
    data = {i: _read_column(pd, column) for i, column in enumerate(body["data"])}
    frame = pd.DataFrame(data) if data else pd.DataFrame(index=pd.RangeIndex(len(index)))
    frame.index = index
    frame.columns = _read_index(pd, body["columns"])
    return (frame,)


def plain(code: int, data: bytes, ext_hook: Callable[[int, memoryview], Any]) -> Any | None:
    """A table as plain data for display (``{"columns", "index", "data"}`` rows, as
    pandas' ``orient="split"``), or None when it cannot be rebuilt here."""
    try:
        value = msgspec.msgpack.decode(data, ext_hook=ext_hook)
        rebuilt = decode(code, value)
    except (ValueError, TypeError, KeyError, IndexError, msgspec.DecodeError):
        return None
    if rebuilt is None:
        return None
    table = rebuilt[0]
    if code == EXT_ARROW:
        table = table.to_pandas()
    to_json = getattr(table, "to_json", None)
    if to_json is None:  # an Index
        return [str(v) for v in table]
    return msgspec.json.decode(to_json(orient="split", date_format="iso", default_handler=str))


def _read_column(pd: Any, column: list[Any]) -> Any:
    """A column as a Series on a RangeIndex, with its dtype (object stays object: pandas
    would otherwise infer strings)."""
    kind = column[0]
    if kind == "np":
        return pd.Series(column[1], copy=False)
    if kind == "obj":
        numpy = sys.modules["numpy"]
        values = numpy.empty(len(column[1]), dtype=object)
        values[:] = column[1]
        return pd.Series(values, dtype=object, copy=False)
    if kind == "cat":
        _, codes, categories, ordered = column
        cats = pd.Categorical.from_codes(codes, _read_index(pd, categories), ordered=ordered)
        return pd.Series(cats, copy=False)
    if kind == "dttz":
        _, dtype, values = column
        utc = pd.Series(values, copy=False).dt.tz_localize("UTC")
        return utc.dt.tz_convert(pd.api.types.pandas_dtype(dtype).tz)
    if kind == "ext":
        _, dtype, values = column
        return pd.Series(pd.array(values, dtype=pd.api.types.pandas_dtype(dtype)), copy=False)
    raise ValueError(f"unknown pandas column kind {kind!r}")


def _read_index(pd: Any, index: list[Any]) -> Any:
    kind = index[0]
    if kind == "range":
        _, start, stop, step, name = index
        return pd.RangeIndex(start, stop, step, name=name)
    if kind == "multi":
        _, levels, names = index
        arrays = [_as_index(pd, _read_column(pd, level), None) for level in levels]
        return pd.MultiIndex.from_arrays(arrays, names=names)
    if kind == "index":
        _, values, name = index
        return _as_index(pd, _read_column(pd, values), name)
    raise ValueError(f"unknown pandas index kind {kind!r}")


def _as_index(pd: Any, series: Any, name: Any) -> Any:
    return pd.Index(series.array, dtype=series.dtype, name=name, tupleize_cols=False)


__all__ = ["EXT_ARROW", "EXT_PANDAS", "decode", "encode", "is_table", "plain"]
