"""Typed payload values (afk_local/storage/format/values.py): the common types come back
as themselves.

Each value goes to disk and is read back by a fresh reader, through the two ways user data
is stored: ``ctx.state``/``StateCheckpoint`` checkpoints and journaled step results.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import pathlib
import uuid
import zoneinfo
from pathlib import Path
from typing import Any

import msgspec
import pytest

import afk_local as afk
from afk_local.errors import UnstorableValueError
from afk_local.journal.journal import Journal
from afk_local.storage.format import values


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    where: pathlib.Path
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Derived:
    a: int
    b: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.b = self.a * 2


class Money(msgspec.Struct):
    cents: int
    currency: str = "EUR"


SAMPLES: dict[str, Any] = {
    "path": pathlib.Path("/data/in.csv"),
    "pure_posix_path": pathlib.PurePosixPath("a/b"),
    "datetime_naive": dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
    "datetime_utc": dt.datetime(2024, 5, 6, 7, 8, tzinfo=dt.timezone.utc),
    "datetime_zone": dt.datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("UTC")),
    "datetime_offset": dt.datetime(2024, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    "date": dt.date(2024, 2, 29),
    "time": dt.time(23, 59, 1, 5),
    "timedelta": dt.timedelta(days=-2, seconds=5, microseconds=7),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "decimal": decimal.Decimal("0.10"),
    "enum": Color.RED,
    "int_enum": Level.HIGH,
    "dataclass": Point(1, pathlib.Path("x"), ["t"]),
    "dataclass_init_false": Derived(4),
    "struct": Money(250),
    "set": {1, 2, 3},
    "frozenset": frozenset({"a"}),
    "nested": {"points": [Point(2, pathlib.Path("/y"))], "when": {dt.date(2024, 1, 1)}},
}


def assert_same(got: Any, want: Any) -> None:
    assert got == want
    assert type(got) is type(want)
    if isinstance(want, dt.datetime | dt.time):
        assert got.tzinfo == want.tzinfo and got.fold == want.fold
    if isinstance(want, decimal.Decimal):
        assert str(got) == str(want)  # 0.10 stays 0.10


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_state_round_trips(tmp_path: Path, name: str) -> None:
    ckpt = afk.StateCheckpoint(tmp_path / "ckpt")
    ckpt.save({"value": SAMPLES[name]})
    ckpt.close()
    assert_same(afk.StateCheckpoint(tmp_path / "ckpt").load()["value"], SAMPLES[name])


def test_effect_results_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    with Journal(path, "r", writable=True) as journal:
        for name, value in SAMPLES.items():
            assert journal.call(name, lambda v=value: v) is SAMPLES[name]
    with Journal(path, "r", writable=True) as journal:  # a fresh index: replayed from disk
        for name, value in SAMPLES.items():
            assert_same(journal.call(name, lambda: pytest.fail("replayed, not run")), value)


def test_ctx_state_and_step_results_round_trip_across_attempts(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    seen: list[Any] = []

    @afk.durable(store=store)
    def job(ctx: afk.RunContext, where: pathlib.Path) -> str:
        if "point" not in ctx.state:
            ctx.state["point"] = Point(1, where)
            ctx.state["when"] = dt.date(2024, 1, 2)
            ctx.checkpoint()
        seen.append((ctx.state["point"], ctx.state["when"], where))
        stamp = ctx.step("stamp", lambda: uuid.UUID(int=7))
        if ctx.attempt == 1:
            raise RuntimeError("crash after the step")
        return f"{stamp}"

    with pytest.raises(RuntimeError):
        job.run(pathlib.Path("/in"), run_id="typed")
    assert job.run(run_id="typed") == str(uuid.UUID(int=7))
    for point, when, where in seen:
        assert_same(point, Point(1, pathlib.Path("/in")))
        assert_same(when, dt.date(2024, 1, 2))
        assert_same(where, pathlib.Path("/in"))


def test_numpy_arrays_and_scalars_round_trip(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(6).reshape(2, 3)),
        "bool": np.array([True, False]),
        "str": np.array(["a", "bc"]),
        "empty": np.zeros((0, 4)),
        "scalar": np.float64(1.5),
        "int_scalar": np.int16(-3),
    }
    ckpt = afk.StateCheckpoint(tmp_path / "ckpt")
    ckpt.save(arrays)
    ckpt.close()
    got = afk.StateCheckpoint(tmp_path / "ckpt").load()
    for name, want in arrays.items():
        assert type(got[name]) is type(want), name
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert np.array_equal(got[name], want), name
    assert got["f32"].flags.writeable
    with Journal(tmp_path / "effects.log", "r", writable=True) as journal:
        journal.call("a", lambda: np.arange(3))
    with Journal(tmp_path / "effects.log", "r", writable=True) as journal:
        assert np.array_equal(journal.call("a", lambda: None), np.arange(3))
    with pytest.raises(UnstorableValueError, match=r"state\.objects: a numpy array of dtype"):
        afk.StateCheckpoint(tmp_path / "other").save({"objects": np.array([object()])})


def test_an_unstorable_value_is_named_by_its_path_and_type(tmp_path: Path) -> None:
    class Weights:
        pass

    ckpt = afk.StateCheckpoint(tmp_path / "ckpt")
    with pytest.raises(UnstorableValueError) as caught:
        ckpt.save({"model": {"weights": Weights()}})
    assert caught.value.path == "state.model.weights"
    assert str(caught.value).startswith(
        "cannot store state.model.weights: test_an_unstorable_value_is_named_by_its_path_and_"
        "type.<locals>.Weights (test_values) is neither msgpack data"
    )
    assert isinstance(caught.value, TypeError)  # code catching TypeError keeps working

    store = afk.Store(tmp_path / "store")

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> None:
        ctx.state["rows"] = [1, {"handle": open}]
        ctx.checkpoint()

    with pytest.raises(UnstorableValueError) as in_job:
        job.run(run_id="j")
    assert in_job.value.path == "state.rows.1.handle"
    assert str(in_job.value).startswith(
        "run 'j': cannot store state.rows.1.handle: builtin_function_or_method is neither"
    )


class Celsius:
    """A type msgspec cannot store: it goes through the store's enc_hook/dec_hook pair."""

    def __init__(self, degrees: float) -> None:
        self.degrees = degrees

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Celsius) and other.degrees == self.degrees


def enc_hook(obj: Any) -> Any:
    if isinstance(obj, Celsius):
        return obj.degrees
    raise NotImplementedError(f"cannot encode {type(obj)}")


def dec_hook(cls: type, data: Any) -> Any:
    if cls is Celsius:
        return Celsius(data)
    raise NotImplementedError(f"cannot decode {cls}")


def test_enc_hook_dec_hook_pair_in_msgspecs_convention(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, enc_hook=enc_hook, dec_hook=dec_hook)
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"t": Celsius(21.5), "p": Path("p")}, step=1)
        assert run.effects.call("k", lambda: [Celsius(-4.0)]) == [Celsius(-4.0)]
    reopened = afk.Store(tmp_path, enc_hook=enc_hook, dec_hook=dec_hook)
    assert reopened.open("r").latest().payload == {"t": Celsius(21.5), "p": Path("p")}
    assert reopened.open("r").effects()[-1].result == [Celsius(-4.0)]
    # a reader without the hooks (the CLI, the watcher) keeps the stored form, shows its data
    stored = afk.Store(tmp_path).open("r").latest().payload["t"]
    assert isinstance(stored, msgspec.msgpack.Ext)
    assert values.plain({"t": stored}) == {"t": 21.5}
    # an enc_hook alone (no dec_hook) gives back the hook's data, as before typed values
    assert afk.Store(tmp_path, enc_hook=enc_hook).open("r").latest().payload["t"] == 21.5


def test_classes_are_found_only_among_loaded_modules(tmp_path: Path) -> None:
    stored = msgspec.msgpack.Ext(
        values.EXT_DATACLASS,
        msgspec.msgpack.encode(["no_such_module_xyz:Thing", {"a": 1}]),
    )
    ckpt = afk.StateCheckpoint(tmp_path / "ckpt")
    ckpt.save({"thing": stored, "point": Point(1, pathlib.Path("p"))})
    ckpt.close()
    got = afk.StateCheckpoint(tmp_path / "ckpt").load()
    assert isinstance(got["thing"], msgspec.msgpack.Ext)  # not imported, not rebuilt
    assert got["thing"].data == stored.data  # and written back unchanged by any rewrite
    assert values.plain(got) == {"thing": {"a": 1}, "point": {"x": 1, "where": "p", "tags": []}}
    assert values.as_data(got["thing"]) == {"a": 1}


def test_plain_data_is_not_copied(tmp_path: Path) -> None:
    state = {"a": [1, "x", {"b": None}], "c": b"bytes"}
    assert values.tag(state) is state


class Other:
    """Not a dataclass: a hostile file must never turn a stored value into one of these."""


def test_a_stored_dataclass_sets_only_its_declared_fields(tmp_path: Path) -> None:
    # Crafted the way an attacker with write access would: the project's own encoder,
    # a valid frame, field names chosen to reach attributes a dataclass never declares.
    hostile = msgspec.msgpack.Ext(
        values.EXT_DATACLASS,
        msgspec.msgpack.encode(
            [
                values.type_name(Point),
                {"x": 1, "where": "p", "__class__": values.type_name(Other), "extra": 2},
            ]
        ),
    )
    stored = msgspec.msgpack.Ext(
        values.EXT_DATACLASS,
        msgspec.msgpack.encode([values.type_name(Point), {"x": 1, "__dict__": {"evil": True}}]),
    )
    ckpt = afk.StateCheckpoint(tmp_path / "ckpt")
    ckpt.save({"a": hostile, "b": stored})
    ckpt.close()
    got = afk.StateCheckpoint(tmp_path / "ckpt").load()
    for key in ("a", "b"):
        value = got[key]
        assert type(value) is not Other
        assert not hasattr(value, "extra") and not hasattr(value, "evil")
        # a value naming fields its class does not declare is kept as stored, not rebuilt
        assert isinstance(value, msgspec.msgpack.Ext)
