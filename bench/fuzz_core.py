"""Run the core's mutation fuzzer for a wall-clock budget (long runs outside CI).

The same fuzzer as ``tests/core/property/test_fuzz_bounded.py`` (``tests/mutation_fuzz.py``: real
envelopes from the shared provider fixtures, damaged by structure, bytes and order, fed through
one ``Assembler`` per sequence), but for as long as asked instead of a bounded number of
examples: for long runs outside CI. Each sequence has its own seed; a failure prints the seed
and the arguments that reproduce it, and exits 1. At the end it prints the records fed, the
records emitted and the call outcomes checked, with rates.

    python bench/fuzz_core.py --seconds 600
    python bench/fuzz_core.py --seconds 60 --no-validate   # skip JSON Schema checks: faster
    python bench/fuzz_core.py --seed 1234 --count 1 --settings tight  # replay one sequence
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mutation_fuzz import SETTINGS, corpus, run_sequence


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget")
    parser.add_argument("--seed", type=int, default=None,
                        help="first sequence seed (default: random); sequence k uses seed + k")
    parser.add_argument("--count", type=int, default=None, help="stop after this many sequences")
    parser.add_argument("--length", type=int, default=2000, help="records per sequence")
    parser.add_argument("--runs", type=int, default=4, help="runs interleaved at a time")
    parser.add_argument("--rate", type=float, default=0.2, help="share of records damaged")
    parser.add_argument("--settings", choices=sorted(SETTINGS), default=None,
                        help="assembler settings (default: each in turn)")
    parser.add_argument("--no-validate", action="store_true",
                        help="skip the JSON Schema check of each output line")
    args = parser.parse_args(argv)
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    corpus()  # load the fixtures before the clock starts
    names = sorted(SETTINGS)
    records = emitted = outcomes = sequences = 0
    started = time.monotonic()
    print(f"fuzzing the core for {args.seconds:g} s from seed {first} "
          f"({args.length} records a sequence, {args.runs} runs at a time, rate {args.rate})")
    while time.monotonic() - started < args.seconds and (
            args.count is None or sequences < args.count):
        seed = first + sequences
        name = args.settings or names[seed % len(names)]
        try:
            checker = run_sequence(seed, args.length, args.runs, args.rate, name,
                                   validate=not args.no_validate)
        except Exception:
            traceback.print_exc()
            print(f"FAILED: python bench/fuzz_core.py --seed {seed} --count 1 "
                  f"--length {args.length} --runs {args.runs} --rate {args.rate} "
                  f"--settings {name}", file=sys.stderr)
            return 1
        sequences += 1
        records += checker.records
        emitted += checker.emitted
        outcomes += checker.outcomes_checked
    elapsed = time.monotonic() - started
    print(f"{sequences} sequences, {records} records fed ({records / elapsed:,.0f}/s), "
          f"{emitted} records emitted, {outcomes} call outcomes checked "
          f"in {elapsed:.1f} s; no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
