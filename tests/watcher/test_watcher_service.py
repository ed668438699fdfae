"""``afk-local watch --install systemd|launchd``: the generated files (not the init systems).

The systemd install runs as a real ``python -m afk_local`` in its own working directory
(the unit records both); the other commands run in-process (``cli_inproc``).
"""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import proc
import pytest
from cli_inproc import run_cli

from afk_local.watcher import service as watcher_service


def cli(
    *args: str, service_dir: Path, cwd: Path | None = None, real: bool = False
) -> subprocess.CompletedProcess[str]:
    """``afk-local args...`` with the service files going to ``service_dir``: in this
    process (the files and the output are the point), or ``real``: as ``python -m
    afk_local`` in ``cwd``."""
    if not real:
        assert cwd is None, "an in-process command runs in the test's directory"
        return run_cli(args, env={watcher_service.SERVICE_DIR_ENV: str(service_dir)})
    env = {**os.environ, watcher_service.SERVICE_DIR_ENV: str(service_dir)}
    return proc.python(["-m", "afk_local", *args], env=env, timeout=60, cwd=cwd)


def test_systemd_unit_runs_the_watcher_for_this_store(tmp_path: Path) -> None:
    root = tmp_path / "my store"
    services = tmp_path / "units"
    res = cli(
        "watch", "--root", str(root), "--install", "systemd",
        service_dir=services, cwd=tmp_path, real=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert root.is_dir()  # --install creates the store it will watch
    [unit] = list(services.iterdir())
    assert unit.name.startswith("afk-local-watch-") and unit.suffix == ".service"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o600
    text = unit.read_text()
    assert f'ExecStart={sys.executable} -m afk_local watch --root "{root.resolve()}"' in text
    # where jobs are found: its working directory, interpreter and search paths
    assert f"WorkingDirectory={tmp_path}" in text.splitlines()
    assert f'Environment="PATH={os.environ["PATH"]}"' in text.splitlines()
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


def test_unit_escapes_what_systemd_would_expand_and_refuses_control_characters(
    tmp_path: Path,
) -> None:
    odd = tmp_path / 'a $HOME %h "quoted" back\\slash'
    unit = watcher_service.systemd_unit(
        odd, cwd=str(tmp_path / "50%"), environ={"PYTHONPATH": "/opt/my lib:$X %i"}
    )
    lines = unit.splitlines()
    root_arg = str(odd).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    assert (
        f'ExecStart={sys.executable} -m afk_local watch --root "{root_arg.replace("$", "$$")}"'
        in lines
    )
    assert f"WorkingDirectory={tmp_path}/50%%" in lines
    assert 'Environment="PYTHONPATH=/opt/my lib:$X %%i"' in lines  # no $ expansion there
    if shutil.which("systemd-analyze"):  # systemd's own parser accepts the unit
        path = tmp_path / "odd.service"
        path.write_text(
            unit.replace(f"WorkingDirectory={tmp_path}/50%%", f"WorkingDirectory={tmp_path}")
        )
        checked = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stderr

    for bad in (tmp_path / "a\nExecStartPre=/bin/sh", tmp_path / "tab\there"):
        with pytest.raises(ValueError, match="contains a control character"):
            watcher_service.systemd_unit(bad)
        with pytest.raises(ValueError, match="contains a control character"):
            watcher_service.launchd_plist(bad)
    with pytest.raises(ValueError, match="working directory"):
        watcher_service.systemd_unit(tmp_path, cwd=str(tmp_path / "new\nline"))
    res = cli(
        "watch", "--root", str(tmp_path / "x\ny"), "--install", "systemd",
        service_dir=tmp_path / "units",
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "invalid store root" in res.stderr and "line break" in res.stderr
    assert not (tmp_path / "units").exists() and not (tmp_path / "x\ny").exists()


def test_launchd_plist_sets_working_directory_and_environment(tmp_path: Path) -> None:
    plist = plistlib.loads(
        watcher_service.launchd_plist(
            tmp_path / "store", cwd=str(tmp_path), environ={"PATH": "/bin", "AFK_LOCAL_KEY": "k"}
        )
    )
    assert plist["WorkingDirectory"] == str(tmp_path)
    assert plist["EnvironmentVariables"] == {"PYTHONUNBUFFERED": "1", "PATH": "/bin"}  # no key
