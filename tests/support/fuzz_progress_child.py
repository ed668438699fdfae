"""A fuzzing run with ``--progress`` that is SIGKILLed while it records a program.

``python -c "import fuzz_progress_child; fuzz_progress_child.main()" K ARGS...`` runs
``python -m afk_local.testing.fuzz ARGS`` and, at the K-th program it records, writes
half of that program's line (fsynced, as a torn write leaves it) and SIGKILLs itself.
"""

from __future__ import annotations

import os
import signal
import sys

from afk_local.testing.fuzz import progress
from afk_local.testing.fuzz.__main__ import main as fuzz_main


def main() -> None:
    """Install the kill, then run the fuzzer's command line."""
    kill_at = int(sys.argv[1])
    real = progress.ProgressFile.record
    seen = 0

    def record(self: progress.ProgressFile, played: progress.Played) -> None:
        nonlocal seen
        seen += 1
        if seen == kill_at:
            line = progress.msgspec.json.encode(played)
            with open(self.path, "ab") as file:
                file.write(line[: len(line) // 2])
                file.flush()
                os.fsync(file.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        real(self, played)

    progress.ProgressFile.record = record  # type: ignore[method-assign]
    raise SystemExit(fuzz_main(sys.argv[2:]))
