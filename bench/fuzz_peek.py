"""Fuzz ``worker.core._peek`` built with AddressSanitizer and UndefinedBehaviorSanitizer.

peek.c is C of our own (with the vendored yyjson) that reads untrusted bytes, so CI also
runs it under the sanitizers: this script builds the extension from
``worker/core/csrc/build.json`` (what setup.py builds) with ``-fsanitize=address,undefined``
into a temporary folder, then feeds it damaged records in a child interpreter that preloads
the sanitizers' runtimes. Any report (a read out of bounds, a use after free, an overflow)
aborts the child, and the script fails. Each record ``peek`` answers must also be one that
``orjson.loads`` accepts (tests/core/property/test_peek.py checks the answers themselves).

The records: real envelopes of every provider (the fixtures' captures, as
``tests/mutation_fuzz.py`` builds them) and hand-made ones of the six shapes peek reads,
each damaged one to four times (bytes flipped, cut, removed; hostile pieces written in:
quotes, backslashes, brackets, NUL, invalid UTF-8, surrogates, ``1e400``, deep nesting).

    python bench/fuzz_peek.py                    # 300,000 records, seed 1
    python bench/fuzz_peek.py --records 2000000 --seed 7

Needs gcc with its sanitizer runtimes (libasan, libubsan), and Linux.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]

SHAPES = [
    b'{"type":"provider.event","run_id":"r","v":1,"seq":3,"event":{"type":"content_block_delta",'
    b'"index":1,"delta":{"type":"text_delta","text":"hi \\u00e9 \\ud83d\\ude00"}}}',
    b'{"type":"provider.event","run_id":"r","v":1,"seq":3,"event":{"type":"content_block_delta",'
    b'"index":2,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\": [1, 2"}}}',
    b'{"type":"provider.event","run_id":"r","v":1,"seq":3,"ts":5,"event":{"id":"c","choices":[{'
    b'"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\\"a\\":1}"}}]},'
    b'"finish_reason":null}]}}',
    b'{"type":"provider.event","run_id":"r","v":1,"seq":3,"event":{"choices":[{"delta":'
    b'{"content":"x"}}]}}',
    b'{"type":"provider.event","run_id":"r","v":1,"seq":3,"event":{"type":'
    b'"response.output_text.delta","output_index":0,"delta":"\xf0\x9f\x98\x80"}}',
    b'{"type":"provider.event","run_id":"r","v":1,"seq":3,"event":{"type":'
    b'"response.function_call_arguments.delta","output_index":2,"delta":"{}"}}',
]
PIECES = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\x00", b"\x1f", b"\xff", b"\xc3",
          b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"1e400", b"-0", b"18446744073709551616",
          b"\\ud800", b"\\udc00", b"\\u0000", b"[" * 70, b"{\"a\":" * 70, b"null", b"tru",
          b"\\\\\\", b'"type":"provider.event",', b'"index":1,', b'"text":"t",']


def build(out: Path) -> Path:
    """The sanitized extension, built from build.json into ``out``; its path."""
    spec = json.loads((ROOT / "worker" / "core" / "csrc" / "build.json").read_text())
    target = out / ("_peek" + sysconfig.get_config_var("EXT_SUFFIX"))
    command = ["gcc", "-O1", "-g", "-fno-omit-frame-pointer", *SANITIZERS, "-shared", "-fPIC",
               f"-I{sysconfig.get_paths()['include']}",
               *[f"-I{ROOT / d}" for d in spec["include_dirs"]],
               *[f"-D{name}={value}" for name, value in spec["define_macros"]],
               *[str(ROOT / s) for s in spec["sources"]], "-o", str(target)]
    subprocess.run(command, check=True)
    return target


def runtimes() -> list[str]:
    """The sanitizers' shared runtimes, which the interpreter must load first."""
    found = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run(["gcc", f"-print-file-name={name}"], check=True,
                              capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(path):
            raise SystemExit(f"gcc has no {name}: install its sanitizer runtimes")
        found.append(path)
    return found


def seeds() -> list[bytes]:
    """Real envelopes of every provider, and the six shapes peek reads."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    import orjson
    from mutation_fuzz import corpus

    from worker.tools import capture

    found = list(SHAPES)
    for cap in corpus():
        for item in capture.envelopes(cap.provider, list(cap.events), list(cap.tools),
                                      run_id="r", tenant="t"):
            found.append(item if isinstance(item, bytes) else orjson.dumps(item))
    return found


def damaged(rng: random.Random, value: bytes) -> bytes:
    for _ in range(rng.randint(1, 4)):
        roll, at = rng.random(), rng.randrange(len(value) + 1)
        if roll < 0.25:
            value = value[:at] + bytes([rng.randrange(256)]) + value[at + 1:]
        elif roll < 0.45:
            value = value[:at] + value[at + rng.randint(1, 8):]
        elif roll < 0.5:
            value = value[:at]
        else:
            piece = rng.choice(PIECES)
            value = value[:at] + piece + value[at + (len(piece) if roll < 0.75 else 0):]
    return value


def child(folder: str, records: int, seed: int) -> int:
    """In the preloaded interpreter: feed the records; a sanitizer report aborts."""
    sys.path.insert(0, folder)
    import _peek  # the sanitized build, not the installed one
    import orjson

    rng = random.Random(seed)
    pool = seeds()
    answered, started, last = 0, time.monotonic(), time.monotonic()
    for n in range(1, records + 1):
        value = rng.choice(pool)
        value = value if rng.random() < 0.05 else damaged(rng, value)
        if _peek.peek(value) is not None:
            answered += 1
            orjson.loads(value)  # raises if peek answered what orjson refuses
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            print(f"  {n:,} of {records:,} records", flush=True)
    print(f"{records:,} records under ASan and UBSan in {time.monotonic() - started:.1f} s: "
          f"no report; {answered:,} answered, every one of them accepted by orjson")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.records, args.seed)
    with tempfile.TemporaryDirectory(prefix="latch-fuzz-peek-") as folder:
        started = time.monotonic()
        build(Path(folder))
        print(f"built worker.core._peek with {' '.join(SANITIZERS)} in "
              f"{time.monotonic() - started:.0f} s", flush=True)
        env = {**os.environ, "LD_PRELOAD": " ".join(runtimes()),
               "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
               "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
        done = subprocess.run([sys.executable, "-P", __file__, "--child", folder,
                               "--records", str(args.records), "--seed", str(args.seed)],
                              env=env, check=False)
        if done.returncode:
            print(f"the sanitized run failed (exit {done.returncode})", file=sys.stderr)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
