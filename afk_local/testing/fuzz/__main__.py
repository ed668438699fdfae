"""``python -m afk_local.testing.fuzz``: play random programs, exit 1 on a divergence.

Exit codes: 0 no program diverged, 1 one did (printed, shrunk, with the command that
replays it), 2 usage (or a progress file of another run), 130 stopped (SIGINT or
SIGTERM: a run with ``--progress`` goes on from where it stopped when started again).
The seed is printed first, so any run can be replayed.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from afk_local.testing.crashsim.mutants import MUTANTS
from afk_local.testing.fuzz.fuzzer import FuzzReport, fuzz
from afk_local.testing.fuzz.progress import Played, ProgressError, ProgressFile, Settings

TORTURE_PROGRAMS = 10_000
"""Programs ``--torture`` plays."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m afk_local.testing.fuzz",
        description="Play random programs of durable jobs and store operations under "
        "SIGKILLs and power cuts, and check each against a reference model.",
    )
    parser.add_argument("--seed", default=None, help="seed (default: today's date)")
    parser.add_argument("--programs", type=int, default=200, help="programs to play (default 200)")
    parser.add_argument("--program", type=int, default=None, help="replay this one program")
    parser.add_argument(
        "--from",
        dest="first",
        type=int,
        default=0,
        metavar="I",
        help="start at program I (default 0)",
    )
    parser.add_argument(
        "--progress",
        metavar="FILE",
        default=None,
        help="record each finished program in FILE; started again with the same FILE and "
        "settings, the run goes on with the programs FILE does not hold",
    )
    parser.add_argument(
        "--torture", action="store_true", help=f"play {TORTURE_PROGRAMS} programs, more kills"
    )
    parser.add_argument("--size", type=int, default=5, help="most instructions per run (default 5)")
    parser.add_argument(
        "--kill-every",
        type=int,
        default=None,
        metavar="N",
        help="every N-th program SIGKILLs child processes, the others cut power "
        "(default 10; 3 with --torture; 0: no kills)",
    )
    parser.add_argument(
        "--keyed-every",
        type=int,
        default=5,
        metavar="N",
        help="every N-th program has a keyed store (signed files, head records); default 5, "
        "0: none",
    )
    parser.add_argument(
        "--clock-steps",
        action="store_true",
        help="programs may step the wall clock (in this process): back 3 s at once, or back "
        "or forward 3 s in the middle of the next attempt",
    )
    parser.add_argument(
        "--mutant",
        choices=list(MUTANTS),
        help="power cuts lose what this kind of fsync keeps: the fuzzer must then diverge",
    )
    parser.add_argument(
        "--keep-going", action="store_true", help="do not stop at the first failure"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fuzzer; returns the exit code."""
    args = _parser().parse_args(argv)
    seed = args.seed or datetime.date.today().isoformat()
    programs = TORTURE_PROGRAMS if args.torture else args.programs
    kill_every = args.kill_every if args.kill_every is not None else (3 if args.torture else 10)
    first = args.first
    if args.program is not None:
        first, programs = args.program, 1
    if programs < 1 or kill_every < 0 or args.keyed_every < 0 or args.size < 1 or first < 0:
        _parser().error(
            "--programs and --size must be >= 1, --kill-every, --keyed-every and --from >= 0"
        )
    if args.progress is not None and (args.program is not None or args.first):
        _parser().error("--progress plays every program of the run: no --program or --from")
    # Faults make the library warn (torn tails, skipped files): expected here.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings(
        seed, programs, args.size, kill_every, args.keyed_every, args.clock_steps, args.mutant
    )
    book: ProgressFile | None = None
    indices = None
    if args.progress is not None:
        try:
            book = ProgressFile(args.progress, settings)
        except ProgressError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
        indices = list(book.todo())
        sys.stdout.write(
            f"fuzz seed {seed}: {programs} programs, {len(book.played)} played already "
            f"({args.progress}), {len(indices)} to play\n"
        )
    else:
        sys.stdout.write(f"fuzz seed {seed}: {programs} programs from {first}\n")
    sys.stdout.flush()

    def progress(index: int, report: FuzzReport) -> None:
        if report.programs % 100 == 0:
            sys.stdout.write(f"  {report.programs} programs, {len(report.failures)} failures\n")
            sys.stdout.flush()

    def played(outcome: Played) -> None:
        if book is not None:
            book.record(outcome)

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = fuzz(
            seed,
            programs,
            first=first,
            size=args.size,
            kill_every=kill_every,
            keyed_every=args.keyed_every,
            clock_steps=args.clock_steps,
            stop_at_first=not args.keep_going,
            mutant=args.mutant,
            progress=progress,
            indices=indices,
            on_played=played,
        )
    except KeyboardInterrupt:
        sys.stdout.write("stopped\n")
        if book is not None:
            sys.stdout.write(book.summary().text() + "\n")
            sys.stdout.write(f"continue: the same command (--progress {args.progress})\n")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    faults = ", ".join(f"{n} {kind}" for kind, n in sorted(report.faults.items()))
    sys.stdout.write(
        f"{report.programs} programs in {report.seconds} s (segments: {faults}), "
        f"{len(report.failures)} diverged\n"
    )
    for failure in report.failures:
        sys.stdout.write("\n" + failure.text() + "\n")
    if book is not None:
        summary = book.summary()
        sys.stdout.write("whole run: " + summary.text() + "\n")
        return 0 if not summary.diverged else 1
    return 0 if report.ok else 1


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the run as Ctrl-C does: the program under way is cleaned up, not
    recorded (it is played again when the run goes on)."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
