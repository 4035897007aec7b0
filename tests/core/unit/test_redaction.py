"""Result redaction (``worker.core.redaction``; issue 36, item 4): the operator's RE2 rules,
compiled once, applied in order, each rewrite counted by rule name; refused rules named by
index, name and problem, never by their text; the output bounded; lone surrogates escaped."""

from __future__ import annotations

import copy
import pickle
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.redaction import (
    DEFAULT_REPLACE,
    GROWTH_ALLOWANCE,
    MAX_PATTERN_LENGTH,
    MAX_REPLACE_LENGTH,
    MAX_RULES,
    TOO_LARGE,
    RedactionError,
    Redactor,
    Rule,
    output_limit,
    parse_tenant_rules,
    redactor_for,
)

SECRET = "sk-live-SECRET"


def refusal(*rules: Rule) -> str:
    with pytest.raises(RedactionError) as caught:
        Redactor(list(rules))
    return str(caught.value)


# -- applying -------------------------------------------------------------------------------


def test_rules_apply_in_order_and_count_only_what_they_rewrote() -> None:
    """The second rule sees the first one's output; a rule that matched nothing has no
    count; the default replacement is ``[redacted]``."""
    redactor = Redactor([Rule("key", r"sk-[a-z]+-\w+", "TOKEN"),
                         Rule("token", r"TOKEN"),
                         Rule("email", r"\w+@\w+\.com")])
    text, counts = redactor.apply(f"a {SECRET} and {SECRET}!")
    assert text == f"a {DEFAULT_REPLACE} and {DEFAULT_REPLACE}!"
    assert counts == {"key": 2, "token": 2}


def test_a_text_no_rule_matches_is_returned_as_it_is() -> None:
    """No match: the very same text, no counts."""
    text = "nothing to see here, é ü 漢字"
    assert Redactor([Rule("key", "sk-[0-9]+")]).apply(text) == (text, {})


def test_group_references_expand_and_an_absent_group_is_empty() -> None:
    """``\\1``, ``\\g<name>`` and ``\\g<0>`` take their groups; a group that took no part
    in the match is empty; ``\\\\`` is one backslash."""
    redactor = Redactor([
        Rule("key", r"(?P<kind>sk|pk)-(live|test)-\w+", r"\g<kind>-\2-*** [\g<0>]"),
        Rule("either", r"x(a)|x(b)", r"<\1|\2>\\"),
    ])
    text, counts = redactor.apply("sk-live-abc xa xb")
    assert text == "sk-live-*** [sk-live-abc] <a|>\\ <|b>\\"
    assert counts == {"key": 1, "either": 2}


def test_non_ascii_text_and_replacements_are_kept_intact() -> None:
    """Offsets are characters (RE2 matches UTF-8 bytes) and a non-ASCII replacement is
    not mangled (re2's own ``sub`` decodes a str template as Latin-1 escapes)."""
    redactor = Redactor([Rule("id", r"编号\d+", "[已删除]"), Rule("e", "é+", r"«\g<0>»")])
    assert redactor.apply("前 编号123 后 éé x") == ("前 [已删除] 后 «éé» x", {"id": 1, "e": 1})


def test_empty_matches_are_never_rewritten() -> None:
    """A pattern that can still match empty (``\\b``, a word boundary) is accepted but its
    empty matches rewrite nothing."""
    assert Redactor([Rule("edge", r"\b")]).apply("ab cd") == ("ab cd", {})


def test_many_small_matches_are_all_rewritten() -> None:
    """Past the pieces joined at a time: every match rewritten, every one counted."""
    assert Redactor([Rule("a", "a", "b")]).apply("a" * 20_000) == ("b" * 20_000, {"a": 20_000})


def test_a_catastrophic_backtracking_pattern_runs_in_linear_time() -> None:
    """``(a+)+$`` on 100,000 ``a`` and a ``!`` (hours for a backtracking engine) ends, with
    no match; without the ``!`` the whole text is one match."""
    redactor = Redactor([Rule("nested", "(a+)+$")])
    text = "a" * 100_000 + "!"
    assert redactor.apply(text) == (text, {})
    assert redactor.apply("a" * 100_000) == (DEFAULT_REPLACE, {"nested": 1})


def test_a_lone_surrogate_is_escaped_not_a_crash() -> None:
    """RE2 takes UTF-8, which cannot carry a lone surrogate: it is escaped first (six
    characters), and the rules run on the rest as usual."""
    redactor = Redactor([Rule("key", r"sk-\w+")])
    assert redactor.apply("a\ud800 sk-abc \udcff") == (
        "a\\ud800 [redacted] \\udcff", {"key": 1})
    assert redactor.apply("\ud83d\ude00") == ("\\ud83d\\ude00", {})
    # a rule may target the escaped form
    assert Redactor([Rule("s", r"\\ud[89a-f][0-9a-f]{2}", "?")]).apply("x\udc80") == (
        "x?", {"s": 1})


def test_an_output_over_the_bound_becomes_the_fixed_text() -> None:
    """A rewrite that takes the output past ``len(text) + 64 KiB`` (short texts) replaces
    the whole text by :data:`TOO_LARGE`, counted under that rule up to and including the
    rewrite that went over; earlier rules keep their counts, later ones do not run."""
    growth = 99  # each rewrite of "a" adds 99 characters
    text = "k" + "a" * 1000
    redactor = Redactor([Rule("k", "k", "K"), Rule("a", "a", "x" * (growth + 1)),
                         Rule("after", "redacted")])
    over = (GROWTH_ALLOWANCE // growth) + 1
    assert redactor.apply(text) == (TOO_LARGE, {"k": 1, "a": over})


def test_an_output_of_exactly_twice_the_text_is_allowed_and_one_more_is_not() -> None:
    """For long texts the bound is twice the length: doubling every character is allowed,
    tripling is not."""
    text = "a" * 100_000
    assert output_limit(len(text)) == 200_000
    assert Redactor([Rule("a", "a", "bb")]).apply(text) == ("b" * 200_000, {"a": 100_000})
    out, counts = Redactor([Rule("a", "a", "bbb")]).apply(text)
    assert out == TOO_LARGE
    assert counts == {"a": 50_001}


# -- refusing -------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "says"), [
    ("sk-(?=live)", "look-ahead"),
    ("sk-(?!test)", "look-ahead"),
    ("(?<=key:)\\w+", "look-behind"),
    ("(?<!x)y", "look-behind"),
    ("(sk)-\\1", "back-reference"),
])
def test_backtracking_only_features_are_refused_with_a_clear_reason(pattern: str,
                                                                     says: str) -> None:
    """Look-around and back-references, which only a backtracking engine runs, are refused
    at configuration, naming the feature and the rule."""
    message = refusal(Rule("ok", "x"), Rule("bad", pattern))
    assert message.startswith("redaction rule 1 ('bad'): pattern uses ")
    assert says in message and "linear time" in message


def test_a_refused_pattern_is_never_echoed() -> None:
    """RE2 quotes the pattern in its message; the error keeps only the reason."""
    message = refusal(Rule("live_key", f"({SECRET}"))
    assert message == "redaction rule 0 ('live_key'): pattern is refused by RE2: missing )"
    assert "SECRET" not in message


@pytest.mark.parametrize(("rule", "says"), [
    (Rule("long", "a" * (MAX_PATTERN_LENGTH + 1)), "pattern must be 1 to 1000 characters"),
    (Rule("empty", ""), "pattern must be 1 to 1000 characters"),
    (Rule("star", "a*"), "pattern matches the empty string"),
    (Rule("byte", "x\\C"), "pattern uses \\C"),
    (Rule("type", 7), "pattern must be a string"),  # type: ignore[arg-type]
    (Rule("sur", "\ud800"), "pattern holds a lone surrogate"),
    (Rule("g", "(a)", "\\2"), "replace refers to group 2; the pattern has 1"),
    (Rule("g", "(a)", "\\g<9>"), "replace refers to group 9; the pattern has 1"),
    (Rule("g", "(?P<k>a)", "\\g<key>"), "replace refers to a group name the pattern does"),
    (Rule("esc", "a", "\\n"), "replace has a backslash that is neither"),
    (Rule("esc", "a", "\\0"), "replace has a backslash that is neither"),
    (Rule("esc", "a", "end\\"), "replace has a backslash that is neither"),
    (Rule("rlong", "a", "x" * (MAX_REPLACE_LENGTH + 1)), "replace must be at most 1000"),
    (Rule("rtype", "a", None), "replace must be a string"),  # type: ignore[arg-type]
])
def test_a_bad_rule_is_refused_naming_it_and_the_problem(rule: Rule, says: str) -> None:
    """Each refusal names the rule by index and name, the field and the problem."""
    message = refusal(rule)
    assert message.startswith(f"redaction rule 0 ('{rule.name}'): ")
    assert says in message


def test_a_bad_name_is_refused_by_index_alone() -> None:
    """A name that is not a short label (it would be a metric label) is refused, and not
    echoed; so is a second rule of the same name."""
    assert refusal(Rule("ok", "a"), Rule(f"{SECRET} with spaces", "b")).startswith(
        "redaction rule 1: name must be 1 to 64 letters")
    assert refusal(Rule("x" * 65, "a")).startswith("redaction rule 0: name")
    assert refusal(Rule("a", "a"), Rule("a", "b")) == (
        "redaction rule 1 ('a'): name is the name of an earlier rule")


def test_more_than_64_rules_are_refused() -> None:
    """At most :data:`MAX_RULES` rules in one list."""
    Redactor([Rule(f"r{n}", f"x{n}y") for n in range(MAX_RULES)])
    assert refusal(*[Rule(f"r{n}", f"x{n}y") for n in range(MAX_RULES + 1)]) == (
        "more than 64 rules")


# -- the configuration ----------------------------------------------------------------------


def test_the_config_shape_parses_per_tenant_with_the_default_replacement() -> None:
    """``{tenant: [{name, pattern, replace?}]}``; an empty list or no value: no rules."""
    parsed = parse_tenant_rules({
        "acme": [{"name": "key", "pattern": "sk-\\w+"},
                 {"name": "mail", "pattern": "\\w+@acme\\.com", "replace": "<mail>"}],
        "*": [{"name": "card", "pattern": "\\d{16}", "replace": "[card]"}],
        "quiet": [],
    })
    assert sorted(parsed) == ["*", "acme"]
    assert parsed["acme"].names == ("key", "mail")
    assert parsed["acme"].apply("sk-1 x@acme.com") == ("[redacted] <mail>",
                                                       {"key": 1, "mail": 1})
    assert parse_tenant_rules(None) == {}
    assert parse_tenant_rules({}) == {}


@pytest.mark.parametrize(("raw", "message"), [
    ([], "results.redact: must map tenant names to lists of rules"),
    ({1: []}, "results.redact: a tenant name must be a string of 1 to 256 characters"),
    ({"": []}, "results.redact: a tenant name must be a string"),
    ({"acme": "sk-.*"}, "results.redact.acme: must be a list of rules"),
    ({"acme": {"name": "x"}}, "results.redact.acme: must be a list of rules"),
    ({"acme": ["sk"]}, "results.redact.acme[0]: must be a mapping"),
    ({"acme": [{"name": "a", "pattern": "b", "flags": "i"}]},
     "results.redact.acme[0]: has a key other than name, pattern and replace"),
    ({"acme": [{"pattern": "b"}]}, "results.redact.acme[0]: has no name"),
    ({"*": [{"name": "a", "pattern": "b"}, {"name": "b"}]}, "results.redact.*[1]: has no pattern"),
    ({"acme": [{"name": "a", "pattern": "x"}, {"name": "b", "pattern": "y"},
               {"name": "c", "pattern": "(?=z)"}]},
     "results.redact.acme[2].pattern: uses look-ahead"),
    ({"acme": [{"name": "a", "pattern": "x", "replace": "\\1"}]},
     "results.redact.acme[0].replace: refers to group 1; the pattern has 0"),
    ({"acme": [{"name": "a", "pattern": "x"}, {"name": "a", "pattern": "y"}]},
     "results.redact.acme[1].name: is the name of an earlier rule"),
    ({"acme": [{"name": "a b", "pattern": "x"}]}, "results.redact.acme[0].name: must be"),
    ({"acme": [{"name": f"r{n}", "pattern": "x"} for n in range(65)]},
     "results.redact.acme: more than 64 rules"),
])
def test_a_bad_config_is_refused_with_its_path(raw: object, message: str) -> None:
    """Each refusal starts with the config path of what is at fault."""
    with pytest.raises(RedactionError) as caught:
        parse_tenant_rules(raw)
    assert str(caught.value).startswith(message)


def test_a_tenant_gets_its_own_rules_then_everyones() -> None:
    """The tenant's rules first, then ``"*"``'s; a run without a tenant, or of a tenant
    without rules, gets ``"*"``'s; the combination is built once; names shared by a
    tenant's rule and a ``"*"`` rule add up."""
    parsed = parse_tenant_rules({
        "acme": [{"name": "key", "pattern": "sk-\\w+", "replace": "SECRET"}],
        "*": [{"name": "shout", "pattern": "SECRET", "replace": "[gone]"},
              {"name": "key", "pattern": "pk-\\w+"}],
    })
    acme = redactor_for(parsed, "acme")
    assert acme is not None and acme is redactor_for(parsed, "acme")
    assert acme.names == ("key", "shout", "key")
    assert acme.apply("sk-1 pk-2") == ("[gone] [redacted]", {"key": 2, "shout": 1})
    assert redactor_for(parsed, "other") is parsed["*"]
    assert redactor_for(parsed, None) is parsed["*"]
    assert redactor_for(parsed, "*") is parsed["*"]  # "*" rules once, not twice
    only_acme = parse_tenant_rules({"acme": [{"name": "k", "pattern": "k"}]})
    assert redactor_for(only_acme, "acme") is only_acme["acme"]
    assert redactor_for(only_acme, "other") is None
    assert redactor_for(only_acme, None) is None
    assert redactor_for({}, "acme") is None


def test_a_redactor_pickles_and_copies_and_its_repr_shows_names_only() -> None:
    """The configuration is deep-copied and pickled (worker processes): a copy redacts the
    same; ``repr`` never shows a pattern."""
    redactor = Redactor([Rule("live_key", SECRET, "[key]")]).then(
        Redactor([Rule("b", "b(c)", r"\1")]))
    assert redactor.apply(f"{SECRET} bc") == ("[key] c", {"live_key": 1, "b": 1})
    for clone in (pickle.loads(pickle.dumps(redactor)), copy.deepcopy(redactor)):
        assert clone.apply(f"{SECRET} bc") == ("[key] c", {"live_key": 1, "b": 1})
    assert "SECRET" not in repr(redactor)
    assert repr(redactor) == "Redactor(['live_key', 'b'])"


def test_the_documented_example_parses_and_redacts() -> None:
    """The ``results.redact`` example in docs/policies.md ("Redacting results") is a valid
    configuration and does what the page says."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "policies.md").read_text()
    block = page.split("## Redacting results", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    parsed = parse_tenant_rules(yaml.safe_load(block)["results"]["redact"])
    acme = redactor_for(parsed, "acme")
    assert acme is not None
    assert acme.apply("sk-live-ABCDEFGHIJKLMNOP Bob@ACME.example 4111 1111 1111 1234") == (
        "[redacted] <mail> [card ending 1234]", {"live_key": 1, "mail": 1, "card": 1})
    assert redactor_for(parsed, None) is parsed["*"]


# -- properties -----------------------------------------------------------------------------

needles = st.text(min_size=1, max_size=8)
texts = st.text(max_size=200)


@settings(max_examples=300, deadline=None)
@given(needles, texts)
def test_a_text_without_a_match_is_unchanged(needle: str, text: str) -> None:
    """A literal rule over a text that does not hold it: the same text, no counts."""
    text = text.replace(needle, "")
    if needle in text:  # removing one occurrence made another
        return
    redactor = Redactor([Rule("lit", _literal(needle))])
    assert redactor.apply(text) == (text, {})


@settings(max_examples=300, deadline=None)
@given(needles, texts, st.text(max_size=12).map(lambda s: s.replace("\\", "\\\\")))
def test_counts_are_the_number_of_replacements(needle: str, text: str, replace: str) -> None:
    """A literal rule rewrites exactly what ``str.replace`` does (non-overlapping, left to
    right), and counts each occurrence."""
    redactor = Redactor([Rule("lit", _literal(needle), replace)])
    expected = text.replace(needle, replace.replace("\\\\", "\\"))
    count = text.count(needle)
    assert redactor.apply(text) == (expected, {"lit": count} if count else {})


@settings(max_examples=300, deadline=None)
@given(texts)
def test_redacting_the_output_again_changes_nothing(text: str) -> None:
    """A rule whose pattern cannot match its own output (runs of 4+ digits, replaced by a
    text without digits) is idempotent: the second pass is the first pass's text, no counts;
    so is a text made only of replacement copies."""
    redactor = Redactor([Rule("digits", r"[0-9]{4,}", "[number]")])
    once, _ = redactor.apply(text)
    assert redactor.apply(once) == (once, {})
    copies = "[number]" * (len(text) % 5)
    assert redactor.apply(copies) == (copies, {})


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab@.c_ 1"), max_size=120))
def test_group_templates_agree_with_pythons_re(text: str) -> None:
    """On ASCII text, a template with groups rewrites as Python's ``re.subn`` does (RE2 and
    ``re`` agree on this pattern)."""
    pattern, replace = r"(\w+)@(\w+)\.c", r"<\2 at \g<1>>"
    expected, count = re.subn(pattern, replace, text)
    assert Redactor([Rule("mail", pattern, replace)]).apply(text) == (
        expected, {"mail": count} if count else {})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "\ud800", "é", "aa"]), max_size=400).map("".join),
       st.integers(min_value=1, max_value=400))
def test_any_text_gives_a_bounded_utf8_output(text: str, growth: int) -> None:
    """Whatever the text (lone surrogates too) and however much a rule grows it, ``apply``
    returns a UTF-8-encodable text within :func:`output_limit` of the escaped input, or
    :data:`TOO_LARGE` with the rule counted."""
    redactor = Redactor([Rule("grow", "a", "x" * growth)])
    out, counts = redactor.apply(text)
    out.encode("utf-8")
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    assert len(out) <= output_limit(len(escaped))
    if out == TOO_LARGE:
        assert counts["grow"] >= 1
    else:
        assert out == escaped.replace("a", "x" * growth)


def _literal(needle: str) -> str:
    """``needle`` as an RE2 pattern that matches it literally."""
    return "".join(f"\\x{{{ord(char):x}}}" for char in needle)
