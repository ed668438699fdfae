"""A lock-free listing taken while the run's writer packs and merges as it goes misses
nothing (issue 33, readers during a merge).

The catalog lists the directory, reads the MANIFEST, then opens each live pack's index;
a merge that publishes in between removes a pack the listing named. The listing used
to pass over such a pack silently, so ``history()``, export and fork missed every
checkpoint it held (73 of 300 listings here, on a 2-core machine). It now lists again.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from proc import REPO, SUPPORT, spawn

import afk_local as afk

WRITER = "import sys, rewrite_jobs; rewrite_jobs.writer(*sys.argv[1:])"


def test_listings_during_a_packing_writer_have_no_gaps(tmp_path: Path) -> None:
    path = [str(REPO), str(SUPPORT), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    writer = spawn(WRITER, str(tmp_path), "0", "0", "0", env=env)
    gaps: list[str] = []
    try:
        assert writer.stdout is not None
        for _ in range(6):
            assert writer.stdout.readline().startswith("ack"), writer.stderr
        store = afk.Store(tmp_path)
        packed = 0
        for _ in range(300):
            files = store.open("r").checkpoint_files()
            seqs = [f.seq for f in files]
            packed += any(f.pack for f in files)
            # nothing deletes here (no gc): every seq from 1 to the newest is live
            if seqs != list(range(1, len(seqs) + 1)):
                gaps.append(str(sorted(set(range(1, seqs[-1])) - set(seqs))[:5]))
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate()
    assert packed > 250, "the writer did not pack as it went"
    assert not gaps, f"{len(gaps)} of 300 listings missed checkpoints, e.g. {gaps[:3]}"
