"""Jobs defined in a script (``python my_job.py``) resume from anywhere, or say in one line why not.

Real processes throughout: the script runs under the test's interpreter with no
PYTHONPATH, is SIGKILLed partway, and is finished by ``afk-local resume`` or by
``afk-local watch --once``, started from another directory, also with no PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import proc

import afk_local as afk

SCRIPT = textwrap.dedent(
    """
    import dataclasses, os, pathlib, sys, time
    import afk_local as afk
    import helper  # next to the script: found through the script's own directory

    @dataclasses.dataclass
    class Tally:
        count: int
        where: pathlib.Path

    def record(item, *, idempotency_key):
        with open("outside.txt", "a") as fh:  # relative: the script's working directory
            fh.write(f"{item} {idempotency_key}\\n")
        return item

    @afk.durable(store="./.afk")
    def tally(ctx, n, pause_s):
        ctx.state.setdefault("tally", Tally(0, pathlib.Path("outside.txt")))
        for item in ctx.iterate(range(n), progress=False):
            ctx.step("record", record, item, idempotent=True)
            ctx.state["tally"] = Tally(ctx.state["tally"].count + 1, ctx.state["tally"].where)
            print("ack", item, flush=True)
            time.sleep(pause_s)
        t = ctx.state["tally"]
        return {"count": t.count, "type": type(t).__name__, "where": str(t.where),
                "helper": helper.NAME, "argv": sys.argv[1:], "cwd": os.getcwd()}

    if __name__ == "__main__":
        n, pause_s = int(sys.argv[1]), float(sys.argv[2])
        print("result", tally.run(n, pause_s, run_id="script-job"), flush=True)
    """
)

N = 12


def no_pythonpath() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AFK_LOCAL_ROOT")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def make_project(base: Path) -> Path:
    project = base / "project"
    project.mkdir()
    (project / "my_job.py").write_text(SCRIPT)
    (project / "helper.py").write_text("NAME = 'helper from the script directory'\n")
    (base / "elsewhere").mkdir()
    return project


def start_and_kill(project: Path, acks: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "my_job.py", str(N), "0.05"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=no_pythonpath(),
    )
    killed = proc.kill_after(child, acks=acks)
    assert killed.returncode == -9, killed.stderr
    assert len(killed.lines) >= acks


def afk_local(
    base: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``afk-local --root PROJECT/.afk ARGS`` from another directory, with no PYTHONPATH
    (or with ``env``)."""
    root = str(base / "project" / ".afk")
    return proc.python(
        ["-m", "afk_local", "--root", root, *args],
        env=no_pythonpath() if env is None else env,
        timeout=120,
        cwd=base / "elsewhere",
    )


def items_done(project: Path) -> list[int]:
    return sorted(
        int(line.split()[0]) for line in (project / "outside.txt").read_text().split("\n") if line
    )


def expected_result(project: Path) -> dict[str, object]:
    return {
        "count": N,
        "type": "Tally",  # the script's dataclass came back as itself, in a new process
        "where": "outside.txt",
        "helper": "helper from the script directory",
        "argv": [str(N), "0.05"],
        "cwd": str(project),
    }


def test_killed_script_job_is_finished_by_afk_local_resume_from_another_directory(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path)
    start_and_kill(project, acks=4)

    shown = afk_local(tmp_path, "show", "script-job", "--json")
    facts = json.loads(shown.stdout)
    assert facts["interrupted"] and facts["script"] == str(project / "my_job.py")
    assert facts["cannot_resume"] is None

    done = afk_local(tmp_path, "resume", "script-job", "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "run_id": "script-job",
        "status": "completed",
        "result": expected_result(project),
    }
    assert items_done(project) == list(range(N))  # every side effect exactly once

    # running the finished script again returns its stored result and does nothing
    again = subprocess.run(
        [sys.executable, "my_job.py", str(N), "0.05"],
        cwd=project,
        capture_output=True,
        text=True,
        env=no_pythonpath(),
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("result {'count': 12, 'type': 'Tally'"), again.stdout
    assert "ack" not in again.stdout
    assert items_done(project) == list(range(N))


def test_killed_script_job_is_finished_by_the_watcher(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    start_and_kill(project, acks=3)
    store = afk.Store(project / ".afk")
    assert store.read_meta("script-job").attempt == 1
    logs = store.paths("script-job").dir / "logs"
    logs.mkdir(mode=0o700)
    (logs / "attempt-2.log").write_text("# an attempt that died before it opened the run\n")

    watched = afk_local(tmp_path, "watch", "--once", "--json")

    assert watched.returncode == 0, (watched.stdout, watched.stderr)
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(e["event"], e["run_id"]) for e in events] == [
        ("resumed", "script-job"),
        ("completed", "script-job"),
    ]
    # attempt numbers and their logs never collide: attempt 3, logged in attempt-3.log
    assert events[0]["message"].startswith("attempt 3 ")
    assert events[0]["log"] == str(logs / "attempt-3.log")
    assert store.read_meta("script-job").attempt == 3
    assert store.open("script-job").resume_state().result == expected_result(project)
    assert items_done(project) == list(range(N))


def test_a_script_that_is_gone_is_said_in_one_line_and_left_alone(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    start_and_kill(project, acks=2)
    script = project / "my_job.py"
    script.rename(project / "my_job.py.bak")
    store = afk.Store(project / ".afk")
    meta_before = store.paths("script-job").meta.read_bytes()
    reason = (
        f"its script {script} no longer exists: put it back there (or restore it from "
        "version control), then resume the run"
    )

    runs = afk_local(tmp_path, "runs")
    assert "running (interrupted, cannot resume)" in runs.stdout
    assert runs.stdout.splitlines()[-1] == f"script-job: cannot be resumed: {reason}"
    shown = afk_local(tmp_path, "show", "script-job").stdout
    assert f"next              cannot be resumed: {reason}" in shown.splitlines()
    resumed = afk_local(tmp_path, "resume", "script-job")
    assert (resumed.returncode, resumed.stdout) == (2, "")
    assert resumed.stderr == f"afk-local: run 'script-job' cannot be resumed: {reason}\n"

    watched = afk_local(tmp_path, "watch", "--once", "--json")
    assert watched.returncode == 0, watched.stderr
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(e["event"], e["message"]) for e in events] == [
        ("skipped", f"cannot be resumed: {reason}")
    ]
    # no attempt was spawned and the run is not marked failed
    assert store.paths("script-job").meta.read_bytes() == meta_before
    assert not (store.paths("script-job").dir / "logs").exists()

    (project / "my_job.py.bak").rename(script)  # put back: it resumes
    assert afk_local(tmp_path, "resume", "script-job").returncode == 0
    assert items_done(project) == list(range(N))


PREFIX_SCRIPT = textwrap.dedent(
    """
    import sys
    import afk_local as afk

    @afk.durable(store="./.afk")
    def where(ctx):
        ctx.state["seen"] = ctx.state.get("seen", 0) + 1
        ctx.checkpoint()
        if ctx.attempt == 1:
            print("ready", flush=True)
            import time; time.sleep(60)  # killed here
        return {"prefix": sys.prefix, "attempt": ctx.attempt}

    where.run(run_id="venv-job")
    """
)


def test_resume_hands_over_to_the_interpreter_that_ran_the_job(tmp_path: Path) -> None:
    """A job started in another virtualenv is continued by that virtualenv's interpreter."""
    other = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    [site] = list((other / "lib").glob("python*/site-packages"))
    # the other environment sees the same packages (and this afk_local), nothing more
    here = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    lines = [f"import site; site.addsitedir({p!r})" for p in here]  # their .pth files too
    (site / "same_packages.pth").write_text("\n".join(lines) + "\n")
    python = str(other / "bin" / "python")
    project = tmp_path / "project"
    project.mkdir()
    (project / "where.py").write_text(PREFIX_SCRIPT)
    (tmp_path / "elsewhere").mkdir()
    child = subprocess.Popen(
        [python, "where.py"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=no_pythonpath(),
    )  # fmt: skip
    killed = proc.kill_after(child, acks=1)
    assert killed.returncode == -9 and killed.lines == ["ready"], killed.stderr

    done = afk_local(tmp_path, "resume", "venv-job", "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["result"]
    assert result == {"prefix": str(other), "attempt": 2}  # not this process's sys.prefix
    assert str(other) != sys.prefix


def this_afk_local() -> dict[str, str]:
    """No PYTHONPATH but this checkout's afk_local: the job, the watcher and its children."""
    return {**no_pythonpath(), "PYTHONPATH": str(proc.REPO)}


def cli_here(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`afk_local`, running this checkout's afk_local."""
    return afk_local(base, *args, env=this_afk_local())


def test_a_renamed_job_is_marked_unresumable_and_the_watcher_does_not_retry_it(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "my_job.py", str(N), "0.05"], cwd=project, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=this_afk_local(),
    )  # fmt: skip
    assert proc.kill_after(child, acks=3).returncode == -9
    script = project / "my_job.py"
    original = script.read_text()
    script.write_text(original.replace("tally", "count_items"))  # the job renamed
    root = project / ".afk"
    store = afk.Store(root)
    reason = (
        f"{script} no longer defines the job tally (it defines count_items now: renamed or "
        "removed?): give it its old name again, then resume the run; or cancel it "
        "(`afk-local cancel script-job`) and start a new one"
    )
    command = [sys.executable, "-m", "afk_local", "--root", str(root), "watch", "--json"]
    command += ["--interval", "0.1", "--backoff", "0.05", "--max-attempts", "50"]

    with proc.JsonLinesChild(command, this_afk_local()) as watcher:
        watcher.wait_for(lambda: any(e["event"] == "skipped" for e in watcher.events))
        assert watcher.stop() == 0

    events = [(e["event"], e["message"]) for e in watcher.events if e["run_id"] == "script-job"]
    assert [kind for kind, _ in events].count("resumed") == 1, events  # one try, no retries
    assert events[-1] == ("skipped", f"cannot be resumed: {reason}")
    assert store.read_meta("script-job").status is afk.RunStatus.RUNNING  # not marked failed
    again = cli_here(tmp_path, "watch", "--once", "--json")  # a new watcher: still left alone
    assert [json.loads(line)["event"] for line in again.stdout.splitlines()] == ["skipped"]

    runs = cli_here(tmp_path, "runs")
    assert runs.stdout.splitlines()[-1] == f"script-job: cannot be resumed: {reason}"
    [listed] = json.loads(cli_here(tmp_path, "runs", "--json").stdout)
    assert listed["cannot_resume"] == reason
    assert (
        f"next              cannot be resumed: {reason}"
        in cli_here(tmp_path, "show", "script-job").stdout.splitlines()
    )
    assert (
        json.loads(cli_here(tmp_path, "show", "script-job", "--json").stdout)["cannot_resume"]
        == reason
    )
    resumed = cli_here(tmp_path, "resume", "script-job")  # a person tries again: same answer
    assert (resumed.returncode, resumed.stdout) == (2, "")
    assert resumed.stderr == (
        f"afk-local: run 'script-job': cannot resume entrypoint '__main__:tally': {reason}\n"
    )
    assert "afk.resume" not in resumed.stderr

    direct = subprocess.run(
        [sys.executable, "my_job.py", str(N), "0.05"], cwd=project, capture_output=True,
        text=True, env=this_afk_local(), timeout=120,
    )  # fmt: skip
    assert direct.returncode == 1
    assert direct.stderr.splitlines()[-1] == (
        "ValueError: run 'script-job' belongs to __main__:tally, not __main__:count_items: if "
        "you renamed the job, give it its old name (tally) again, then run this again; or "
        "choose another run_id for a new run"
    )

    script.write_text(original)  # the old name back: a person's resume finishes it
    done = cli_here(tmp_path, "resume", "script-job")
    assert done.returncode == 0, done.stderr
    assert items_done(project) == list(range(N))
    assert "unresumable" not in store.read_meta("script-job").extra


def test_a_changed_job_is_said_once_on_resume(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "my_job.py", str(N), "0.05"], cwd=project, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=this_afk_local(),
    )  # fmt: skip
    assert proc.kill_after(child, acks=2).returncode == -9
    script = project / "my_job.py"
    script.write_text(
        script.read_text().replace("time.sleep(pause_s)", "time.sleep(pause_s)  # new")
    )

    done = cli_here(tmp_path, "resume", "script-job")

    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "under changed code" in line]
    assert len(said) == 1, done.stderr
    assert "CodeChangedWarning" in said[0]


MODULE_JOB = textwrap.dedent(
    """
    import time
    import afk_local as afk

    @afk.durable(store="./.afk")
    def crunch(ctx, n):
        for item in ctx.iterate(range(n), progress=False):
            print("ack", item, flush=True)
            time.sleep(0.05)
        return n
    """
)


def test_a_module_job_whose_function_is_gone_says_so_and_is_left_alone(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "elsewhere").mkdir()
    module = project / "jobmod.py"
    module.write_text(MODULE_JOB)
    child = subprocess.Popen(
        [sys.executable, "-c", "import jobmod; jobmod.crunch.run(20, run_id='mod-job')"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=this_afk_local(),
    )  # fmt: skip
    assert proc.kill_after(child, acks=2).returncode == -9
    module.write_text(MODULE_JOB.replace("def crunch", "def crunch_v2"))
    reason = (
        f"jobmod ({module}) no longer defines crunch (renamed or removed?): put it back under "
        "that name, then resume the run; or cancel it (`afk-local cancel mod-job`) and start "
        "a new one"
    )

    resumed = cli_here(tmp_path, "resume", "mod-job")

    assert resumed.returncode == 2
    assert resumed.stderr == (
        f"afk-local: run 'mod-job': cannot resume entrypoint 'jobmod:crunch': {reason}\n"
    )
    shown = json.loads(cli_here(tmp_path, "show", "mod-job", "--json").stdout)
    assert (shown["status"], shown["cannot_resume"]) == ("running", reason)
    watched = cli_here(tmp_path, "watch", "--once", "--json")
    assert [json.loads(line)["event"] for line in watched.stdout.splitlines()] == ["skipped"]
