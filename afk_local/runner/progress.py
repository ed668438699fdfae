"""Progress display for ``ctx.iterate``: tqdm.auto when installed, else one stderr line.

The library never prints; a progress bar the user asked for (``progress=True``)
is the one exception, written to stderr and throttled.
"""

from __future__ import annotations

import sys
import time
from typing import Any

_MIN_INTERVAL_S = 0.25


class Progress:
    """A minimal progress bar: ``update()`` per item, ``close()`` at the end.

    Args:
        total: number of items, or None when unknown.
        initial: items already done (skipped on resume).
        desc: the label shown in front.
        enabled: False makes every method a no-op.
    """

    def __init__(
        self, total: int | None, initial: int = 0, *, desc: str = "", enabled: bool = True
    ) -> None:
        self.total = total
        self.count = initial
        self.desc = desc
        self._bar: Any = None
        self._plain = False
        self._last = 0.0
        self._closed = not enabled
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
        except ImportError:
            self._plain = True
            self._started = time.monotonic()
            return
        self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        if self._closed:
            return
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= _MIN_INTERVAL_S:
            self._last = now
            self._write("\r")

    def close(self) -> None:
        """Finish the bar (the plain line ends with a newline)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._plain:
            self._write("\r", end="\n")

    def _write(self, start: str, end: str = "") -> None:
        total = f"/{self.total}" if self.total is not None else ""
        rate = ""
        elapsed = time.monotonic() - self._started
        if elapsed > 0:
            rate = f" {self.count / elapsed:.1f} it/s" if self.count else ""
        try:
            sys.stderr.write(f"{start}{self.desc}: {self.count}{total}{rate}{end}")
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not break the job
            self._closed = True
