"""A real ``afk-local ui`` server process on a store whose reads of a run wait for the test.

Run: ``python ui_gated_store.py ROOT GATES``. It serves ROOT as ``afk-local ui`` does
(the same :func:`~afk_local.ui.server.serve`, its log at INFO on stderr), but each
``Store.info`` first appends the run's id to ``GATES/read`` and then waits until the file
``GATES/go`` exists: a page that reads runs is as slow as the test wants, and the test
sees how far its work went.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import afk_local as afk
from afk_local.ui.server import serve


class GatedStore(afk.Store):
    """A store whose :meth:`info` is noted in ``gates/read`` and waits for ``gates/go``."""

    gates: Path

    def info(self, run_id: str) -> afk.RunInfo:
        """The run's info, once the test let it through."""
        with open(self.gates / "read", "a", encoding="utf-8") as fh:
            fh.write(run_id + "\n")
        while not (self.gates / "go").exists():
            time.sleep(0.01)
        return super().info(run_id)


def main() -> None:
    """Serve argv[1] with its reads gated by the files in argv[2]."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    store = GatedStore(sys.argv[1])
    store.gates = Path(sys.argv[2])
    serve(store, on_ready=lambda url: print(f"open: {url}", flush=True))


if __name__ == "__main__":
    main()
