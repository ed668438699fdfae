"""``afk-local watch --install systemd|launchd``: start the watcher at login.

Writes a systemd user unit (``~/.config/systemd/user/``) or a LaunchAgent plist
(``~/Library/LaunchAgents/``) that runs ``python -m afk_local watch --root ROOT``
with this interpreter, and prints how to enable it. One service per store: the
name carries a short digest of the store's absolute path. ``$AFK_LOCAL_SERVICE_DIR``
(or the ``directory`` argument) overrides where the file goes, for tests.

systemd stops the service with ``KillMode=mixed``: SIGTERM goes to the watcher
only, which tells its children to checkpoint and exit, and SIGKILL follows
after ``TimeoutStopSec``.
"""

from __future__ import annotations

import hashlib
import os
import plistlib
import sys
from pathlib import Path
from typing import TextIO

from afk_local.storage import fsio
from afk_local.storage.store import default_root

SERVICE_DIR_ENV = "AFK_LOCAL_SERVICE_DIR"
LAUNCHD_LABEL_PREFIX = "dev.afk-local.watch"


def service_name(root: Path) -> str:
    """``afk-local-watch-<digest of root>``: one service per store."""
    digest = hashlib.blake2b(str(root).encode(), digest_size=4).hexdigest()
    return f"afk-local-watch-{digest}"


def service_dir(kind: str, directory: Path | None = None) -> Path:
    """Where the service file of ``kind`` goes (``directory``, else the env var, else default)."""
    if directory is not None:
        return directory
    override = os.environ.get(SERVICE_DIR_ENV)
    if override:
        return Path(override)
    if kind == "systemd":
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "systemd" / "user"
    return Path.home() / "Library" / "LaunchAgents"


def watch_command(root: Path, python: str | None = None) -> list[str]:
    """The command the service runs."""
    return [python or sys.executable, "-m", "afk_local", "watch", "--root", str(root)]


def _systemd_quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "/._-=:@+," for c in arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def systemd_unit(root: Path, python: str | None = None) -> str:
    """The text of the systemd user unit watching ``root``."""
    command = " ".join(_systemd_quote(a) for a in watch_command(root, python))
    lines = [
        "[Unit]",
        f"Description=afk_local watcher: resume interrupted runs in {root}",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={command}",
        "Environment=PYTHONUNBUFFERED=1",
    ]
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        lines.append(f"Environment={_systemd_quote('PYTHONPATH=' + pythonpath)}")
    lines += [
        "Restart=on-failure",
        "RestartSec=10",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def launchd_plist(root: Path, python: str | None = None) -> bytes:
    """The LaunchAgent plist watching ``root``."""
    label = f"{LAUNCHD_LABEL_PREFIX}.{service_name(root).rsplit('-', 1)[-1]}"
    env = {"PYTHONUNBUFFERED": "1"}
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    log_file = str(Path.home() / "Library" / "Logs" / f"{service_name(root)}.log")
    content = {
        "Label": label,
        "ProgramArguments": watch_command(root, python),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Background",
        "ExitTimeOut": 30,
        "EnvironmentVariables": env,
        "StandardOutPath": log_file,
        "StandardErrorPath": log_file,
    }
    return plistlib.dumps(content)


def service_path(kind: str, root: Path, directory: Path | None = None) -> Path:
    """The service file for ``root``."""
    if kind == "systemd":
        return service_dir(kind, directory) / f"{service_name(root)}.service"
    label = f"{LAUNCHD_LABEL_PREFIX}.{service_name(root).rsplit('-', 1)[-1]}"
    return service_dir(kind, directory) / f"{label}.plist"


def install(kind: str, root: Path, *, directory: Path | None = None) -> Path:
    """Write the service file of ``kind`` (``systemd`` or ``launchd``) for ``root``."""
    if kind not in ("systemd", "launchd"):
        raise ValueError(f"unknown service kind {kind!r}: use systemd or launchd")
    path = service_path(kind, root, directory)
    fsio.make_dirs(path.parent)
    data = systemd_unit(root).encode() if kind == "systemd" else launchd_plist(root)
    fsio.atomic_write(path, data)
    return path


def uninstall(kind: str, root: Path, *, directory: Path | None = None) -> list[Path]:
    """Remove the service file(s) for ``root`` (``kind`` ``auto``: both kinds); returns them."""
    kinds = ("systemd", "launchd") if kind == "auto" else (kind,)
    removed = []
    for one in kinds:
        path = service_path(one, root, directory)
        if path.exists():
            fsio.unlink(path)
            removed.append(path)
    return removed


def enable_hint(kind: str, path: Path) -> str:
    """What a person types to enable the service just written."""
    if kind == "systemd":
        return (
            "enable it with:\n"
            "  systemctl --user daemon-reload\n"
            f"  systemctl --user enable --now {path.name}\n"
            "and to keep it running while you are logged out: loginctl enable-linger $USER"
        )
    return f"enable it with:\n  launchctl load -w {path}"


def main_install(kind: str, root: Path, out: TextIO) -> int:
    """Install and print the path and how to enable it."""
    path = install(kind, root)
    out.write(f"wrote {path}\n{enable_hint(kind, path)}\n")
    return 0


def main_uninstall(kind: str, out: TextIO, root: Path | None = None) -> int:
    """Remove the service files and print what was removed (and how to stop it)."""

    the_root = (root or default_root()).resolve()
    removed = uninstall(kind, the_root)
    if not removed:
        out.write(f"no watcher service installed for {the_root}\n")
        return 0
    for path in removed:
        if path.suffix == ".service":
            out.write(
                f"removed {path}\n  (stop it with: systemctl --user disable --now {path.name}; "
                "systemctl --user daemon-reload)\n"
            )
        else:
            out.write(f"removed {path}\n  (stop it with: launchctl unload {path})\n")
    return 0
