"""``afk-local watch --install systemd|launchd``: start the watcher at login.

Writes a systemd user unit (``~/.config/systemd/user/``) or a LaunchAgent plist
(``~/Library/LaunchAgents/``) that runs ``python -m afk_local watch --root ROOT``
with this interpreter, in the current directory, with the ``PATH``,
``PYTHONPATH`` and ``VIRTUAL_ENV`` of the installing shell, and prints how to
enable it (each run's own interpreter, directory and ``sys.path`` are recorded in
the run and used by the watcher's children: :mod:`afk_local.runner.code.origin`). One
service per store: the name carries a short digest of the store's absolute path.
``$AFK_LOCAL_SERVICE_DIR`` (or the ``directory`` argument) overrides where the
file goes, for tests. Paths are escaped for systemd (``%``, ``$``, quotes,
backslashes); a path with a control character (a newline) is refused.

systemd stops the service with ``KillMode=mixed``: SIGTERM goes to the watcher
only, which tells its children to checkpoint and exit, and SIGKILL follows
after ``TimeoutStopSec``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import TextIO

from afk_local.storage import fsio
from afk_local.storage.rundir.options import default_root

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


SERVICE_ENV = ("PATH", "PYTHONPATH", "VIRTUAL_ENV")
"""Variables of the installing shell the service keeps: where programs and modules are found.

Never ``AFK_LOCAL_KEY``: a key does not go into a service file (docs/watcher.md)."""


def service_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the service gives the watcher (and so its children)."""
    env = os.environ if environ is None else environ
    kept = {"PYTHONUNBUFFERED": "1"}
    for name in SERVICE_ENV:
        if env.get(name):
            kept[name] = env[name]
    return kept


def check_text(what: str, value: str) -> str:
    """``value``, or ValueError when a control character (a newline...) could not be written.

    A newline in a unit file ends the line and would start a directive of its own;
    systemd has no way to write one in ``WorkingDirectory=``, and launchd's XML none
    for most control characters. Such paths are refused, not guessed at.
    """
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(
            f"cannot write a login service: the {what} {value!r} contains a control "
            f"character ({bad!r}); use a path without one"
        )
    return value


def _specifiers(text: str) -> str:
    return text.replace("%", "%%")  # systemd expands %h, %i... everywhere, quoted or not


def _systemd_quote(arg: str) -> str:
    """One ``ExecStart=`` argument: systemd splits on spaces, unquotes, expands $VAR and %x."""
    check_text("command argument", arg)
    if arg and all(c.isalnum() or c in "/._-=:@+," for c in arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + _specifiers(escaped).replace("$", "$$") + '"'


def _systemd_assignment(name: str, value: str) -> str:
    """One ``Environment=`` assignment (quoted; ``$`` is not special there)."""
    check_text(f"value of {name}", value)
    escaped = f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"')
    return '"' + _specifiers(escaped) + '"'


def _working_directory(cwd: str) -> str:
    check_text("working directory", cwd)
    if cwd != cwd.strip() or not os.path.isabs(cwd):
        raise ValueError(
            f"cannot write a login service: the working directory {cwd!r} must be an "
            "absolute path without leading or trailing spaces"
        )
    return _specifiers(cwd)


def systemd_unit(
    root: Path,
    python: str | None = None,
    *,
    cwd: str | None = None,
    environ: dict[str, str] | None = None,
) -> str:
    """The text of the systemd user unit watching ``root``.

    It runs this interpreter, in ``cwd`` (default: the current directory), with the
    environment of :func:`service_environment`. Paths are quoted and escaped for
    systemd; a path with a control character is refused (ValueError).
    """
    where = check_text("store directory", str(root))
    command = " ".join(_systemd_quote(a) for a in watch_command(root, python))
    lines = [
        "[Unit]",
        f"Description=afk_local watcher: resume interrupted runs in {_specifiers(where)}",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={_working_directory(cwd or os.getcwd())}",
        f"ExecStart={command}",
    ]
    for name, value in service_environment(environ).items():
        lines.append(f"Environment={_systemd_assignment(name, value)}")
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


def launchd_plist(
    root: Path,
    python: str | None = None,
    *,
    cwd: str | None = None,
    environ: dict[str, str] | None = None,
) -> bytes:
    """The LaunchAgent plist watching ``root`` (interpreter, working directory, environment)."""
    label = f"{LAUNCHD_LABEL_PREFIX}.{service_name(root).rsplit('-', 1)[-1]}"
    arguments = [check_text("command argument", a) for a in watch_command(root, python)]
    env = {k: check_text(f"value of {k}", v) for k, v in service_environment(environ).items()}
    log_file = str(Path.home() / "Library" / "Logs" / f"{service_name(root)}.log")
    content = {
        "Label": label,
        "ProgramArguments": arguments,
        "WorkingDirectory": _working_directory(cwd or os.getcwd()).replace("%%", "%"),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Background",
        "ExitTimeOut": 30,
        "EnvironmentVariables": env,
        "StandardOutPath": log_file,
        "StandardErrorPath": log_file,
    }
    import plistlib  # noqa: PLC0415 - macOS only (it loads an XML parser)

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
