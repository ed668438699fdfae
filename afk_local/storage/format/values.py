"""Payload values: msgpack data, plus the common Python types stored with their type.

``ctx.state``, checkpoint payloads, job arguments and journaled results hold
msgpack data (dict, list, str, int, float, bool, None, bytes). These types are
stored too and come back as themselves: ``pathlib`` paths, ``datetime``,
``date``, ``time``, ``timedelta``, ``UUID``, ``Decimal``, ``set``, ``frozenset``,
enums, dataclasses, msgspec Structs, and numpy arrays and scalars (when numpy is
installed; it is not a dependency), and pandas DataFrames, Series and Indexes and
pyarrow Tables (:mod:`afk_local.storage.format.tables`; neither is a dependency nor
imported before such a value is seen). Each is written as a msgpack extension value
(docs/format.md, "Typed values"); :func:`tag` turns them into those before
msgspec encodes a record, and the decoder's ``ext_hook`` (:func:`ext_decoder`)
turns them back.

Anything else goes through the store's ``enc_hook``/``dec_hook`` pair, in
msgspec's convention: ``enc_hook(obj)`` returns msgpack-able data, and
``dec_hook(type, data)`` rebuilds the object; the type is recorded by name. A
value nothing can store raises :class:`~afk_local.errors.UnstorableValueError`
naming where it is (``state.model.weights``) and its type.

Classes (dataclasses, enums, Structs, hook types) are found by name only among
the modules the reading process has already imported: nothing is imported or
executed because a file names it. Where the class is not loaded (the
``afk-local`` CLI reading a job's state, for instance) the value stays a
:class:`msgspec.msgpack.Ext`, which is written back unchanged by compaction,
forks and signatures, and :func:`plain` renders it as plain data for display.
Tuples are stored as lists and come back as lists, as msgspec does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import logging
import pathlib
import sys
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from afk_local.errors import IntOutOfRangeError, RecordTooDeepError, UnstorableValueError
from afk_local.storage.format.records import MAX_NESTING_DEPTH

log = logging.getLogger("afk_local")

EncHook = Callable[[Any], Any]
DecHook = Callable[[type, Any], Any]

EXT_PATH = 1
EXT_DATETIME = 2
EXT_DATE = 3
EXT_TIME = 4
EXT_TIMEDELTA = 5
EXT_UUID = 6
EXT_DECIMAL = 7
EXT_SET = 8
EXT_ENUM = 9
EXT_DATACLASS = 10
EXT_STRUCT = 11
EXT_NDARRAY = 12
EXT_NUMPY_SCALAR = 13
EXT_HOOKED = 14
EXT_PANDAS = 15
EXT_ARROW = 16
"""msgpack extension type codes of the typed values (docs/format.md, "Typed values")."""

_PLAIN = frozenset({str, int, float, bool, type(None), bytes})
_all_plain = _PLAIN.issuperset
_PASS_THROUGH = (bytearray, memoryview, msgspec.Raw, msgspec.msgpack.Ext)
_PATH_CLASSES = {
    "PurePath": pathlib.PurePath,
    "PurePosixPath": pathlib.PurePosixPath,
    "PureWindowsPath": pathlib.PureWindowsPath,
}
_inner = msgspec.msgpack.Encoder()
# A record is level 1 and its payload level 2; a flat dict of plain values at the bottom
# is not walked (one more level): deeper user data would not fit MAX_NESTING_DEPTH.
_MAX_DEPTH = MAX_NESTING_DEPTH - 3

Where = tuple[Any, ...] | None
"""A value's position as a linked list ``(parent, key)``; turned into text only for errors."""


def where_text(where: Where) -> str:
    """``state.model.weights`` for a position built by :func:`tag`."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(str(key))
    return ".".join(reversed(parts)) or "(the value itself)"


_INT_RANGE = (-(2**63), 2**64 - 1)


def int_out_of_range(value: Any, where: Where = None, depth: int = 0) -> IntOutOfRangeError | None:
    """The error naming the first int in ``value`` msgpack cannot hold, if any.

    Only called after an encoder raised ``OverflowError``: the walk costs nothing on
    the path that succeeds.
    """
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            shown = f"int {value}" if len(str(abs(value))) <= 30 else "an int"
            return IntOutOfRangeError(where_text(where), shown)
        return None
    if depth > _MAX_DEPTH:
        return None
    items: Any = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = enumerate(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, msgspec.Struct):
        items = ((name, getattr(value, name)) for name in value.__struct_fields__)
    for key, item in items:
        found = int_out_of_range(item, (where, key), depth + 1)
        if found is not None:
            return found
    return None


def type_name(cls: type) -> str:
    """``module:qualname`` of a class, as typed values record it."""
    return f"{cls.__module__}:{cls.__qualname__}"


def tag(value: Any, enc_hook: EncHook | None = None, where: Where = None) -> Any:
    """``value`` with every typed value replaced by its msgpack extension value.

    Containers are copied only where something inside them changed, so plain
    data costs one walk and no allocation.

    Raises:
        UnstorableValueError: a value nothing can store (naming where it is).
    """
    try:
        return _tag(value, enc_hook, where, 0)
    except RecursionError:
        raise RecordTooDeepError(where_text(where), MAX_NESTING_DEPTH) from None


def _tag(value: Any, hook: EncHook | None, where: Where, depth: int) -> Any:
    cls = type(value)
    if cls in _PLAIN:
        return value
    if depth > _MAX_DEPTH:
        raise RecursionError
    # A flat dict of plain values (the usual record, message or row) is checked in one
    # C-level pass instead of a call: the walk is most of what a checkpoint costs in memory.
    if cls is dict or isinstance(value, dict):
        changed: dict[Any, Any] | None = None
        for key, item in value.items():
            kind = type(item)
            if kind in _PLAIN or _flat(kind, item):
                continue
            new = _tag(item, hook, (where, key), depth + 1)
            if new is not item:
                if changed is None:
                    changed = dict(value)
                changed[key] = new
        return value if changed is None else changed
    if cls is list or isinstance(value, (list, tuple)):
        if cls is list and _all_plain(map(type, value)):
            return value  # a list of plain values (messages, notes, rows): one C-level pass
        out: list[Any] | None = None
        for index, item in enumerate(value):
            kind = type(item)
            if kind in _PLAIN or _flat(kind, item):
                continue
            new = _tag(item, hook, (where, index), depth + 1)
            if new is not item:
                if out is None:
                    out = list(value)
                out[index] = new
        return value if out is None else out
    return _typed(value, cls, hook, where, depth)


def _flat(kind: type, item: Any) -> bool:
    """A dict or list of plain values only: nothing in it to tag (one C-level pass)."""
    if kind is dict:
        return _all_plain(map(type, item.values()))
    return kind is list and _all_plain(map(type, item))


def _ext(code: int, inner: Any) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, _inner.encode(inner))


def _typed(value: Any, cls: type, hook: EncHook | None, where: Where, depth: int) -> Any:
    if isinstance(value, _PASS_THROUGH):
        return value
    if isinstance(value, enum.Enum):
        inner = _tag(value.value, hook, where, depth + 1)
        return _ext(EXT_ENUM, [type_name(cls), inner])
    if isinstance(value, dt.datetime):
        return _ext(EXT_DATETIME, _datetime_parts(value))
    if isinstance(value, dt.date):
        return _ext(EXT_DATE, value.isoformat())
    if isinstance(value, dt.time):
        offset = value.utcoffset()
        naive = value.replace(tzinfo=None)
        seconds = None if offset is None else offset.total_seconds()
        return _ext(EXT_TIME, [naive.isoformat(), seconds, value.fold])
    if isinstance(value, dt.timedelta):
        return _ext(EXT_TIMEDELTA, [value.days, value.seconds, value.microseconds])
    if isinstance(value, uuid.UUID):
        return _ext(EXT_UUID, value.bytes)
    if isinstance(value, decimal.Decimal):
        return _ext(EXT_DECIMAL, str(value))
    if isinstance(value, (set, frozenset)):
        items = _tag(list(value), hook, where, depth + 1)
        return _ext(EXT_SET, [isinstance(value, frozenset), items])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _tag(getattr(value, f.name), hook, (where, f.name), depth + 1)
            for f in dataclasses.fields(value)
        }
        return _ext(EXT_DATACLASS, [type_name(cls), fields])
    if isinstance(value, msgspec.Struct):
        fields = {
            name: _tag(getattr(value, name), hook, (where, name), depth + 1)
            for name in value.__struct_fields__
        }
        return _ext(EXT_STRUCT, [type_name(cls), fields])
    if hasattr(cls, "__attrs_attrs__"):
        return value  # msgspec stores attrs classes itself (as maps)
    # Types msgspec does not store itself: the user's hook first (it may predate ours).
    if hook is not None:
        try:
            converted = hook(value)
        except (NotImplementedError, TypeError):
            pass
        else:
            inner = _tag(converted, hook, where, depth + 1)
            return _ext(EXT_HOOKED, [type_name(cls), inner])
    numpy = sys.modules.get("numpy")  # never imported here: a numpy value means it is loaded
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return _numpy(numpy, value, where)
    if isinstance(value, pathlib.PurePath):
        return _ext(EXT_PATH, [_path_class(cls), str(value)])
    if cls.__module__.startswith(("pandas", "pyarrow")):
        from afk_local.storage.format import tables  # noqa: PLC0415 - only for such values

        if tables.is_table(value):
            return tables.encode(value, lambda v, w: _tag(v, hook, w, depth + 1), where)
    raise UnstorableValueError(where_text(where), _describe(cls))


def _path_class(cls: type) -> str:
    return cls.__name__ if cls.__name__ in _PATH_CLASSES else "Path"


def _describe(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{cls.__qualname__} ({module})"


def _datetime_parts(value: dt.datetime) -> list[Any]:
    naive = value.replace(tzinfo=None).isoformat()
    tz = value.tzinfo
    if tz is None:
        return [naive, None, value.fold]
    key = getattr(tz, "key", None)  # zoneinfo.ZoneInfo: keep the zone, not just the offset
    if isinstance(key, str) and type(tz).__module__ == "zoneinfo":
        return [naive, key, value.fold]
    offset = value.utcoffset()
    return [naive, offset.total_seconds() if offset is not None else None, value.fold]


def _numpy(numpy: Any, value: Any, where: Where) -> msgspec.msgpack.Ext:
    dtype = value.dtype
    if dtype.hasobject or dtype.fields is not None:
        raise UnstorableValueError(
            where_text(where),
            f"a numpy {'array' if isinstance(value, numpy.ndarray) else 'scalar'} of dtype "
            f"{dtype} (object and structured dtypes have no byte form; convert it to a list)",
        )
    if isinstance(value, numpy.ndarray):
        data = numpy.ascontiguousarray(value).tobytes()
        return _ext(EXT_NDARRAY, [dtype.str, list(value.shape), data])
    return _ext(EXT_NUMPY_SCALAR, [dtype.str, value.tobytes()])


# -- decoding -------------------------------------------------------------------------------


def find_class(name: Any) -> type | None:
    """The class ``module:qualname`` if its module is already imported here, else None.

    Nothing is imported: a stored name never makes this process run code.
    """
    if not isinstance(name, str) or ":" not in name:
        return None
    module_name, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module_name)
    if obj is None or "<locals>" in qualname:
        return None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None


def ext_decoder(
    dec_hook: DecHook | None = None, *, hooked_as_data: bool = False
) -> Callable[[int, memoryview], Any]:
    """The ``ext_hook`` for msgspec decoders that turns typed values back into objects.

    A value whose class is not loaded here stays a :class:`msgspec.msgpack.Ext`, so
    a process that rewrites records (the watcher, gc, fork) writes it back unchanged.
    ``hooked_as_data``: values stored through an ``enc_hook`` come back as the data
    the hook made when they cannot be rebuilt (a store with an ``enc_hook`` and no
    ``dec_hook``, which got that data back before typed values existed).
    """
    decoder: msgspec.msgpack.Decoder[Any]

    def ext_hook(code: int, data: memoryview) -> Any:
        try:
            inner = decoder.decode(data)
            value = _untag(code, inner, dec_hook)
        except (ValueError, TypeError, KeyError, IndexError, msgspec.DecodeError) as exc:
            log.warning("a stored value of extension type %d does not decode: %s", code, exc)
            value = inner = None
        if value is not None:
            return value[0]
        if hooked_as_data and code == EXT_HOOKED and isinstance(inner, list) and len(inner) == 2:
            return inner[1]
        return msgspec.msgpack.Ext(code, bytes(data))

    decoder = msgspec.msgpack.Decoder(ext_hook=ext_hook)
    return ext_hook


def _untag(code: int, inner: Any, dec_hook: DecHook | None) -> tuple[Any] | None:
    """``(value,)`` rebuilt from an extension value, or None to keep it as stored."""
    if code == EXT_PATH:
        name, text = inner
        return (_PATH_CLASSES.get(name, pathlib.Path)(text),)
    if code == EXT_DATETIME:
        naive, tz, fold = inner
        return (dt.datetime.fromisoformat(naive).replace(tzinfo=_tzinfo(tz), fold=fold),)
    if code == EXT_DATE:
        return (dt.date.fromisoformat(inner),)
    if code == EXT_TIME:
        naive, tz, fold = inner
        return (dt.time.fromisoformat(naive).replace(tzinfo=_tzinfo(tz), fold=fold),)
    if code == EXT_TIMEDELTA:
        days, seconds, micros = inner
        return (dt.timedelta(days=days, seconds=seconds, microseconds=micros),)
    if code == EXT_UUID:
        return (uuid.UUID(bytes=bytes(inner)),)
    if code == EXT_DECIMAL:
        return (decimal.Decimal(inner),)
    if code == EXT_SET:
        frozen, items = inner
        return (frozenset(items) if frozen else set(items),)
    if code in (EXT_ENUM, EXT_DATACLASS, EXT_STRUCT, EXT_HOOKED):
        return _instance(code, inner, dec_hook)
    if code in (EXT_NDARRAY, EXT_NUMPY_SCALAR):
        return _numpy_value(code, inner)
    if code in (EXT_PANDAS, EXT_ARROW):
        from afk_local.storage.format import tables  # noqa: PLC0415 - only for such values

        return tables.decode(code, inner)
    return None


def _tzinfo(tz: Any) -> dt.tzinfo | None:
    if tz is None:
        return None
    if isinstance(tz, str):
        import zoneinfo  # noqa: PLC0415 - only for zone-aware datetimes

        return zoneinfo.ZoneInfo(tz)
    return dt.timezone(dt.timedelta(seconds=tz))


def _instance(code: int, inner: Any, dec_hook: DecHook | None) -> tuple[Any] | None:
    name, data = inner
    cls = find_class(name)
    if cls is None:
        return None
    if code == EXT_ENUM and issubclass(cls, enum.Enum):
        return (cls(data),)
    if code == EXT_DATACLASS and dataclasses.is_dataclass(cls):
        return _dataclass(cls, data)
    if code == EXT_STRUCT and issubclass(cls, msgspec.Struct):
        return (cls(**data),)
    if code == EXT_HOOKED and dec_hook is not None:
        return (dec_hook(cls, data),)
    return None


def _dataclass(cls: type, data: Any) -> tuple[Any] | None:
    """A dataclass rebuilt from its stored fields, as pickle and copy do: no ``__init__``.

    Only the fields the class declares are set: a stored name that is not one of
    them (``__dict__``, ``__class__``, or a field the class has since lost) keeps
    the value in its stored form rather than letting a file choose attributes. A
    field missing from the file takes its default, or keeps the value as stored.
    """
    if not isinstance(data, dict):
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not fields.keys() >= data.keys():
        return None
    obj: Any = object.__new__(cls)
    for name, field in fields.items():
        if name in data:
            item = data[name]
        elif field.default is not dataclasses.MISSING:
            item = field.default
        elif field.default_factory is not dataclasses.MISSING:
            item = field.default_factory()
        else:
            return None
        object.__setattr__(obj, name, item)
    return (obj,)


def _numpy_value(code: int, inner: Any) -> tuple[Any] | None:
    try:
        import numpy  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - optional
    except ImportError:
        return None
    if code == EXT_NDARRAY:
        dtype, shape, data = inner
        array = numpy.frombuffer(bytes(data), dtype=numpy.dtype(dtype)).reshape(shape)
        return (array.copy(),)  # writable, like the array that was stored
    dtype, data = inner
    return (numpy.frombuffer(bytes(data), dtype=numpy.dtype(dtype))[0],)


def as_data(value: Any) -> Any:
    """``value`` with every value still in its stored form (:class:`msgspec.msgpack.Ext`,
    its class not loaded here) replaced by its data: a dataclass's or Struct's fields,
    an enum's value, what an ``enc_hook`` made. Other values are left as they are."""
    if isinstance(value, msgspec.msgpack.Ext):
        return _plain_ext(value, keep_types=True)
    if isinstance(value, dict):
        return {k: as_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_data(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """``value`` as plain data for display and JSON: typed values as strings, lists, dicts.

    A dict key JSON cannot hold (a tuple: msgpack keeps ``{(1, 2): ...}``) is shown as
    its ``repr``, so a stored value never stops ``show``, ``effects`` or ``export``.
    """
    try:
        return msgspec.to_builtins(value, str_keys=True, enc_hook=_plain_hook)
    except TypeError:  # a key to_builtins cannot make a string (rare: walk only then)
        builtins = msgspec.to_builtins(value, enc_hook=_plain_hook)  # records to dicts
        return msgspec.to_builtins(_shown_keys(builtins), str_keys=True)


def _shown_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k if isinstance(k, (str, int, float, bool)) or k is None else repr(k): _shown_keys(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_shown_keys(v) for v in value]
    return value


def _plain_hook(value: Any) -> Any:
    if isinstance(value, msgspec.msgpack.Ext):
        return _plain_ext(value)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return value.tolist()
    return repr(value)


def _plain_ext(value: msgspec.msgpack.Ext, *, keep_types: bool = False) -> Any:
    if value.code in (EXT_PANDAS, EXT_ARROW) and not keep_types:
        from afk_local.storage.format import tables  # noqa: PLC0415 - only for such values

        shown = tables.plain(value.code, bytes(value.data), ext_decoder())
        if shown is not None:
            return shown
    typed = ext_decoder() if keep_types else _plain_ext_hook
    try:
        inner = msgspec.msgpack.decode(value.data, ext_hook=typed)
    except msgspec.DecodeError:
        return repr(value)
    if value.code in (EXT_ENUM, EXT_DATACLASS, EXT_STRUCT, EXT_HOOKED):
        return as_data(inner[1]) if keep_types else inner[1]
    return inner


def _plain_ext_hook(code: int, data: memoryview) -> Any:
    return _plain_ext(msgspec.msgpack.Ext(code, bytes(data)))


def hash_hook(enc_hook: EncHook | None) -> EncHook:
    """The ``enc_hook`` for input hashes: the user's hook first, then paths and numpy values.

    Types msgspec encodes itself (dataclasses, datetime, ...) are hashed as msgspec
    encodes them, so input hashes recorded by earlier versions stay valid.
    """
    return _HASH_HOOKS.get(enc_hook) or _HASH_HOOKS.setdefault(enc_hook, _make_hash_hook(enc_hook))


_HASH_HOOKS: dict[EncHook | None, EncHook] = {}


def _make_hash_hook(enc_hook: EncHook | None) -> EncHook:
    def hook(value: Any) -> Any:
        if enc_hook is not None:
            try:
                return enc_hook(value)
            except (NotImplementedError, TypeError):
                pass
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
            return _numpy(numpy, value, None)
        if isinstance(value, pathlib.PurePath):
            return _ext(EXT_PATH, [_path_class(type(value)), str(value)])
        if type(value).__module__.startswith(("pandas", "pyarrow")):
            return tag(value, enc_hook)  # a DataFrame argument: hashed as it is stored
        # the caller names what it hashed (an argument, a result): see journal.replay
        raise UnstorableValueError("(the value itself)", _describe(type(value)))

    return hook


__all__ = [
    "EXT_ARROW",
    "EXT_DATACLASS",
    "EXT_DATE",
    "EXT_DATETIME",
    "EXT_DECIMAL",
    "EXT_ENUM",
    "EXT_HOOKED",
    "EXT_NDARRAY",
    "EXT_NUMPY_SCALAR",
    "EXT_PANDAS",
    "EXT_PATH",
    "EXT_SET",
    "EXT_STRUCT",
    "EXT_TIME",
    "EXT_TIMEDELTA",
    "EXT_UUID",
    "DecHook",
    "EncHook",
    "Where",
    "as_data",
    "ext_decoder",
    "find_class",
    "hash_hook",
    "plain",
    "tag",
    "type_name",
    "where_text",
]
