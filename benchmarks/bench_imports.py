"""What importing afk_local's entry points costs, next to Python's start and SqliteSaver's.

    python benchmarks/bench_imports.py [--rounds 21]

Fresh interpreters, interleaved round by round, with warm bytecode caches (the script
compiles afk_local first and unsets PYTHONDONTWRITEBYTECODE for its children, as an
installed package would run):

- ``python -c pass`` against ``python -c "import afk_local"``: wall time of the whole
  process, so "beyond Python's start" is the difference of the medians;
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


def _wall_ms(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return (time.perf_counter() - started) * 1000


def _saver_ms(statement: str, env: dict[str, str]) -> float:
    code = _SAVER.format(statement=statement)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    compileall.compile_dir(REPO / "afk_local", quiet=1)
    env = _env()
    savers = SAVERS if importlib.util.find_spec("langgraph.checkpoint.sqlite") else {}
    wall: dict[str, list[float]] = {"python -c pass": [], "import afk_local": []}
    inner: dict[str, list[float]] = {name: [] for name in savers}
    for _ in range(2):  # warm the caches: bytecode, page cache
        _wall_ms("import afk_local", env)
        for statement in savers.values():
            _saver_ms(statement, env)
    for _ in range(args.rounds):
        wall["python -c pass"].append(_wall_ms("pass", env))
        wall["import afk_local"].append(_wall_ms("import afk_local", env))
        for name, statement in savers.items():
            inner[name].append(_saver_ms(statement, env))
    start = statistics.median(wall["python -c pass"])
    package = statistics.median(wall["import afk_local"])
    print(f"{args.rounds} interleaved rounds, medians, ms\n")
    print(f"python -c pass                 {start:7.1f}")
    print(
        f"python -c 'import afk_local'   {package:7.1f}   beyond Python's start: "
        f"{package - start:.1f}"
    )
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
