"""A bounded mutation fuzz of the pure core over real provider envelopes.

The fuzzer is ``tests/mutation_fuzz.py``: it takes the recorded provider streams of the shared
fixtures, wraps them as a gateway does, interleaves a few runs at a time and damages the
records (fields deleted or given another type, envelope and event types swapped, seq and
run_id moved, bits flipped, records truncated, repeated, dropped, keyed wrongly, plus cancels,
early ends, ticks and garbage). Hypothesis draws the seed and the shape of each sequence (so a
failure shrinks towards a shorter, less damaged one and its seed reproduces it with
``bench/fuzz_core.py --seed``), and each sequence goes through one ``Assembler``.

What every sequence proves:

* ``feed_record`` never raises, whatever the records;
* every output record serializes with orjson (what the worker publishes) and, as a
  ``latch assemble`` line, validates against ``schemas/output-line.schema.json``;
* every DLQ record keeps the original bytes; nothing of a run follows its final message;
* after a tick far in the future, every run that started has ended, nothing stays buffered,
  and every call an adapter opened has exactly one outcome (committed or error), the one its
  run's final message lists, with no call id committed twice and no idempotency key repeated.

Bounded: about 20 s on two cores in all (``max_examples`` below); ``bench/fuzz_core.py
--seconds N`` runs the same fuzzer for as long as wanted.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_fuzz import SETTINGS, corpus, records, run_sequence

from worker.core import Assembler, decode
from worker.core.envelope import PROVIDERS


def bounded(examples: int) -> settings:
    """An example budget, no deadline (the first example compiles schemas), and no health
    check for slow draws."""
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_the_corpus_covers_every_provider() -> None:
    """The fuzzer starts from real captures of all five providers, calls included."""
    captures = corpus()
    assert {c.provider for c in captures} == PROVIDERS
    assert all(any(c.tools for c in captures if c.provider == p) for p in PROVIDERS)


#: The shape of one fuzzed sequence, as the tests below draw it.
SEQUENCES = {"seed": st.integers(0, 2**32 - 1), "length": st.integers(0, 400),
             "runs": st.integers(1, 4), "rate": st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0]),
             "settings_name": st.sampled_from(sorted(SETTINGS))}


@bounded(150)
@given(**SEQUENCES)
def test_mutated_sequences(seed: int, length: int, runs: int, rate: float,
                           settings_name: str) -> None:
    """Sequences of up to 400 records, from undamaged (rate 0) to every record damaged
    (rate 1), under the default, tight-budget and early-commit settings: the promises of the
    module docstring hold."""
    checker = run_sequence(seed, length, runs, rate, settings_name)
    assert checker.records >= length


@bounded(10)
@given(seed=st.integers(0, 2**32 - 1), settings_name=st.sampled_from(sorted(SETTINGS)))
def test_long_mutated_sequences(seed: int, settings_name: str) -> None:
    """Long sequences (2,500 records, four runs at a time, a fifth of the records damaged),
    where the budgets and the remembered finished runs fill up: the same promises hold."""
    checker = run_sequence(seed, 2_500, 4, 0.2, settings_name)
    assert checker.outcomes_checked > 0 or settings_name == "tight"


@bounded(60)
@given(**SEQUENCES)
def test_the_fast_path_changes_nothing(seed: int, length: int, runs: int, rate: float,
                                       settings_name: str) -> None:
    """``Assembler.feed_record`` applies an in-order provider event of an open run without
    building its envelope. Over damaged and undamaged sequences, it gives record for record
    the same outputs and counters as the general path (decode the envelope, then ``feed``)."""
    rng = random.Random(seed)
    fast, general = Assembler(SETTINGS[settings_name]), Assembler(SETTINGS[settings_name])
    for key, value, now in records(rng, length, runs, rate):
        now_ms = now if rng.random() < 0.9 else None
        # (the general path: the envelope decoded, then fed; no fast path)
        expected = general._feed_envelope(decode(key, value), key, value, now_ms, None)
        assert fast.feed_record(key, value, now_ms) == expected, (key, value)
    assert fast.stats == general.stats
    assert fast.open_run_ids() == general.open_run_ids()
    assert fast.buffered_bytes == general.buffered_bytes
