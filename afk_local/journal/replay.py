"""What a journaled call is and how its recorded outcome comes back on replay.

A call is identified by the input hash of ``(name, args, kwargs)``, hands
outside services an idempotency key derived from ``(run_id, key)``, and a
recorded error comes back as a :class:`ReplayedError` of the same type name.
:meth:`afk_local.journal.journal.Journal.call` applies these rules; docs/journal.md
("Replay semantics") describes them.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import inspect
import reprlib
from collections.abc import Callable
from typing import Any

import msgspec

from afk_local.errors import IntOutOfRangeError, UnstorableValueError
from afk_local.storage.format.codec import EncHook
from afk_local.storage.format.records import ErrorInfo
from afk_local.storage.format.values import hash_hook, int_out_of_range


def input_hash(
    name: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    *,
    enc_hook: EncHook | None = None,
) -> str:
    """The blake2b (128-bit, hex) digest of the canonical msgpack of ``(name, args, kwargs)``.

    Canonical: map keys and struct fields sorted, tuples and lists both arrays,
    so equal inputs hash equally across processes and Python versions.

    >>> input_hash("send", ("a@b.c",), {}) == input_hash("send", ["a@b.c"], {})
    True
    """
    encoder = _canonical_encoder(enc_hook or hash_hook(None))
    value = (name, list(args), kwargs)
    try:
        data = _canonical_bytes(encoder, value)
    except UnstorableValueError as exc:
        raise exc.under("(an argument)") from None
    except OverflowError:
        found = int_out_of_range([list(args), kwargs], (None, "(an argument)"))
        raise found or IntOutOfRangeError("(an argument)", "an int") from None
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def result_hash(result: Any, *, enc_hook: EncHook | None = None) -> str:
    """The blake2b (128-bit, hex) digest of ``result``'s canonical msgpack (``output_hash``)."""
    encoder = _canonical_encoder(enc_hook or hash_hook(None))
    try:
        data = _canonical_bytes(encoder, result)
    except UnstorableValueError as exc:
        raise exc.under("the result") from None
    except OverflowError:
        found = int_out_of_range(result, (None, "the result"))
        raise found or IntOutOfRangeError("the result", "an int") from None
    return hashlib.blake2b(data, digest_size=16).hexdigest()


ARGS_TEXT_LIMIT = 200
"""The longest argument rendering an intent record keeps (``Effect.args_text``)."""

_ARGS_REPR = reprlib.Repr()
for _limit, _value in (
    ("maxlevel", 3), ("maxtuple", 6), ("maxlist", 6), ("maxarray", 6), ("maxdict", 6),
    ("maxset", 6), ("maxfrozenset", 6), ("maxdeque", 6), ("maxstring", 60), ("maxlong", 40),
    ("maxother", 60),
):  # fmt: skip
    setattr(_ARGS_REPR, _limit, _value)  # Repr(maxlevel=...) needs Python 3.12


def render_args(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> str:
    """A call's arguments in words, bounded: ``'a', 10, currency='eur'``.

    For people (messages, ``afk-local replay``), never compared: the input hash is
    what identifies a call. Long values are cut with ``...``.

    >>> render_args(("a", 10), {"currency": "eur"})
    "'a', 10, currency='eur'"
    """
    try:
        parts = [_ARGS_REPR.repr(arg) for arg in args]
        parts += [f"{name}={_ARGS_REPR.repr(value)}" for name, value in kwargs.items()]
    except Exception as exc:  # a user __repr__ that fails: say so rather than fail the call
        return f"<arguments not shown: {type(exc).__name__}>"
    text = ", ".join(parts)
    return text if len(text) <= ARGS_TEXT_LIMIT else text[: ARGS_TEXT_LIMIT - 3] + "..."


def render_call(name: str, args_text: str, input_digest: str = "") -> str:
    """A journaled call in words: ``charge('a', 10)``.

    ``args_text`` empty (a journal written before arguments were recorded): the
    input hash stands in for them.
    """
    if args_text or not input_digest:
        return f"{name}({args_text})"
    return f"{name}(arguments not recorded; input hash {input_digest[:12]})"


_MAP_TAG = "\x00afk-map"
"""Marks a dict with keys other than strings in the canonical form (a sorted pair list)."""


def _canonical_bytes(encoder: msgspec.msgpack.Encoder, value: Any) -> bytes:
    """The canonical msgpack of ``value``; a dict keyed by tuples or ints is hashed too.

    msgspec sorts only string keys; such a dict becomes ``{_MAP_TAG: [[key, value],
    ...]}`` sorted by the canonical bytes of each key. Plain data never takes this path.
    """
    try:
        return encoder.encode(value)
    except TypeError as exc:
        if "str keys" not in str(exc):
            raise
    return encoder.encode(_keys_as_pairs(encoder, value, 0))


def _keys_as_pairs(encoder: msgspec.msgpack.Encoder, value: Any, depth: int) -> Any:
    if depth > _MAX_PAIR_DEPTH:
        raise RecursionError
    if isinstance(value, dict):
        if all(type(key) is str for key in value):
            return {k: _keys_as_pairs(encoder, v, depth + 1) for k, v in value.items()}
        pairs = [
            [_keys_as_pairs(encoder, k, depth + 1), _keys_as_pairs(encoder, v, depth + 1)]
            for k, v in value.items()
        ]
        return {_MAP_TAG: sorted(pairs, key=lambda pair: encoder.encode(pair[0]))}
    if isinstance(value, (list, tuple)):
        return [_keys_as_pairs(encoder, item, depth + 1) for item in value]
    return value


_MAX_PAIR_DEPTH = 1000


def idempotency_key(run_id: str, key: str) -> str:
    """A stable key derived from ``(run_id, key)``, safe to send to outside services.

    It is ``"afk-"`` and 32 hex digits: the same for every attempt of the same
    effect, different across runs and keys.
    """
    digest = hashlib.blake2b(
        f"{run_id}\0{key}".encode(), digest_size=16, person=b"afk-idempotency"
    ).hexdigest()
    return f"afk-{digest}"


@functools.lru_cache(maxsize=64)
def _canonical_encoder(enc_hook: EncHook | None) -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder(enc_hook=enc_hook, order="sorted")


class ReplayedError(Exception):
    """Raised when :meth:`Journal.call` replays an outcome recorded as an error.

    Each replayed error is an instance of a subclass named like the recorded
    type; when that name is a builtin exception (``ValueError``, ``KeyError``,
    ``OSError``...) the subclass also derives from the builtin, so ``except
    ValueError`` still catches it. ``str()`` is the recorded message.
    """

    def __init__(self, info: ErrorInfo, key: str) -> None:
        # Set args directly: a mixed-in builtin's __init__ may want other arguments.
        self.args = (info.message,)
        self.info = info
        self.key = key

    def __str__(self) -> str:
        return self.info.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Its class is made at run time (named like the recorded type), so it cannot
        # be pickled by name: rebuilt from the record it replays, fields and all.
        return (replayed_error, (self.info, self.key), self.__dict__)


@functools.lru_cache(maxsize=256)
def _replayed_type(type_name: str, mix_builtin: bool) -> type[ReplayedError]:
    builtin = getattr(builtins, type_name, None) if mix_builtin else None
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            return type(type_name, (ReplayedError, builtin), {"__module__": __name__})
        except TypeError:  # a builtin whose layout cannot be mixed in
            pass
    return type(type_name, (ReplayedError,), {"__module__": __name__})


def replayed_error(info: ErrorInfo, key: str) -> ReplayedError:
    """The exception :meth:`Journal.call` raises for a recorded error outcome."""
    name = info.type if info.type.isidentifier() else "ReplayedError"
    try:
        cls = _replayed_type(name, True)
        error = cls.__new__(cls, info.message)
    except TypeError:  # e.g. UnicodeDecodeError, ExceptionGroup: not from a message alone
        cls = _replayed_type(name, False)
        error = cls.__new__(cls, info.message)
    ReplayedError.__init__(error, info, key)
    return error


def accepts_idempotency_key(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` has a parameter ``idempotency_key`` that a keyword can fill.

    A bare ``**kwargs`` does not count. Answers are cached per function.
    """
    try:
        return _accepts_cached(fn)
    except TypeError:  # unhashable callable
        return _accepts_uncached(fn)


@functools.lru_cache(maxsize=1024)
def _accepts_cached(fn: Callable[..., Any]) -> bool:
    return _accepts_uncached(fn)


def _accepts_uncached(fn: Callable[..., Any]) -> bool:
    try:
        param = inspect.signature(fn).parameters.get("idempotency_key")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
