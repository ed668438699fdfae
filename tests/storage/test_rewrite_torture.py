"""Rewrites under real SIGKILLs: a writer packing as it goes, a second process looping gc,
pack and verify, both killed at random (issue 33, "Must show").

Each trial runs a few rounds in a fresh store. In a round the writer (resumed after the
last round's kill) checkpoints run ``r`` with ``pack_loose_limit=2`` and reports every
acknowledged checkpoint on its stdout, while the maintainer loops ``gc``, ``pack`` and
``verify``; the writer is killed after a random number of acknowledgements, the
maintainer a random moment later (it gets the run's lock once the writer is dead, and
the next round's writer waits for it). After the trial a new process checks the newest
acknowledged checkpoint: readable by a new reader with exactly its payload,
``resume_state()`` works, and ``verify`` (cold, in that process) passes.

Default suite: 6 trials unkeyed and 3 keyed; ``--torture``: 300 and 100.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

from proc import REPO, SUPPORT, kill_after, run, spawn

ROUNDS = 3

WRITER = "import sys, rewrite_jobs; rewrite_jobs.writer(*sys.argv[1:])"
MAINTAINER = "import sys, rewrite_jobs; rewrite_jobs.maintainer(*sys.argv[1:])"
CHECK = "import sys, rewrite_jobs; rewrite_jobs.cold_check(*sys.argv[1:])"


def _env() -> dict[str, str]:
    # The checkout under test first: children must import this tree's afk_local.
    path = [str(REPO), str(SUPPORT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _trial(root: Path, keyed: bool, rng: random.Random) -> tuple[int, int, list[str]]:
    """One trial; returns (acknowledged checkpoints, rounds, problems of the cold check).

    A trial in which the writer was always killed before its first acknowledgement has
    nothing to check: it returns 0 acks and no problems (the caller counts those).
    """
    flag = "1" if keyed else "0"
    env = _env()
    newest: tuple[int, int] | None = None
    acks = 0
    for _ in range(ROUNDS):
        first = 0 if newest is None else newest[1] + 1
        if newest is None:
            # Nothing acknowledged yet: a create killed after its mkdir leaves runs/r with
            # no run.meta, which neither create nor resume_writer opens; start afresh,
            # as a user would after `afk-local rm r`.
            shutil.rmtree(root / "runs" / "r", ignore_errors=True)
        # Half the kills land at a chosen durable I/O call (inside a pack, a merge, a gc),
        # the others whenever the parent decides.
        writer_dies = str(rng.randint(1, 90) if rng.random() < 0.5 else 0)
        maintainer_dies = str(rng.randint(1, 40) if rng.random() < 0.7 else 0)
        writer = spawn(WRITER, str(root), flag, str(first), writer_dies, env=env)
        creating = newest is None
        # A gc that locks a run being created makes create fail (it does not wait for the
        # lock): the maintainer starts once the run exists.
        maintainer = (
            None if creating else spawn(MAINTAINER, str(root), flag, maintainer_dies, env=env)
        )
        try:
            said = kill_after(writer, acks=rng.randint(1, 12), seconds=60)
            if maintainer is None:
                maintainer = spawn(MAINTAINER, str(root), flag, maintainer_dies, env=env)
            for line in said.lines:
                _, seq, i = line.split()
                newest = (int(seq), int(i))
                acks += 1
            # the maintainer alone with the dead writer's run, until it dies or is killed
            deadline = time.monotonic() + rng.uniform(0.05, 0.5)
            while maintainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            if maintainer is not None and maintainer.poll() is None:
                maintainer.send_signal(signal.SIGKILL)
            _, err = maintainer.communicate() if maintainer is not None else ("", "")
        assert maintainer is not None
        assert maintainer.returncode == -signal.SIGKILL, f"maintainer died by itself: {err}"
        assert said.returncode == -signal.SIGKILL, f"writer died by itself: {said.stderr}"
    if newest is None:
        return 0, ROUNDS, []
    checked = run(CHECK, str(root), flag, str(newest[0]), str(newest[1]), env=env)
    assert checked.returncode == 0, checked.stderr
    problems: list[str] = json.loads(checked.stdout.strip().splitlines()[-1])["problems"]
    return acks, ROUNDS, problems


def _torture(tmp_path: Path, keyed: bool, count: int, seed: int) -> None:
    rng = random.Random(seed)
    failing: list[str] = []
    total_acks = checked = 0
    for n in range(count):
        acks, _, problems = _trial(tmp_path / f"t{n}", keyed, rng)
        total_acks += acks
        checked += acks > 0
        if problems:
            failing.append(f"trial {n}: " + "; ".join(problems[:3]))
    assert checked * 2 >= count, f"only {checked} of {count} trials acknowledged anything"
    assert not failing, (
        f"{len(failing)} of {count} trials lost an acknowledged checkpoint or failed verify "
        f"({total_acks} acks in all):\n" + "\n".join(failing[:10])
    )


def test_writer_packing_and_maintainer_killed_at_random_lose_nothing(
    tmp_path: Path, trials
) -> None:
    _torture(tmp_path, keyed=False, count=trials(6, 300), seed=33)


def test_keyed_writer_packing_and_maintainer_killed_at_random_lose_nothing(
    tmp_path: Path, trials
) -> None:
    _torture(tmp_path, keyed=True, count=trials(3, 100), seed=34)


def test_the_cold_check_sees_a_lost_checkpoint(tmp_path: Path) -> None:
    """The check is decisive: a store whose newest acknowledged checkpoint is damaged fails."""
    env = _env()
    writer = spawn(WRITER, str(tmp_path), "0", "0", env=env)
    said = kill_after(writer, acks=5, seconds=60)
    assert len(said.lines) >= 5, said.stderr  # a read may bring a line or two past the fifth
    _, seq, i = said.lines[-1].split()
    good = run(CHECK, str(tmp_path), "0", seq, i, env=env)
    assert json.loads(good.stdout)["problems"] == [], good.stdout
    run_dir = tmp_path / "runs" / "r"
    # the newest acknowledged checkpoint's loose file, or the pack the writer put it in
    # before it was killed (it packs as it goes)
    loose = sorted(run_dir.glob(f"{int(seq):012d}.*.ckpt"))
    packs = sorted(run_dir.glob("pack-*.pack"), key=lambda p: p.stat().st_mtime_ns)
    newest = loose[0] if loose else packs[-1]
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0xFF
    newest.write_bytes(bytes(data))
    bad = run(CHECK, str(tmp_path), "0", seq, i, env=env)
    assert json.loads(bad.stdout)["problems"], bad.stdout
