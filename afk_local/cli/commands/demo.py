"""``afk-local demo``: crash a small batch job with SIGKILL, resume it, show nothing ran twice.

In a temporary store, a child process runs a durable job of about 40 steps; each
step appends one line to a file outside the store through ``ctx.step`` (journaled,
and deduplicated by its idempotency key, as an outside service would). The demo
SIGKILLs the child partway, lists what is on disk, resumes the run in this
process and reports how many steps were done before the crash, skipped, replayed
and executed after it, and whether every side effect happened exactly once.
Offline; a few seconds.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afk_local.agent.resume import resume
from afk_local.runner.run.durable_function import durable
from afk_local.runner.run.run_context import RunContext
from afk_local.storage.rundir.options import ROOT_ENV
from afk_local.storage.store import Store
from afk_local.storage.views.notebook import format_bytes

RUN_ID = "demo-batch"
DEFAULT_STEPS = 40
STEP_SECONDS = 0.01
"""Each step also sleeps this long, so the kill lands mid-run like a real crash."""

_step_hooks: list[Callable[[int], None]] = []  # the child prints an ack per finished step
_executed: list[float] = []  # monotonic times of side effects performed in this process


def append_line(path: str, item: int, *, idempotency_key: str) -> int:
    """The side effect: append ``item`` to ``path`` unless this key already did.

    An outside service deduplicates with the idempotency key the same way; this
    is what makes a call that a crash left in doubt safe to retry.
    """
    target = Path(path)
    if target.exists() and idempotency_key in target.read_text("utf-8").split():
        return item
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(f"{item} {idempotency_key}\n")
        fh.flush()
        os.fsync(fh.fileno())
    _executed.append(time.monotonic())
    return item


@durable
def batch_job(ctx: RunContext, steps: int, outside: str) -> dict[str, Any]:
    """The demo job: ``steps`` loop items, each one journaled side effect."""
    ctx.state.setdefault("total", 0)
    for item in ctx.iterate(range(steps), progress=False):
        ctx.state["total"] += ctx.step("append", append_line, outside, item, idempotent=True)
        time.sleep(STEP_SECONDS)
        for hook in _step_hooks:
            hook(item)
    return {"total": ctx.state["total"], "replayed": ctx.effects.replayed_count}


def child_main() -> None:
    """Entry of the child process: run the job, printing one line per finished step."""
    steps, outside = int(sys.argv[1]), sys.argv[2]

    def ack(item: int) -> None:
        sys.stdout.write(f"step {item}\n")
        sys.stdout.flush()

    _step_hooks.append(ack)
    batch_job.run(steps, outside, run_id=RUN_ID)


@dataclass
class DemoReport:
    """What the demo measured."""

    steps: int
    done_before_crash: int = 0
    skipped_after_resume: int = 0
    replayed_after_resume: int = 0
    executed_after_resume: int = 0
    lines: int = 0
    distinct_lines: int = 0
    resume_seconds: float = 0.0
    first_step_seconds: float | None = None
    bytes_on_disk: int = 0
    files_on_disk: int = 0
    result: Any = None
    listing: list[tuple[str, int]] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        """True when the outside file holds every item once."""
        return self.lines == self.steps and self.distinct_lines == self.steps


def _disk_usage(run_dir: Path) -> tuple[int, list[tuple[str, int]]]:
    listing = []
    for entry in sorted(os.scandir(run_dir), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            listing.append((entry.name, entry.stat(follow_symlinks=False).st_size))
        elif entry.is_symlink():
            listing.append((f"{entry.name} -> {os.readlink(entry.path)}", -1))
    return sum(max(size, 0) for _, size in listing), listing


def _count_lines(path: Path) -> tuple[int, int]:
    if not path.exists():
        return 0, 0
    lines = [line for line in path.read_text("utf-8").splitlines() if line.strip()]
    return len(lines), len({line.split()[0] for line in lines})


def _run_child_and_kill(root: Path, outside: Path, steps: int, kill_after: int) -> int:
    env = dict(os.environ, **{ROOT_ENV: str(root), "PYTHONUNBUFFERED": "1"})
    script = "from afk_local.cli.commands.demo import child_main; child_main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(steps), str(outside)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdout is not None
    acks = 0
    buffer = b""
    deadline = time.monotonic() + 60
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while acks < kill_after and time.monotonic() < deadline and proc.poll() is None:
            if selector.select(timeout=0.1):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buffer += chunk
                acks = buffer.count(b"\n")
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return acks


def run_demo(root: Path, steps: int = DEFAULT_STEPS) -> DemoReport:
    """Run the demo in store ``root`` (which should be empty); returns the measurements."""
    outside = root / "outside.txt"
    store = Store(root)
    report = DemoReport(steps=steps)
    _run_child_and_kill(root, outside, steps, kill_after=max(1, steps * 2 // 5))
    run_dir = store.paths(RUN_ID).dir
    report.bytes_on_disk, report.listing = _disk_usage(run_dir)
    report.done_before_crash, _ = _count_lines(outside)
    state = store.open(RUN_ID).resume_state()
    cursors = state.state.get("cursors", {}) if isinstance(state.state, dict) else {}
    report.skipped_after_resume = sum(
        int(c.get("n", 0)) for c in cursors.values() if isinstance(c, dict)
    )
    _executed.clear()
    started = time.monotonic()
    result = resume(RUN_ID, store=store)
    report.resume_seconds = time.monotonic() - started
    if _executed:
        report.first_step_seconds = _executed[0] - started
    report.result = result
    report.replayed_after_resume = int(result.get("replayed", 0)) if isinstance(result, dict) else 0
    report.executed_after_resume = len(_executed)
    report.lines, report.distinct_lines = _count_lines(outside)
    report.bytes_on_disk, listing = _disk_usage(run_dir)
    report.files_on_disk = len(listing)
    return report


def _print_listing(out: Callable[[str], None], listing: list[tuple[str, int]]) -> None:
    shown = listing if len(listing) <= 10 else [*listing[:4], ("...", -1), *listing[-5:]]
    for name, size in shown:
        out(f"      {name:<44} {format_bytes(size) if size >= 0 else ''}")


def report_dict(report: DemoReport, root: Path, keep: bool) -> dict[str, Any]:
    """The report as ``afk-local demo --json`` prints it."""
    return {
        "steps": report.steps,
        "done_before_crash": report.done_before_crash,
        "skipped_after_resume": report.skipped_after_resume,
        "replayed_after_resume": report.replayed_after_resume,
        "executed_after_resume": report.executed_after_resume,
        "lines": report.lines,
        "distinct_lines": report.distinct_lines,
        "exactly_once": report.exactly_once,
        "resume_seconds": round(report.resume_seconds, 4),
        "first_step_seconds": (
            None if report.first_step_seconds is None else round(report.first_step_seconds, 4)
        ),
        "bytes_on_disk": report.bytes_on_disk,
        "files_on_disk": report.files_on_disk,
        "store": str(root) if keep else None,
        "run_id": RUN_ID,
    }


def main(
    steps: int = DEFAULT_STEPS,
    keep: bool = False,
    *,
    as_json: bool = False,
    root: Path | None = None,
) -> int:
    """``afk-local demo``: run the demo and print the report.

    The store is a temporary directory, removed afterwards unless ``keep``; a
    ``root`` given by the caller (a new or empty directory) is used and kept.
    """

    def out(text: str = "") -> None:
        if not as_json:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    if root is None:
        root = Path(tempfile.mkdtemp(prefix="afk-demo-"))
    else:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        keep = True
    try:
        out(f"afk-local demo: a {steps}-step batch job, killed with SIGKILL, then resumed")
        out(f"  store: {root} ({'kept' if keep else 'temporary'})")
        out(f"  each step appends one line to {root / 'outside.txt'} through ctx.step")
        report = run_demo(root, steps)
        if as_json:
            sys.stdout.write(json.dumps(report_dict(report, root, keep), indent=2) + "\n")
            return 0 if report.exactly_once else 1
        out()
        out(f"1. the job ran in a child process; it was SIGKILLed after "
            f"{report.done_before_crash} side effects")  # fmt: skip
        out(f"2. on disk after the crash (runs/{RUN_ID}/):")
        _print_listing(out, report.listing)
        out(f"3. resumed in this process (afk.resume({RUN_ID!r}))")
        out()
        first = report.first_step_seconds
        rows = [
            ("steps done before the crash", str(report.done_before_crash)),
            ("steps skipped on resume (checkpointed)", str(report.skipped_after_resume)),
            ("steps replayed from the journal", str(report.replayed_after_resume)),
            ("steps executed after the crash", str(report.executed_after_resume)),
            (
                "side effects (lines in outside file)",
                f"{report.lines} lines, {report.distinct_lines} distinct of {steps}",
            ),
            (
                "time to resume",
                f"{first * 1000:.0f} ms to the first new step, {report.resume_seconds:.2f} s total"
                if first is not None
                else f"{report.resume_seconds:.2f} s",
            ),
            (
                "bytes on disk",
                f"{format_bytes(report.bytes_on_disk)} in {report.files_on_disk} files",
            ),
        ]
        width = max(len(label) for label, _ in rows)
        out("report:")
        for label, value in rows:
            out(f"  {label:<{width}}  {value}")
        out()
        if report.exactly_once:
            out(f"every side effect happened exactly once ({steps} of {steps}); "
                "nothing finished before the crash ran again")  # fmt: skip
        else:
            out("PROBLEM: some side effects are missing or duplicated (please report this)")
        look = shlex.join(["afk-local", "--root", str(root), "log", RUN_ID])
        out(f"next: look around with `{look}`" if keep else
            "run `afk-local demo --keep` to keep the store and look around")  # fmt: skip
        return 0 if report.exactly_once else 1
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
