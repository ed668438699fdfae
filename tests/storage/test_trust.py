"""The trust gate (storage/trust.py, docs/security.md): a store is data, never instructions.

Each test is one attack by someone who can write into a store (another local user, a
synced folder, a downloaded export), crafted with afk_local's own encoder, against the
real command line in a child process. A payload that ran would create a marker file:
it must be absent, and the refusal must be one line naming the path and what to do.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

import pytest
from attacks import afk, one_line_error, plant_meta

import afk_local as afk_api
from afk_local.storage import trust
from afk_local.storage.trust import require_trusted_run, trust_run

KEY = "trust test key"


def touch_run(root: Path, run_id: str, marker: Path, **kwargs) -> Path:
    """A run.meta naming a real @afk.durable job that would create ``marker``."""
    return plant_meta(
        root,
        run_id,
        entrypoint="attack_jobs:touch_marker",
        params={"args": [str(marker)], "kwargs": {}},
        **kwargs,
    )


def test_a_store_others_can_write_is_never_executed_from(tmp_path: Path) -> None:
    root, marker = tmp_path / "store", tmp_path / "ran"
    afk_api.Store(root).runs()  # nothing yet
    touch_run(root, "r", marker)
    os.chmod(root, 0o777)  # another local user could have planted that meta
    res = afk(root, "resume", "r")
    assert res.returncode == 2 and not marker.exists()
    line = one_line_error(res)
    assert "writable by its group or by others" in line and "chmod go-w" in line
    # read-only commands still read it, with a warning
    shown = afk(root, "show", "r")
    assert shown.returncode == 0 and "warning" in shown.stderr and "writable" in shown.stderr
    os.chmod(root, 0o700)
    os.chmod(root / "runs" / "r", 0o770)  # the run directory alone is enough too
    res = afk(root, "resume", "r")
    assert res.returncode == 2 and "group or by others" in one_line_error(res)
    assert not marker.exists()
    os.chmod(root / "runs" / "r", 0o700)  # the owner's own, private store: it runs
    assert afk(root, "resume", "r").returncode == 0 and marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_run_owned_by_another_user_is_never_executed(tmp_path: Path) -> None:
    root, marker = tmp_path / "store", tmp_path / "ran"
    meta = touch_run(root, "r", marker)
    os.chown(meta, 4242, 4242)
    res = afk(root, "resume", "r")
    assert res.returncode == 2 and "owned by uid 4242" in one_line_error(res)
    os.chown(meta, 0, 0)
    os.chown(root / "runs", 4242, 4242)
    res = afk(root, "resume", "r")
    assert res.returncode == 2 and "owned by uid 4242" in one_line_error(res)
    assert not marker.exists()


def test_a_symlinked_run_dir_is_refused_never_followed(tmp_path: Path) -> None:
    root, elsewhere, marker = tmp_path / "store", tmp_path / "elsewhere", tmp_path / "ran"
    touch_run(elsewhere, "r", marker)
    (root / "runs").mkdir(parents=True, mode=0o700)
    os.symlink(elsewhere / "runs" / "r", root / "runs" / "r")
    for command in (["resume", "r"], ["show", "r"], ["inspect", "r"]):
        res = afk(root, *command)
        assert res.returncode == 2, res.stderr
        assert "is a symlink" in one_line_error(res) or "not a directory" in res.stderr
    assert not marker.exists()
    store = afk_api.Store(root)
    assert store.run_ids() == []  # not listed, not swept by the watcher
    with pytest.raises(afk_api.UntrustedStoreError, match="symlink"):
        store.open("r")
    with pytest.raises(afk_api.UntrustedStoreError, match="symlink"):
        store.create("r")


def test_keyless_process_never_executes_from_a_keyed_store(tmp_path: Path) -> None:
    """An unsigned run.meta planted in a keyed store: refused with the key (no MAC) and,
    without the key, because the store is known to be keyed — even without its marker."""
    root, marker = tmp_path / "store", tmp_path / "ran"
    with afk_api.Store(root, key=KEY).create("legit") as run:
        run.checkpoint("runtime_state", {}, step=1)
    assert (root / "keyed").is_file()
    touch_run(root, "evil", marker)  # no MAC: the attacker has no key
    with_key = {"AFK_LOCAL_KEY": KEY}
    res = afk(root, "resume", "evil", env=with_key)
    assert res.returncode == 2 and "unsigned record in a keyed store" in one_line_error(res)
    res = afk(root, "resume", "evil")
    assert res.returncode == 2 and "keyed store" in one_line_error(res)
    with pytest.raises(afk_api.UntrustedStoreError, match="another key"):
        afk_api.Store(root, key="not the key").create("x")  # another key is told so at once
    (root / "keyed").unlink()  # the attacker removes the marker too
    res = afk(root, "resume", "evil")
    assert res.returncode == 2 and "keyed store" in one_line_error(res)
    # A keyed run.meta swapped for the signed meta of another run is refused too.
    shutil.copyfile(root / "runs" / "legit" / "run.meta", root / "runs" / "evil" / "run.meta")
    res = afk(root, "resume", "evil", env=with_key)
    assert res.returncode == 2 and "HMAC mismatch" in one_line_error(res)
    assert not marker.exists()


def test_an_imported_run_never_executes_until_trusted(tmp_path: Path) -> None:
    source, marker = tmp_path / "theirs", tmp_path / "ran"
    touch_run(source, "r", marker)
    export = tmp_path / "r.json"
    assert afk(source, "export", "r", "-o", str(export)).returncode == 0
    assert (export.stat().st_mode & 0o777) == 0o600  # exports hold conversations and tokens
    for keyed in (False, True):
        root = tmp_path / f"mine-{keyed}"
        env = {"AFK_LOCAL_KEY": KEY} if keyed else {}
        assert afk(root, "import", str(export), env=env).returncode == 0
        res = afk(root, "resume", "r", env=env)
        assert res.returncode == 2 and not marker.exists()
        assert "imported from" in one_line_error(res) and "--trust" in res.stderr
        if keyed:  # signing it made it readable, not trusted: no laundering
            assert afk(root, "verify", env=env).returncode == 0
    res = afk(root, "resume", "r", "--trust", env={"AFK_LOCAL_KEY": KEY})
    assert res.returncode == 0 and marker.exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c[0].update(phase="../../x"), "invalid phase"),
        (lambda c: c[0].update(seq=0), "seq 0 out of range"),
        (lambda c: c.append(dict(c[0])), "a second checkpoint with this seq"),
        (lambda c: c[0].update(step="1"), "Expected `int`, got `str`"),
        (lambda c: c[0].update(schema_version=99), "schema_version 99"),
    ],
)
def test_import_validates_every_field_first(tmp_path: Path, edit, message) -> None:
    import json  # noqa: PLC0415

    store = afk_api.Store(tmp_path / "src")
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    from afk_local.storage.ops.export import export_records, import_run  # noqa: PLC0415

    records = export_records(store.open("r"))
    checkpoints = [r["checkpoint"] for r in records if r["type"] == "checkpoint"]
    edit(checkpoints)
    doc = {
        "format": "afk-local-export",
        "meta": next(r["meta"] for r in records if r["type"] == "meta"),
        "checkpoints": checkpoints,
        "effects": [],
    }
    target = afk_api.Store(tmp_path / "dst")
    with pytest.raises(afk_api.AfkLocalError, match="checkpoint #") as info:
        import_run(target, json.dumps(doc), source="x.json")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert target.run_ids() == []  # nothing was written


def test_gate_refuses_a_rolled_back_run_and_trust_accepts_it(tmp_path: Path) -> None:
    """Whole-snapshot rollback: the run directory put back from an older copy."""
    root, marker = tmp_path / "store", tmp_path / "ran"
    store = afk_api.Store(root, key=KEY)
    with store.create("r", entrypoint="attack_jobs:touch_marker") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    with tarfile.open(tmp_path / "snap.tar", "w") as tar:
        tar.add(root / "runs" / "r", arcname="r")
    with store.resume_writer("r") as run:
        run.checkpoint("runtime_state", {"i": 2}, step=2)
        run.effects.call("pay", lambda: "paid")
    shutil.rmtree(root / "runs" / "r")
    with tarfile.open(tmp_path / "snap.tar") as tar:
        tar.extractall(root / "runs", filter="tar")
    with pytest.raises(afk_api.RunRolledBackError, match="rolled back"):
        require_trusted_run(store, "r")
    res = afk(root, "resume", "r", env={"AFK_LOCAL_KEY": KEY})
    assert res.returncode == 2 and "rolled back" in one_line_error(res) and not marker.exists()
    res = afk(root, "verify", "r", env={"AFK_LOCAL_KEY": KEY})
    assert res.returncode == 1 and "rolled back" in res.stdout
    trust_run(store, "r")  # the owner put it back on purpose
    assert store.open("r", lazy=True).verify().ok
    assert require_trusted_run(store, "r").meta.run_id == "r"


def test_gate_beside_a_new_attempt_of_a_keyed_run_is_not_fooled_into_a_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate reads run.meta, another process starts an attempt (meta and head move),
    then the gate reads the head: the run moved forward and is not refused as rolled
    back; the gate returns the meta its check compared, the newer one."""
    store = afk_api.Store(tmp_path / "store", key=KEY, head_dir=tmp_path / "heads")
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
        run.fail(ValueError("the first attempt fails"))
    real_read_meta = trust.read_meta
    attempts = []

    def read_meta_with_an_attempt_starting(*args, **kwargs):
        meta = real_read_meta(*args, **kwargs)
        if not attempts:  # the first read: the attempt starts right after it
            attempts.append(store.resume_writer("r"))
        return meta

    monkeypatch.setattr(trust, "read_meta", read_meta_with_an_attempt_starting)
    try:
        trusted = require_trusted_run(store, "r")
    finally:
        attempts[0].close()
    assert trusted.meta.attempt == 2


def test_restart_never_launders_a_run_it_may_not_execute(tmp_path: Path) -> None:
    # restart writes a new run of the old one's job: this process's own, so it would pass
    # every check itself. The old run has to pass them first.
    source, marker = tmp_path / "theirs", tmp_path / "ran"
    touch_run(source, "r", marker)
    export = tmp_path / "r.json"
    assert afk(source, "export", "r", "-o", str(export)).returncode == 0
    root = tmp_path / "mine"
    assert afk(root, "import", str(export)).returncode == 0
    res = afk(root, "restart", "r", "--as", "again")
    assert res.returncode == 2 and "imported from" in one_line_error(res)
    assert not marker.exists() and not (root / "runs" / "again").exists()

    plain = tmp_path / "plain"
    touch_run(plain, "w", marker)
    os.chmod(plain, 0o777)  # anyone may write this store
    res = afk(plain, "restart", "w", "--as", "again")
    assert res.returncode == 2 and not marker.exists()
    assert not (plain / "runs" / "again").exists()
