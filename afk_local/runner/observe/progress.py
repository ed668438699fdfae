"""Progress display for ``ctx.iterate``: whatever suits where the output goes.

- a Jupyter notebook: a tqdm widget when tqdm and ipywidgets are installed, else
  plain lines (never tqdm's "IProgress not found" warning);
- a terminal: tqdm when installed, else rich when installed, else one line
  rewritten in place (``\\r``);
- anything else (a log file, a pipe, the watcher's ``logs/``): a plain line every
  :data:`LOG_INTERVAL_S` seconds and one at the end, never a ``\\r``.

The rate (and so the ETA) counts only the items this attempt did, not those an
earlier attempt finished. The library never prints; a progress display the user
asked for (``progress=True``) is the one exception, written to stderr.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any, TextIO

from afk_local.storage.views.run_progress import format_duration

LOG_INTERVAL_S = 10.0
"""Seconds between two plain progress lines (logs and notebooks without widgets)."""
_INLINE_INTERVAL_S = 0.25


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), without importing IPython."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    return shell is not None and any(
        cls.__name__ == "ZMQInteractiveShell" for cls in type(shell).__mro__
    )


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """A progress display: ``update()`` per item, ``close()`` at the end.

    Args:
        total: number of items, or None when unknown.
        initial: items already done (skipped on resume; not part of the rate).
        desc: the label shown in front.
        enabled: False makes every method a no-op.
        file: where to write (default ``sys.stderr``).
    """

    def __init__(
        self,
        total: int | None,
        initial: int = 0,
        *,
        desc: str = "",
        enabled: bool = True,
        file: TextIO | None = None,
    ) -> None:
        self.total = total
        self.count = initial
        self.initial = initial
        self.desc = desc
        self.kind = "none"
        """Which display is used: ``tqdm``, ``rich``, ``inline``, ``lines`` or ``none``."""
        self._stream: Any = file if file is not None else sys.stderr
        self._bar: Any = None
        self._rich: Any = None
        self._task: Any = None
        self._started = time.monotonic()
        self._last = 0.0
        self._width = 0  # of the inline line on screen, to blank what a shorter one leaves
        self._closed = not enabled
        if enabled:
            self._open()

    def _open(self) -> None:
        if in_notebook():
            if self._open_tqdm(notebook=True):
                return
            self.kind = "lines"
        elif _isatty(self._stream):
            if self._open_tqdm(notebook=False) or self._open_rich():
                return
            self.kind = "inline"
        else:
            self.kind = "lines"
        self._line()

    def _open_tqdm(self, *, notebook: bool) -> bool:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tqdm's widget warnings are not the user's concern
                if notebook:
                    import ipywidgets  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401, PLC0415
                    from tqdm.notebook import tqdm  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
                else:
                    from tqdm.std import tqdm  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
                kwargs: dict[str, Any] = {} if notebook else {"file": self._stream}
                self._bar = tqdm(
                    total=self.total,
                    initial=self.initial,
                    desc=self.desc,
                    dynamic_ncols=True,
                    **kwargs,
                )
        except Exception:  # not installed, or no widget frontend: another display
            return False
        self.kind = "tqdm"
        return True

    def _open_rich(self) -> bool:
        try:
            from rich.console import Console  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
            from rich.progress import (  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress  # noqa: PLC0415
        except ImportError:
            return False
        self._rich = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            console=Console(file=self._stream),
        )
        self._rich.start()
        self._task = self._rich.add_task(self.desc, total=self.total, completed=self.initial)
        self.kind = "rich"
        return True

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        if self._closed:
            return
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._rich is not None:
            self._rich.advance(self._task, n)
        else:
            interval = LOG_INTERVAL_S if self.kind == "lines" else _INLINE_INTERVAL_S
            if time.monotonic() - self._last >= interval:
                self._line()

    def close(self) -> None:
        """Finish the display (a last line with the totals for the plain ones)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._rich is not None:
            self._rich.stop()
        else:
            self._line(last=True)

    def text(self) -> str:
        """The plain progress line: ``desc: 40/100 (40%) 12.5 it/s, ETA 5s, elapsed 3s``."""
        elapsed = time.monotonic() - self._started
        parts = [f"{self.count}/{self.total}" if self.total is not None else str(self.count)]
        if self.total:
            parts.append(f"({self.count / self.total:.0%})")
        gained = self.count - self.initial
        rate = gained / elapsed if elapsed > 0 and gained > 0 else None
        if rate is not None:
            parts.append(f"{rate:.1f} it/s,")
            if self.total is not None and self.count < self.total:
                parts.append(f"ETA {format_duration((self.total - self.count) / rate)},")
        parts.append(f"elapsed {format_duration(elapsed)}")
        return f"{self.desc}: {' '.join(parts)}" if self.desc else " ".join(parts)

    def _line(self, *, last: bool = False) -> None:
        self._last = time.monotonic()
        text = self.text()
        if self.kind == "inline":
            start, end = "\r", ("\n" if last else "")
            # spaces over what a longer previous line left ("ETA 1m," gone at the end)
            text, self._width = text.ljust(self._width), len(text)
        else:
            start, end = "", "\n"
        try:
            self._stream.write(f"{start}{text}{end}")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not break the job
            self._closed = True


__all__ = ["LOG_INTERVAL_S", "Progress", "in_notebook"]
