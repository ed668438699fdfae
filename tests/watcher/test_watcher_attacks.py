"""The watcher against hostile stores, with real processes (docs/security.md).

One sweep over a store holding one legitimate interrupted run and many hostile ones:
the legitimate run completes (so the watcher did work), every hostile one is refused
or left alone without hanging, reported once, and no payload ran (no marker file).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from attacks import afk, agent_meta_params, plant_meta, watch_events

import afk_local as afk_api
from afk_local.storage.format.records import RunStatus
from afk_local.watcher.requests import Request, submit_request

KEY = "watcher attack key"


def touch(root: Path, run_id: str, marker: Path, **kwargs) -> None:
    plant_meta(
        root,
        run_id,
        entrypoint="attack_jobs:touch_marker",
        params={"args": [str(marker)], "kwargs": {}},
        **kwargs,
    )


def of(events: list[dict], kind: str) -> dict[str, dict]:
    return {e.get("run_id"): e for e in events if e["event"] == kind}


def test_one_sweep_refuses_every_hostile_run_and_resumes_the_legitimate_one(
    tmp_path: Path,
) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    touch(root, "legit", out / "legit")
    # entrypoints that name something else than an @afk.durable job or an agent factory
    entry, params, extra = agent_meta_params(out / "subprocess")
    plant_meta(root, "agent-subprocess", entrypoint=entry, params=params, extra=extra)
    plant_meta(
        root,
        "plain-function",
        entrypoint="attack_jobs:plain_function",
        params={"context": {}},
        extra={"kind": "agent"},
    )
    # an imported run nobody trusted
    touch(root, "imported", out / "imported", extra={"imported": {"source": "x.json"}})
    # logs/ a symlink out of the store; attempt logs that are FIFOs (the run itself is
    # legitimate: it must complete, with no attempt log opened on a FIFO and no hang)
    touch(root, "symlinked-logs", out / "symlinked-logs")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "runs" / "symlinked-logs" / "logs")
    touch(root, "fifo-log", out / "fifo-log")
    (root / "runs" / "fifo-log" / "logs").mkdir(mode=0o700)
    for n in (1, 2):  # the next attempt's log, whichever number it gets
        os.mkfifo(root / "runs" / "fifo-log" / "logs" / f"attempt-{n}.log", 0o600)
    # a newer schema version; a run.meta that is a FIFO
    touch(root, "future", out / "future", schema_version=99)
    (root / "runs" / "fifo-meta").mkdir(mode=0o700)
    os.mkfifo(root / "runs" / "fifo-meta" / "run.meta", 0o600)
    # requests: a submit naming subprocess:run, a symlinked and a FIFO request file
    store = afk_api.Store(root)
    submit_request(store, "subprocess:run", [["touch", str(out / "submitted")]], run_id="sub")
    os.symlink(tmp_path / "elsewhere", root / "requests" / "0-resume-link.json")
    os.mkfifo(root / "requests" / "0-resume-fifo.json", 0o600)
    foreign = submit_request(
        store, "attack_jobs:touch_marker", [str(out / "foreign")], run_id="foreign"
    )[1]
    if os.geteuid() == 0:  # another local user's request (needs root to make)
        os.chown(foreign, 4242, 4242)
    else:
        foreign.unlink()

    code, events = watch_events(root)

    assert (out / "legit").exists(), events  # the watcher did run what it should
    assert sorted(p.name for p in out.iterdir()) == ["fifo-log", "legit"], events  # only that
    assert {"legit", "fifo-log"} <= set(of(events, "completed"))
    refused = of(events, "refused")
    assert "imported from x.json" in refused["imported"]["message"]
    assert "symlink" in refused["symlinked-logs"]["message"]
    assert "schema version 99" in of(events, "skipped")["future"]["message"]
    # the type check runs in the child (after the gate): it exits 2 and is given up on
    for run_id in ("agent-subprocess", "plain-function", "sub"):
        meta = store.read_meta(run_id)
        assert meta.status is RunStatus.FAILED, (run_id, meta)
        assert "not an Agent" in meta.error.message or "@afk.durable" in meta.error.message
    rejected = [e["message"] for e in events if e["event"] == "rejected"]
    assert any("0-resume-link.json" in m and "symlink" in m for m in rejected), rejected
    assert any("0-resume-fifo.json" in m and "FIFO" in m for m in rejected), rejected
    if os.geteuid() == 0:
        assert any(foreign.name in m and "owned by uid 4242" in m for m in rejected), rejected
    assert code == 1  # problems were found


def test_keyed_store_without_the_key_and_unsigned_files_with_it(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    keyed = afk_api.Store(root, key=KEY)
    with keyed.create(
        "legit",
        entrypoint="attack_jobs:touch_marker",
        params={"args": [str(out / "legit")], "kwargs": {}},
    ) as run:
        run.checkpoint("runtime_state", {}, step=1)  # left running: interrupted
    # An unsigned run.meta naming a module whose import alone leaves a marker.
    plant_meta(root, "evil", entrypoint="hostile_import:job")
    # An unsigned submit request, as someone without the key can write.
    unsigned = Request(
        kind="submit",
        run_id="sub",
        entrypoint="attack_jobs:touch_marker",
        args=[str(out / "submitted")],
    )
    (root / "requests").mkdir(mode=0o700, exist_ok=True)
    (root / "requests" / "0-submit-unsigned.json").write_bytes(msgspec.json.encode(unsigned))
    marker_env = {"AFK_HOSTILE_MARKER": str(out / "imported")}
    # A run put back from an older copy (after its head record moved on).
    with keyed.create(
        "rolled",
        entrypoint="attack_jobs:touch_marker",
        params={"args": [str(out / "rolled")], "kwargs": {}},
    ) as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    old = {p.name: p.read_bytes() for p in keyed.paths("rolled").dir.iterdir() if p.is_file()}
    with keyed.resume_writer("rolled") as run:
        run.checkpoint("runtime_state", {"i": 2}, step=2)
    for p in keyed.paths("rolled").dir.glob("*.ckpt"):
        p.unlink()
    for name, data in old.items():
        (keyed.paths("rolled").dir / name).write_bytes(data)
    # A request submitted the proper way, with the key: it is signed and runs.
    submitted = afk(
        root,
        "submit",
        "attack_jobs:touch_marker",
        f'["{out / "signed"}"]',
        env={"AFK_LOCAL_KEY": KEY},
    )
    assert submitted.returncode == 0, submitted.stderr

    # Without the key the watcher executes nothing from a keyed store: one line, exit 2.
    res = afk(root, "watch", "--once", env=marker_env)
    assert res.returncode == 2 and "keyed store" in res.stderr and "Traceback" not in res.stderr

    code, events = watch_events(root, env={"AFK_LOCAL_KEY": KEY, **marker_env})
    assert code == 1, events  # a rolled-back run refused, an unsigned request rejected
    assert (out / "legit").exists() and (out / "signed").exists(), events
    assert sorted(p.name for p in out.iterdir()) == ["legit", "signed"], events
    assert "unsigned record in a keyed store" in of(events, "skipped")["evil"]["message"]
    assert "rolled back" in of(events, "refused")["rolled"]["message"]
    rejected = [e["message"] for e in events if e["event"] == "rejected"]
    assert any("unsigned" in m for m in rejected), rejected
