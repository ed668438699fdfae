"""One damaged byte in ``effects.log`` is salvaged by ``afk-local fork RUN --salvage``.

Real processes: a script job is SIGKILLed partway, a byte in the middle of its journal
is flipped (good records follow it, so it is damage, not a torn tail), and every command
the messages advise is run as printed.
"""

from __future__ import annotations

import json
import shlex
import struct
import subprocess
from pathlib import Path

import proc
import pytest
import test_script_jobs
from proc import REPO
from test_script_jobs import N, afk_local, items_done, make_project, start_and_kill


@pytest.fixture(autouse=True)
def this_afk_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """The children import the afk_local under test, wherever the installed one points."""
    plain = test_script_jobs.no_pythonpath

    def env() -> dict[str, str]:
        return {**plain(), "PYTHONPATH": str(REPO)}

    monkeypatch.setattr(test_script_jobs, "no_pythonpath", env)


def frame_offsets(journal: Path) -> list[int]:
    data = journal.read_bytes()
    offsets, pos = [], 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        offsets.append(pos)
        pos += 8 + (length & 0x7FFFFFFF)
    return offsets


def flip_byte_in_frame(journal: Path, index: int) -> None:
    offsets = frame_offsets(journal)
    data = bytearray(journal.read_bytes())
    data[offsets[index] + 10] ^= 0xFF  # inside the body: the frame's crc fails
    journal.write_bytes(bytes(data))


def run_printed(command: str, base: Path) -> subprocess.CompletedProcess[str]:
    """A command exactly as a message printed it (``afk-local ...``), from ``base/elsewhere``."""
    words = shlex.split(command)
    assert words[0] == "afk-local"
    return proc.python(
        ["-m", "afk_local", *words[1:]],
        env=test_script_jobs.no_pythonpath(),
        timeout=120,
        cwd=base / "elsewhere",
    )


def test_a_flipped_byte_in_the_journal_is_salvaged_into_a_run_that_resumes(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path)
    start_and_kill(project, acks=6)
    journal = project / ".afk" / "runs" / "script-job" / "effects.log"
    assert len(frame_offsets(journal)) >= 12
    flip_byte_in_frame(journal, 5)  # item 2's outcome: its effect ran, the record is lost

    refused = afk_local(tmp_path, "resume", "script-job")
    assert refused.returncode == 2
    assert "`afk-local fork script-job --salvage`" in refused.stderr

    salvaged = afk_local(tmp_path, "fork", "script-job", "--salvage", "--as", "saved")
    assert salvaged.returncode == 0, salvaged.stderr
    lines = salvaged.stdout.splitlines()
    assert lines[0].startswith("forked script-job at seq ")
    assert "kept 5 effect record(s), the journal's intact part (damage at byte " in lines[1]
    assert lines[2].startswith("lost: ") and "record(s) after the damage" in lines[2]
    doubt = [line for line in lines if line.startswith("in doubt (its outcome is lost)")]
    assert [line.split()[7] for line in doubt] == [  # item 2's outcome is lost; 3-5 after it
        f"iterate#1[{i}]/record#1" for i in (2, 3, 4, 5)
    ]
    settle_done = doubt[0].split("settle it: ")[1].split(" or ")[0]
    assert settle_done.endswith("--done --result JSON")
    settled = run_printed(settle_done.replace("JSON", "2"), tmp_path)
    assert settled.returncode == 0, settled.stderr
    for line in doubt[1:]:  # the others: say they did not happen, so they run again
        failed = line.split(" or ")[-1].replace("MESSAGE", "'not run'")
        assert run_printed(failed, tmp_path).returncode == 0
    assert lines[-1] == f"continue it with: afk-local --root {project / '.afk'} resume saved"

    resumed = afk_local(tmp_path, "resume", "saved", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"]["count"] == N
    assert set(items_done(project)) == set(range(N))
    assert items_done(project).count(2) == 1  # settled as done: not called again


def test_fork_salvage_of_an_intact_journal_says_so(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    start_and_kill(project, acks=3)
    salvaged = afk_local(tmp_path, "fork", "script-job", "--salvage", "--json")
    assert salvaged.returncode == 0, salvaged.stderr
    report = json.loads(salvaged.stdout)["salvage"]
    assert report["damage_offset"] is None and report["lost_records"] == 0
