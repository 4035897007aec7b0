"""``worker.core.keys``: each name is the member it stands for (only its object differs)."""

from __future__ import annotations

import orjson

from worker.core import keys

NAMES = [n for n in vars(keys) if n.isupper()]


def test_each_name_is_its_member() -> None:
    """A read with ``keys.RUN_ID`` finds what ``doc.get("run_id")`` finds: the constant's
    text is its own name, lower case (a typo here would read another member)."""
    assert len(NAMES) >= 20
    for name in NAMES:
        value = getattr(keys, name)
        assert type(value) is str and value == name.lower(), name


def test_reads_with_the_names_find_the_members_of_a_parsed_record() -> None:
    """Each name in ``worker.core.keys`` finds its member in a dict orjson parsed, and
    ``keys.parsed`` returns a string equal to the one it is given."""
    doc = orjson.loads(orjson.dumps({n.lower(): i for i, n in enumerate(NAMES)}))
    assert [doc[getattr(keys, n)] for n in NAMES] == list(range(len(NAMES)))
    assert keys.parsed("a key of its own") == "a key of its own"
