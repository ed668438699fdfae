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
import importlib.util
import logging
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


SLOW = (
    # Threads listing while another creates and deletes runs (a stress test; the
    # interleavings themselves are in the default tier, each forced).
    "tests/storage/test_listing_threads.py::test_threads_sharing_a_store_list_while_runs_come_and_go",
    # Agent frameworks imported by each of many child processes (2-5 s of CPU each).
    "tests/integrations/test_agent_sweep.py",
    "tests/integrations/test_agent_forms_sweep.py",
    "tests/integrations/test_mcp_tools.py",
    "tests/integrations/test_agent_parallel_tools.py",
    "tests/integrations/test_agent_replay.py",
    "tests/integrations/test_openai_agents_crash.py",
    "tests/integrations/test_openai_agents_pause.py",
    "tests/integrations/test_pydantic_ai_crash.py",
    "tests/integrations/test_langgraph_crash.py",
    "tests/integrations/test_langgraph.py::test_example_langgraph_resume_runs",
    "tests/integrations/test_openai_agents_session.py::test_a_run_session_keeps_the_history_once_across_a_kill",
    "tests/integrations/test_openai_agents_session.py::test_an_approval_pause_keeps_the_session_history_once",
    "tests/integrations/test_ray.py",
    "tests/docs/test_examples.py::test_example_runs_to_completion[openai_agents_agent.py]",
    "tests/test_errors.py::test_every_error_class_is_defined_in_or_reachable_from_afk_local_errors",
    # Kill loops and sweeps of many child processes; the fuzzer; the remote explorer.
    "tests/testing/test_kill_sweep.py::test_a_langgraph_thread_on_the_saver_ends_as_uninterrupted",
    "tests/testing/test_kill_sweep.py::test_a_dask_fan_out_ends_as_uninterrupted",
    "tests/testing/test_kill_sweep.py::test_an_agent_runner_run_ends_as_uninterrupted",
    "tests/testing/test_kill_sweep.py::test_a_retried_step_ends_as_uninterrupted",
    "tests/testing/test_fuzz.py::test_random_programs_agree_with_the_model",
    "tests/storage/test_rewrite_torture.py",
    "tests/journal/test_journal_crash.py::test_random_sigkills_perform_each_effect_once_or_report_it",
    "tests/storage/rundir/test_crash.py::test_random_sigkills_never_lose_an_acknowledged_checkpoint",
    "tests/storage/ops/test_retention.py::test_kill_9_during_gc_leaves_every_run_resumable",
    "tests/storage/test_store.py::test_two_processes_creating_one_new_run_id_one_wins_cleanly",
    "tests/agent/test_agent.py::test_storage_growth_200_steps",
    "tests/agent/test_agent_crash.py::test_kill_at_every_phase_boundary_then_resume",
    "tests/watcher/test_agent_watcher.py::test_sigterm_stops_agent_children_cleanly_and_the_next_watcher_finishes",
    "tests/runner/test_interrupt.py::test_a_keyed_step_killed_mid_call_is_retried_with_the_same_key_without_a_settle",
    "tests/integrations/test_remote_self_fencing.py::test_a_slow_link_does_not_starve_renewals",
    "tests/integrations/test_remote_self_fencing.py::test_an_owner_whose_mirror_gave_up_fences_itself",
    "tests/integrations/test_remote_interleavings.py::test_every_interleaving_of_owner_and_taker_runs_the_effect_at_most_once",
    "tests/integrations/test_remote_interleavings.py::test_mutant_owner_without_a_check_after_the_intent_is_caught",
)
"""The slow tier (``--slow``, which CI runs): test modules, functions or single cases, by
node id prefix. Each costs 10-60 s of CPU on a quiet two-core machine (many child
processes, or a framework imported by each); the default suite keeps a cheaper real-process
kill test of each mechanism (sampled kill points, a ``daily_sample`` case)."""

DAILY_SAMPLE = dict(
    [
        (
            "tests/runner/test_runner.py::test_kill_anywhere_then_resume_gives_same_result_and_effects_once",
            1,
        ),
        (
            "tests/testing/test_kill_sweep.py::test_durable_jobs_of_each_durability_end_as_uninterrupted",
            1,
        ),
        (
            "tests/testing/test_crashsim.py::test_every_crash_state_of_every_workload_recovers",
            4,
        ),
        (
            "tests/testing/test_crashsim_rewrites.py::test_composed_rewrites_recover_after_crashing_twice",
            3,
        ),
        (
            "tests/testing/test_crashsim_rewrites.py::test_each_site_mutant_is_caught_by_a_workload_that_recovers_without_it",
            4,
        ),
        (
            "tests/storage/rundir/test_manifest.py::test_gc_of_a_packed_run_killed_then_gc_again_loses_nothing",
            1,
        ),
        (
            "tests/integrations/test_remote_takes.py::test_a_take_while_a_sync_effects_owner_runs_repeats_no_effect",
            1,
        ),
        (
            "tests/agent/test_agent_crash.py::test_kill_between_two_tools_of_a_batch",
            1,
        ),
        (
            "tests/agent/test_agent_crash.py::test_finished_subagent_is_not_rerun",
            1,
        ),
        (
            "tests/storage/test_hostile_packs.py::test_a_hostile_pack_is_one_damaged_run_within_the_memory_bound",
            1,
        ),
    ]
)
"""Parametrized tests over variants of one mechanism, and how many of their cases the
default suite runs (drawn with :data:`KILL_SEED`, so each case runs over the days; a
``@pytest.mark.daily_sample(keep=N)`` on a test does the same); ``--slow``: all."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--slow``: also run the slow crash tests (CI does; ``--torture`` implies it)."""
    parser.addoption(
        "--slow",
        action="store_true",
        default=False,
        help="also run the slow crash tests: real-process kill loops and sweeps, agent "
        "frameworks in child processes, the fuzzer, every case of daily_sample tests "
        "(CI runs them; --torture implies this)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``slow`` and ``daily_sample`` markers (:func:`pytest_collection_modifyitems`)."""
    config.addinivalue_line(
        "markers",
        "slow: a slow crash test (many child processes, or an agent framework imported by "
        "each); runs with --slow (as CI does) or --torture",
    )
    config.addinivalue_line(
        "markers",
        "fresh_interpreter: the children this test runs to their end (run_and_kill, "
        "kill_sweep, proc.run, proc.python) start as new interpreters, not as forks of "
        "the worker's fork server",
    )
    config.addinivalue_line(
        "markers",
        "daily_sample(keep=1): of this parametrized test's cases the default suite runs "
        "`keep`, drawn with AFK_KILL_SEED; --slow and --torture run them all",
    )


SLOW_REASON = "slow crash test: runs with --slow (as CI does) or --torture"


class _SlowModule(pytest.Module):
    """A module wholly in the slow tier, in the default suite: one skip, never imported."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        # a collector's skip is reported where it was raised (here): name the module
        pytest.skip(f"{self.path.relative_to(self.config.rootpath).as_posix()}: {SLOW_REASON}")


def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    """The default suite does not import a module that is wholly in the slow tier.

    Most of them import an agent framework at their top (2-5 s of CPU), which every
    xdist worker paid at collection to skip every test; the module is reported as one
    skip with the slow tier's reason instead. ``--slow`` collects it as usual.
    """
    config = parent.config
    if config.getoption("--slow") or config.getoption("--torture"):
        return None
    if module_path.relative_to(config.rootpath).as_posix() in SLOW:
        return _SlowModule.from_parent(parent, path=module_path)
    return None


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default suite leaves out the slow tier, and samples ``daily_sample`` tests.

    The default suite is what a developer runs between edits (about five minutes on two
    shared cores, README.md; the budget is four); CI adds ``--slow``: the real-process
    kill loops and sweeps, the tests that import an agent framework in each of many
    child processes, the fuzzer. A
    ``@pytest.mark.daily_sample(keep=...)`` test is parametrized over variants of one
    mechanism (sync, async and exiting jobs; packed and loose runs); the default suite
    runs ``keep`` of its cases, drawn with :data:`KILL_SEED` so that every case runs over
    the days (as the sampled kill points do); a case selected alone (after ``-k`` or by
    its node id) always runs.
    """
    if config.getoption("--torture") or config.getoption("--slow"):
        return
    slow = pytest.mark.skip(reason=SLOW_REASON)
    groups: dict[str, list[pytest.Item]] = {}
    keeps: dict[str, int] = {}
    for item in items:
        function = item.nodeid.split("[", 1)[0]
        marker = item.get_closest_marker("daily_sample")
        if item.get_closest_marker("slow") is not None or item.nodeid.startswith(SLOW):
            item.add_marker(slow)
        elif hasattr(item, "callspec") and (marker is not None or function in DAILY_SAMPLE):
            keep = marker.kwargs.get("keep", 1) if marker else DAILY_SAMPLE[function]
            keeps[function] = int(keep)
            groups.setdefault(function, []).append(item)
    for name, cases in groups.items():
        keep = keeps[name]
        if len(cases) <= keep:
            continue
        chosen = set(random.Random(f"{KILL_SEED}:{name}").sample(range(len(cases)), keep))
        reason = f"not in today's sample (AFK_KILL_SEED={KILL_SEED}; --slow: all)"
        for index, case in enumerate(cases):
            if index not in chosen:
                case.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def full(request: pytest.FixtureRequest) -> bool:
    """True under ``--torture``: the crash explorer's tests explore every state, no budget."""
    return bool(request.config.getoption("--torture"))


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


FORK_SERVER_PRELOAD = (
    "afk_local.cli",
    "afk_local.testing",
    "afk_local.testing.fuzz.jobs",
    "afk_local.watcher",
    "afk_local.agent",
    *(
        ["afk_local.ui.app"]
        if all(importlib.util.find_spec(m) for m in ("starlette", "uvicorn", "jinja2"))
        else []
    ),
)
"""What the workers' fork servers import once (afk_local.testing.forkserver.PRELOADED,
and what the command line loads for ``watch``, agent runs and ``ui``)."""


@pytest.fixture(scope="session")
def _fork_server():
    """This worker's fork server (started at its first child; None where there is none)."""
    # imported here: afk_local.testing is a plugin (pytest_plugins), imported as pytest
    # registers it, so that its assertions are rewritten
    from afk_local.testing.forkserver import ForkServer, fork_server_available  # noqa: PLC0415

    if not fork_server_available():
        yield None
        return
    server = ForkServer(FORK_SERVER_PRELOAD)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _forked_children(request: pytest.FixtureRequest, _fork_server) -> object:
    """The children a test runs to their end are forks of the worker's fork server.

    Each is still a real process (its own pid, killed by SIGKILL at the same I/O call),
    started from one that imported afk_local and holds no store, lock, writer or thread;
    what it saves is the interpreter's start-up (docs/runner.md). A test of how children
    start (their imports, their interpreter) is marked ``fresh_interpreter``.
    """
    from afk_local.testing.forkserver import using_fork_server  # noqa: PLC0415

    if _fork_server is None or request.node.get_closest_marker("fresh_interpreter"):
        yield None
        return
    with using_fork_server(server=_fork_server) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_step_hook_left_behind() -> object:
    """A step hook a test installs in this process (tests/support's agent jobs install
    one that prints ``STEP key`` when they run in-process) ends with the test: left
    behind, it printed into the output of every later in-process command of the worker."""
    from afk_local.runner.run.steps import set_step_hook  # noqa: PLC0415 - a plugin's test

    previous = set_step_hook(None)
    set_step_hook(previous)
    yield None
    set_step_hook(previous)


@pytest.fixture(autouse=True)
def _afk_local_logging_left_on() -> object:
    """afk_local's loggers log in every test. A library that a test runs in-process may
    call ``logging.config.dictConfig``, whose default disables every logger already made
    (import-linter's CLI does): afk_local's stayed silent for the rest of the worker, and
    every later test that reads ``caplog`` on that worker failed."""
    yield None
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and (
            name == "afk_local" or name.startswith("afk_local.")
        ):
            logger.disabled = False
