"""What ``afk-local`` imports (afk_local/cli/main.py): a command loads its own modules
only, so ``afk-local runs`` starts without the runner, agent, journal and watcher, and
every command still parses as before."""

from __future__ import annotations

import json

import pytest
from proc import run

from afk_local.cli.main import _command_of, build_parser

pytestmark = pytest.mark.fresh_interpreter  # what a cold start of the command line imports


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["runs", "--limit", "5"], "runs"),
        (["--root", "/x", "runs"], "runs"),
        (["--root=/x", "--json", "show", "r"], "show"),
        (["--json", "--", "log", "r"], "log"),
        (["--root", "runs"], None),  # "runs" is --root's value here: no command
        (["--help"], None),
        ([], None),
    ],
)
def test_the_command_is_found_before_parsing(argv: list[str], command: str | None) -> None:
    assert _command_of(argv) == command


def test_runs_imports_no_runner_agent_journal_or_watcher(tmp_path) -> None:
    script = """
import io, json, sys, contextlib
import afk_local as afk
from afk_local.cli import main
root = sys.argv[1]
with afk.Store(root).create("r") as run:
    run.checkpoint("runtime_state", {"n": 1}, step=1)
    run.finish(1)
for name in [m for m in sys.modules if m.startswith("afk_local.")]:
    del sys.modules[name]  # what creating the run loaded: start again from the CLI
from afk_local.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["--root", root, "runs", "--limit", "5", "--json"])
layers = sorted({m.split(".")[1] for m in sys.modules if m.startswith("afk_local.")})
print(json.dumps({"code": code, "listed": json.loads(out.getvalue()), "layers": layers,
                  "modules": [m for m in sys.modules if m.startswith("afk_local.")]}))
"""
    done = run(script, str(tmp_path / "store"))
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["code"] == 0 and [r["run_id"] for r in seen["listed"]] == ["r"]
    assert not {"agent", "journal", "watcher", "integrations", "ui"} & set(seen["layers"])
    assert "afk_local.storage.rundir.write.writer" not in seen["modules"]
    assert not [
        m
        for m in seen["modules"]
        if m.startswith("afk_local.cli.")
        and m
        not in (
            "afk_local.cli.main",
            "afk_local.cli.command",
            "afk_local.cli.commands",
            "afk_local.cli.commands.listing",
            "afk_local.cli.render",
        )
    ], seen["modules"]


_NOT_FOR_LISTING = (
    "afk_local.storage.maintenance",
    "afk_local.storage.ops.export",
    "afk_local.storage.ops.fork",
    "afk_local.storage.rundir.delta_prefetch",
    "afk_local.storage.rundir.read.metrics",
    "afk_local.storage.rundir.read.verify",
    "afk_local.storage.views.effect_table",
    "filelock",
    "html",
    "json",
    "queue",
    "secrets",
    "socket",
)
"""What ``afk-local runs`` (a table) never needs: gc, export and fork, the writer's delta
compressor, metrics, verify, the notebook's HTML, JSON output, a lock, the hostname."""


def test_runs_imports_only_what_a_listing_uses(tmp_path) -> None:
    script = """
import io, json, sys, contextlib
import afk_local as afk
root = sys.argv[1]
with afk.Store(root).create("r") as run:
    run.checkpoint("runtime_state", {"n": 1}, step=1)
    run.finish(1)
for name in [m for m in sys.modules if m.startswith("afk_local")] + ["filelock"]:
    sys.modules.pop(name, None)  # what creating the run loaded: start again from the CLI
before = set(sys.modules)
from afk_local.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["--root", root, "runs", "--limit", "5"])
loaded = sorted(set(sys.modules) - before)
sys.stdout = sys.__stdout__
print(json.dumps({"code": code, "table": out.getvalue(), "loaded": loaded}))
"""
    # json, socket, secrets and html are unloaded too, where creating the run loaded them
    done = run(
        "import sys\nfor m in ('json', 'socket', 'secrets', 'html', 'queue'):\n"
        "    sys.modules.pop(m, None)\n"
        + script.replace("import io, json,", "import io,").replace(
            "print(json.dumps(", "import json\nprint(json.dumps("
        ),
        str(tmp_path / "store"),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["code"] == 0, seen["table"]
    assert [line.split()[:2] for line in seen["table"].splitlines()[1:]] == [["r", "completed"]]
    assert [m for m in _NOT_FOR_LISTING if m in seen["loaded"]] == []


def test_every_command_still_declares_its_arguments() -> None:
    full = build_parser()
    for command, argv in {
        "watch": ["watch", "--once"],
        "schedule": ["schedule", "rm", "nightly"],
        "settle": ["settle", "r", "k", "--done", "--result", "1"],
        "runs": ["runs", "--status", "failed", "--limit", "3"],
    }.items():
        assert vars(build_parser(command).parse_args(argv)) == vars(full.parse_args(argv))


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "r"],
        ["log", "r"],
        ["effects", "r"],
        ["verify", "r"],
        ["gc", "--dry-run"],
        ["rm", "r"],
    ],
    ids=lambda argv: argv[0],
)
def test_reading_and_maintenance_commands_load_no_runner_agent_or_watcher(
    tmp_path, argv: list[str]
) -> None:
    """Every ``afk-local`` child a test, the fuzzer or a person starts pays its imports:
    a command that reads or maintains the store never loads the runner, the agent, the
    watcher or asyncio (``show`` loaded all four for one constant)."""
    script = """
import io, json, sys, contextlib
import afk_local as afk
root, argv = sys.argv[1], json.loads(sys.argv[2])
with afk.Store(root).create("r") as run:
    run.checkpoint("runtime_state", {"n": 1}, step=1)
    run.finish(1)
for name in [m for m in sys.modules if m.startswith(("afk_local", "asyncio"))]:
    del sys.modules[name]
before = set(sys.modules)
from afk_local.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main(["--root", root, *argv])
loaded = sorted(set(sys.modules) - before)
print(json.dumps({"code": code, "err": err.getvalue(), "loaded": loaded}))
"""
    done = run(script, str(tmp_path / "store"), json.dumps(argv))
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["code"] == 0, seen["err"]
    heavy = ("asyncio", "afk_local.agent", "afk_local.runner.run", "afk_local.watcher.watcher")
    assert [m for m in seen["loaded"] if m.startswith(heavy)] == []
