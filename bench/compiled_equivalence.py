"""Whether the mypyc-compiled core and the pure-Python core emit the same records.

Feeds the mutation fuzzer's records (``tests/mutation_fuzz.py``: recorded provider streams,
damaged, re-delivered, interleaved) to an assembler under every fuzz setting, and prints
whether the core is compiled, the number of emits and a digest of all of them (DLQ details
included). Run it once in an environment with the compiled core (``pip install .``) and once
with the pure one (``pip install -e .``): the two digests must be equal. ``.ci/run`` does.

    python bench/compiled_equivalence.py --seeds 150
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mutation_fuzz import SETTINGS, records

import worker
from worker.core import Assembler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=150)
    args = parser.parse_args()
    digest, count = hashlib.sha256(), 0
    for seed in range(args.seeds):
        for settings in SETTINGS.values():
            assembler = Assembler(settings)
            for key, value, clock in records(random.Random(seed), 300, 6, 0.3):
                try:
                    out = [(e.topic.value, e.key, e.value)
                           for e in assembler.feed_record(key, value, clock)]
                except Exception as exc:  # a difference too
                    out = [("raised", type(exc).__name__, str(exc))]
                count += len(out)
                digest.update(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS, default=repr))
            digest.update(orjson.dumps(sorted(assembler.stats.items())))
    compiled = worker.compiled_core()
    print(f"compiled: {compiled}  emits: {count}  digest: {digest.hexdigest()}")


if __name__ == "__main__":
    main()
