"""Shared fixtures; ``--torture`` (declared by the ``afk_local.testing`` plugin) turns on the
long randomized crash suites.

Tests mirror the package: ``tests/storage/`` for ``afk_local/storage/`` and so on.
Everything they share lives in ``tests/support/`` (put on ``sys.path`` here, and on
every child's PYTHONPATH by the tests that spawn one): ``proc.py`` spawns and kills
real processes, ``strategies.py`` holds the hypothesis strategies, and the
``*_jobs.py`` modules are the jobs children import by entrypoint
(``cli_jobs:count_job``).
"""

from __future__ import annotations

import datetime
import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

pytest_plugins = ["afk_local.testing", "remote_s3"]  # remote_s3: the S3 endpoint fixtures

# The crash tests start hundreds of fresh interpreters; let them cache bytecode
# (some environments set PYTHONDONTWRITEBYTECODE, which makes every child
# recompile afk_local from source: ~70 ms each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


KILL_SEED = os.environ.get("AFK_KILL_SEED") or datetime.date.today().isoformat()
"""Seeds which kill points the default suite samples: it changes every day, so the
sampled loops cover every point over time; set ``AFK_KILL_SEED`` to repeat a run."""


EXPLORER_SEED = int(
    os.environ.get("AFK_EXPLORER_SEED")
    or datetime.date.today().strftime("%Y%m%d")  # one a day, as the kill points
)
"""Seeds the crash explorer's randomized runs (the states drawn, the first crash states
crashed again): it changes every day; set ``AFK_EXPLORER_SEED`` to repeat a run
(``python -m afk_local.testing.crashsim --seed N`` replays one workload)."""

TORTURE_SEEDS = 25
"""``--torture``: explorer seeds swept per randomized explorer test (from EXPLORER_SEED on)."""


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Print the kill-point and explorer seeds, so a failing sampled run can be repeated."""
    return [
        f"kill points: AFK_KILL_SEED={KILL_SEED}",
        f"crash explorer: AFK_EXPLORER_SEED={EXPLORER_SEED}",
    ]


@pytest.fixture
def explorer_seeds(request: pytest.FixtureRequest) -> list[int]:
    """The explorer seeds a randomized explorer test runs with: today's
    (``AFK_EXPLORER_SEED``), or under ``--torture`` :data:`TORTURE_SEEDS` of them."""
    if request.config.getoption("--torture"):
        return [EXPLORER_SEED + i for i in range(TORTURE_SEEDS)]
    return [EXPLORER_SEED]


@pytest.fixture
def kill_points(request: pytest.FixtureRequest):
    """``kill_points(total, default)``: the durable I/O calls (1-based) at which a
    kill-at-every-call loop kills its child. ``--torture``: all ``total`` of them; the
    default suite: ``default`` of them, the first and the last always, the rest drawn
    with ``KILL_SEED`` and the test's id (the crash explorer checks every crash point
    of the same writers deterministically)."""

    def pick(total: int, default: int) -> list[int]:
        points = list(range(1, total + 1))
        if request.config.getoption("--torture") or total <= default:
            return points
        rng = random.Random(f"{KILL_SEED}:{request.node.nodeid}")
        return sorted({1, total, *rng.sample(points[1:-1], default - 2)})

    return pick


@pytest.fixture
def trials(request: pytest.FixtureRequest):
    """``trials(default, torture)``: how many randomized trials this run does."""

    def pick(default: int, torture: int) -> int:
        return torture if request.config.getoption("--torture") else default

    return pick


@pytest.fixture
def count_loads(monkeypatch: pytest.MonkeyPatch):
    """Call it to start counting: it returns the list to which every checkpoint file
    ``RunReader.load`` decodes from then on appends its name."""
    import afk_local as afk  # noqa: PLC0415 - only the tests that count need it

    def start() -> list[str]:
        loads: list[str] = []
        original = afk.RunReader.load

        def counting(self, file):
            loads.append(file.name)
            return original(self, file)

        monkeypatch.setattr(afk.RunReader, "load", counting)
        return loads

    return start


@pytest.fixture(autouse=True)
def _no_ambient_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Tests pick their own keys: a developer's ``$AFK_LOCAL_KEY`` must not sign their stores.

    Head records (keyed stores' rollback protection) go to a fresh directory per test,
    never to the developer's state directory; child processes inherit it.
    """
    monkeypatch.delenv("AFK_LOCAL_KEY", raising=False)
    monkeypatch.delenv("AFK_LOCAL_MAX_RECORD_BYTES", raising=False)
    monkeypatch.setenv("AFK_LOCAL_HEAD_DIR", str(tmp_path_factory.mktemp("heads")))
