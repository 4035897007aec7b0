"""The one reader of a Cedar policy set (governance/policy_file.py, issue 32 item 4): ids and
annotations are Cedar's; our tokenizer, kept only for line and column, is tested against
Cedar on generated sets (style habit 10: where the engine cannot tell us, test our reader
against it on generated inputs) -- line ends ``\\n``, ``\\r``, ``\\r\\n``, comments and strings
holding ``;``, ``//``, quotes and would-be annotations."""

from __future__ import annotations

import re

import cedarpy
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.runtime.governance.policy_file import read_policies

END = st.sampled_from(["\n", "\r", "\r\n"])
#: Text a comment may hold: everything that would confuse a reader that lexes otherwise.
COMMENT = st.sampled_from(["", " ; ", ' "x; ', ' @id("fake") ', " // again ", " permit(;"])
#: A when-clause string holding what a tokenizer must not read as structure.
STRING = st.sampled_from(["a", "a;b", "//", "\\\"; //", "@id(\\\"z\\\")"])


@st.composite
def policy_sets(draw: st.DrawFn) -> tuple[str, list[tuple[str, bool, int]]]:
    """A set's text, and per policy: its @id, whether it asks for approval, its offset."""
    text, expected = "", []
    for n in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            text += "//" + draw(COMMENT) + draw(END)
        text += draw(st.sampled_from(["", " ", "\t"]))
        offset = len(text)
        approval = draw(st.booleans())
        text += f'@id("p{n}")' + draw(st.sampled_from([" ", "\n", "\r", "\r\n"]))
        if approval:
            text += '@approval("required")' + draw(END)
        text += draw(st.sampled_from(["permit", "forbid"])) + "(principal, action, resource)"
        if draw(st.booleans()):
            text += f' when {{ context.run_id == "{draw(STRING)}" }}'
        text += ";" + draw(st.sampled_from(["", " // trailing ; comment"])) + draw(END)
        expected.append((f"p{n}", approval, offset))
    return text, expected


def _line_column(text: str, offset: int) -> tuple[int, int]:
    lines = re.split(r"\r\n|\r|\n", text[:offset])
    return len(lines), len(lines[-1]) + 1


@settings(max_examples=300, deadline=None)
@given(policy_sets())
def test_the_reader_agrees_with_cedar_on_generated_sets(
        generated: tuple[str, list[tuple[str, bool, int]]]) -> None:
    """Each policy's name and approval are Cedar's annotations, in file order, and its line
    and column are where it starts, counting ``\\r\\n``, ``\\r`` and ``\\n`` as line ends."""
    text, expected = generated
    cedar = orjson.loads(cedarpy.policies_to_json_str(text))["staticPolicies"]
    assert len(cedar) == len(expected)
    statements = read_policies(text, "gen.cedar").statements
    assert [(s.name, s.approval) for s in statements] == [(n, a) for n, a, _ in expected]
    assert [(s.line, s.column) for s in statements] == [
        _line_column(text, offset) for _, _, offset in expected]
    assert [s.name for s in statements] == [
        cedar[s.cedar_id]["annotations"]["id"] for s in statements]
