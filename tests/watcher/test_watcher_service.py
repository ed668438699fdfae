"""``afk-local watch --install systemd|launchd``: the generated files (not the init systems)."""

from __future__ import annotations

import os
import plistlib
import stat
import subprocess
import sys
from pathlib import Path

from afk_local.watcher import service as watcher_service


def cli(*args: str, service_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, watcher_service.SERVICE_DIR_ENV: str(service_dir)}
    return subprocess.run(
        [sys.executable, "-m", "afk_local", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_systemd_unit_runs_the_watcher_for_this_store(tmp_path: Path) -> None:
    root = tmp_path / "my store"
    services = tmp_path / "units"
    res = cli("watch", "--root", str(root), "--install", "systemd", service_dir=services)
    assert res.returncode == 0, res.stderr
    [unit] = list(services.iterdir())
    assert unit.name.startswith("afk-local-watch-") and unit.suffix == ".service"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o600
    text = unit.read_text()
    assert f'ExecStart={sys.executable} -m afk_local watch --root "{root.resolve()}"' in text
    assert "KillMode=mixed" in text  # SIGTERM to the watcher only; it stops its children
    assert "KillSignal=SIGTERM" in text
    assert "Restart=on-failure" in text
    assert "WantedBy=default.target" in text
    assert f"systemctl --user enable --now {unit.name}" in res.stdout

    res = cli("watch", "--root", str(root), "--uninstall", service_dir=services)
    assert res.returncode == 0, res.stderr
    assert not unit.exists()
    assert "removed" in res.stdout


def test_launchd_plist_runs_at_load(tmp_path: Path) -> None:
    root = tmp_path / "store"
    services = tmp_path / "agents"
    res = cli("watch", "--root", str(root), "--install", "launchd", service_dir=services)
    assert res.returncode == 0, res.stderr
    [path] = list(services.iterdir())
    assert path.suffix == ".plist"
    plist = plistlib.loads(path.read_bytes())
    assert plist["Label"].startswith("dev.afk-local.watch.")
    assert plist["ProgramArguments"] == [
        sys.executable, "-m", "afk_local", "watch", "--root", str(root.resolve()),
    ]  # fmt: skip
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert f"launchctl load -w {path}" in res.stdout
    res = cli("watch", "--root", str(root), "--uninstall", "launchd", service_dir=services)
    assert res.returncode == 0 and not path.exists()


def test_one_service_per_store(tmp_path: Path) -> None:
    a = watcher_service.install("systemd", tmp_path / "a", directory=tmp_path / "u")
    b = watcher_service.install("systemd", tmp_path / "b", directory=tmp_path / "u")
    assert a != b
    assert watcher_service.uninstall("auto", tmp_path / "a", directory=tmp_path / "u") == [a]
    assert b.exists()
