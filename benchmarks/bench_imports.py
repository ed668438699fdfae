"""What importing afk_local's entry points costs, next to Python's start and SqliteSaver's.

    python benchmarks/bench_imports.py [--rounds 21]

Fresh interpreters, interleaved round by round, with warm bytecode caches (the script
compiles afk_local first and unsets PYTHONDONTWRITEBYTECODE for its children, as an
installed package would run):

- ``import afk_local``, timed by the child itself (what it costs beyond Python's
  start), and the wall time of ``python -c pass`` and ``python -c "import afk_local"``
  for reference (on a busy machine the process wall times are mostly scheduling);
- the LangGraph savers: each child imports LangGraph's checkpoint base (which both
  savers need) and then times, itself, importing ``SqliteSaver`` or ``AfkLocalSaver``.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_PACKAGE = (
    "import time\n"
    "t = time.perf_counter()\n"
    "import afk_local\n"
    "print((time.perf_counter() - t) * 1000)\n"
)
_SAVER = (
    "import time, langgraph.checkpoint.base\n"
    "t = time.perf_counter()\n"
    "{statement}\n"
    "print((time.perf_counter() - t) * 1000)\n"
)
SAVERS = {
    "SqliteSaver": "from langgraph.checkpoint.sqlite import SqliteSaver",
    "AfkLocalSaver": "from afk_local.integrations.langgraph import AfkLocalSaver",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(code: str, env: dict[str, str], *, capture: bool = False) -> bytes:
    # In the directory of the afk_local being measured: ``python -c`` puts the working
    # directory first on sys.path (PYTHONPATH=<checkout> measures another checkout).
    where = env.get("PYTHONPATH", "").split(os.pathsep)[0] or str(REPO)
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv, env=env, cwd=where, check=True, capture_output=capture).stdout


def _wall_ms(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    _run(code, env)
    return (time.perf_counter() - started) * 1000


def _timed_ms(code: str, env: dict[str, str]) -> float:
    return float(_run(code, env, capture=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    compileall.compile_dir(REPO / "afk_local", quiet=1)
    env = _env()
    savers = SAVERS if importlib.util.find_spec("langgraph.checkpoint.sqlite") else {}
    wall: dict[str, list[float]] = {"python -c pass": [], "import afk_local": []}
    inner: dict[str, list[float]] = {name: [] for name in [*savers, "import afk_local"]}
    for _ in range(2):  # warm the caches: bytecode, page cache
        _wall_ms("import afk_local", env)
        for statement in savers.values():
            _timed_ms(_SAVER.format(statement=statement), env)
    for _ in range(args.rounds):
        wall["python -c pass"].append(_wall_ms("pass", env))
        wall["import afk_local"].append(_wall_ms("import afk_local", env))
        for name, statement in savers.items():
            inner[name].append(_timed_ms(_SAVER.format(statement=statement), env))
        inner["import afk_local"].append(_timed_ms(_PACKAGE, env))
    start = statistics.median(wall["python -c pass"])
    package = statistics.median(wall["import afk_local"])
    print(f"{args.rounds} interleaved rounds, medians, ms\n")
    print(f"python -c pass                 {start:7.1f}")
    print(f"python -c 'import afk_local'   {package:7.1f}   (process wall times)")
    inside = statistics.median(inner["import afk_local"])
    print(f"import afk_local, timed inside the process     {inside:7.1f}")
    if savers:
        sqlite = statistics.median(inner["SqliteSaver"])
        afk = statistics.median(inner["AfkLocalSaver"])
        print(f"import SqliteSaver (after LangGraph's base)    {sqlite:7.1f}")
        print(
            f"import AfkLocalSaver (after LangGraph's base)  {afk:7.1f}   "
            f"{afk / sqlite:.2f}x SqliteSaver"
        )


if __name__ == "__main__":
    main()
