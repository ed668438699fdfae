"""The commands a message advises, cut out of its text (tests that run them as printed)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

Cli = Callable[..., tuple[int, str, str]]
"""``cli(*argv)`` -> (exit code, stdout, stderr): the CLI run as a person types it."""

_QUOTED = re.compile(r"`(afk-local [^`]+)`")
_UNQUOTED = re.compile(r"(?::| with) (afk-local [^`\n(;]+?)\s*(?:\(|;|$)", re.MULTILINE)


_SERVICES = ("afk-local watch", "afk-local ui")
"""Long-running services a message names as an alternative ("or let `afk-local watch` do
it"): not run here (the watcher's own tests cover what it does)."""


def advised(text: str) -> list[str]:
    """The one-shot ``afk-local ...`` commands ``text`` advises, in order: each one quoted
    in backticks, or unquoted after a colon or "with" ("start it with: afk-local ...",
    "remove it with afk-local ...") to the end of its clause."""
    found = [(m.start(), m.group(1)) for m in _QUOTED.finditer(text)]
    found += [(m.start(), m.group(1)) for m in _UNQUOTED.finditer(text)]
    return [c for _, c in sorted(found) if not c.startswith(_SERVICES)]


def follow(cli: Cli, text: str, *, root: Path | None = None, **fill: str) -> list[tuple[int, str]]:
    """Run every command ``text`` advises as printed (``--root`` added when the message
    names no store, as a person in another directory would); placeholders are replaced
    by ``fill`` (``JSON='"blue"'``). Returns (exit code, output) per command."""
    commands = advised(text)
    assert commands, f"no command advised in: {text!r}"
    results = []
    for command in commands:
        words = shlex.split(command)[1:]
        words = [fill.get(w, w) for w in words]
        assert all(not w.isupper() or w in ("--root",) for w in words), (command, fill)
        if root is not None and "--root" not in words:
            words = ["--root", str(root), *words]
        code, out, err = cli(*words)
        results.append((code, out + err))
    return results
