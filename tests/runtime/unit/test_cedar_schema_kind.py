"""The Cedar schema generated from a run's tools declares the tool's identity attributes
(issue 32, item 1): ``kind``, always present, so a policy reads it without ``has``; and
``server_label``, optional (only an MCP server's approval requests have it). A policy written
against them validates; one reading an attribute the tool entity never has does not.

Who sends what: the operator writes the policy and names the tools it is checked against."""

from __future__ import annotations

from worker.runtime.governance.policy import cedar_schema, check

TOOLS = [{"type": "custom", "name": "shell"}, {"type": "mcp", "server_label": "gh"},
         {"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
BY_KIND = """\
@id("no-custom") forbid(principal, action, resource) when { resource.kind == "custom" };
@id("no-gh") forbid(principal, action, resource)
when { resource has server_label && resource.server_label == "gh" };
"""


def test_a_policy_on_the_kind_and_the_server_label_validates() -> None:
    """``resource.kind`` and ``resource.server_label`` (behind ``has``) validate against the
    schema of Responses tools; an attribute the tool entity lacks does not."""
    schema = cedar_schema(TOOLS, "openai.responses")
    assert check(BY_KIND, "p.cedar", schema) == []
    [problem] = check('permit(principal, action, resource) when { resource.flavour == "x" };',
                      "p.cedar", schema)
    assert problem.line == 1


def test_the_kind_is_required_and_the_server_label_optional() -> None:
    """``kind`` is a required String of every tool entity; ``server_label`` an optional one."""
    shape = cedar_schema(TOOLS, "openai.responses")["Latch"]["entityTypes"]["Tool"]["shape"]
    attributes = shape["attributes"]
    assert attributes["kind"] == {"type": "String"}
    assert attributes["server_label"] == {"type": "String", "required": False}
