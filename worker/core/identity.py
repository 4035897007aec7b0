"""One tool identity: the name and kind every reader of a call sees (issue 32, item 1).

Inside the core a run's tool is found by its *key* (:func:`worker.core.tools.client_tools`).
A function tool's key is its name; the Responses tools whose items a client answers register
under a key that holds their item kind (``custom:<name>``, ``computer_call:``,
``local_shell_call:``, ``mcp_approval_request:<server_label>``; decision 0004), so that a call
of one kind never finds a tool of another (a function call named ``shell`` does not find a
custom tool ``shell``). The key is for that lookup only. Everything else sees one **name**,
the one the committed record carries: the policy's resource ``Latch::Tool::"<name>"``,
``approvals.require_approval``, the ``tool`` metric label, the committed, pending, error and
audit records, and the runner. The policy's resource also has the tool's **kind**, what type
the run declared it as, so that a policy can target kinds (``resource.kind == "custom"``):

====================================================  ==========================  ===========
declared as                                           name                        kind
====================================================  ==========================  ===========
a function tool, any provider's format                its name                    function
an MCP ``tools/list`` entry (``inputSchema``)         its name                    mcp
Responses ``{"type": "custom", "name": N}``           N                           custom
Responses ``computer_use_preview`` / ``computer``     ``computer``                computer
Responses ``local_shell``                             ``local_shell``             local_shell
Responses ``shell`` (no container ``environment``)    ``shell``                   shell
Responses ``apply_patch``                             ``apply_patch``             apply_patch
Chat ``{"type": "custom", "custom": {"name": N}}``    N                           custom
Responses ``{"type": "mcp", "server_label": L}``      each approval request's     mcp (and
                                                      MCP tool name               server_label L)
Anthropic ``<type>_<YYYYMMDD>`` (``bash_20250124``)   its name                    <type> (bash,
                                                                                  text_editor,
                                                                                  computer...)
====================================================  ==========================  ===========

A kind for a later item type is one more row: its declaration's type, the name its committed
record carries, and the kind (Responses ``shell`` and ``apply_patch``, issue 33, were).

Who sends what. The declarations come from the run's ``run.start`` (the gateway, for its
tenant) or from an operator's registry toolset: trusted to say which tools the run has, not to
make one name mean two tools. A call's name and item kind come from the model's stream, which
is trusted for nothing: it only picks among the declared tools, by key, and a key finds a tool
only when the tool was declared as the call's kind (:meth:`Identities.declared_as`: a function
named ``custom:shell`` is no custom tool ``shell``, nor the reverse).

**Two tools that would share a name are an ambiguity, refused, never guessed.** When two
entries of one run's tools have one name, or one key (two functions ``dup``; a function and a
custom tool ``shell``; a function named ``custom:shell`` beside a custom tool ``shell``), every
call of that name or key fails ``ambiguous_tool``; so does an MCP server's approval request
whose tool name is also a declared tool's. Only those calls are refused, not the run: the rest
of its tools are unambiguous and their calls go on, and each refused call still gets its one
error result (as a tool with a broken schema fails only its own calls, ``schema_invalid``).
Refusing the run instead would need an outcome for a ``run.start`` that is well formed, and
would take down calls nothing is wrong with. Picking one of the two (the first, as the tool map
alone would) is the guess this refuses: the policy, the approvals and the runner would each
have to assume the same one. Two approval requests of two MCP servers with one tool name are
not refused: each carries its ``server_label``, in its arguments and as a resource attribute.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from worker.core.tools import client_entries

__all__ = ["FUNCTION", "KINDS", "MCP", "NO_IDENTITIES", "RESPONSES_ITEM_NAMES", "Identities",
           "ToolIdentity", "identities"]

#: The kinds a tool's resource has (``resource.kind``), besides Anthropic's dated tool types.
FUNCTION, CUSTOM, COMPUTER, LOCAL_SHELL, MCP, SHELL, APPLY_PATCH = (
    "function", "custom", "computer", "local_shell", "mcp", "shell", "apply_patch")
KINDS = (FUNCTION, CUSTOM, COMPUTER, LOCAL_SHELL, MCP, SHELL, APPLY_PATCH)
#: The name a committed ``computer_call``, ``local_shell_call``, ``shell_call`` or
#: ``apply_patch_call`` carries (its item has none).
RESPONSES_ITEM_NAMES = {"computer_call": "computer", "local_shell_call": "local_shell",
                        "shell_call": "shell", "apply_patch_call": "apply_patch"}
#: Responses tool types whose items a client answers without a name: their name and kind.
_RESPONSES_NAMELESS = {"computer_use_preview": ("computer", COMPUTER),
                       "computer": ("computer", COMPUTER),
                       "local_shell": ("local_shell", LOCAL_SHELL),
                       "shell": ("shell", SHELL), "apply_patch": ("apply_patch", APPLY_PATCH)}
#: An Anthropic-defined tool type: the kind, then the version date.
_DATED = re.compile(r"([a-z][a-z0-9_]*?)_(\d{8})")
#: The call kind (``ops.CALL_KINDS``) of an MCP server's approval request.
_APPROVAL_CALL = "mcp_approval_request"
#: The tool kind each call kind of a Responses item a client answers must find.
_ITEM_KINDS = {"custom": CUSTOM, "computer_call": COMPUTER, "local_shell_call": LOCAL_SHELL,
               _APPROVAL_CALL: MCP, "shell_call": SHELL, "apply_patch_call": APPLY_PATCH}


class ToolIdentity(NamedTuple):
    """What a registered tool is, beyond its key."""

    #: Its name (None: an MCP server's, whose tools are named by each approval request).
    name: str | None
    kind: str
    #: The MCP server of a Responses ``mcp`` tool.
    server_label: str | None = None


class Identities:
    """The identities of one run's tools (module docstring): only those that are not a
    function named by its key are kept, and most runs have none (:data:`NO_IDENTITIES`)."""

    __slots__ = ("ambiguous", "names", "others")

    def __init__(self, others: dict[str, ToolIdentity], ambiguous: frozenset[str]) -> None:
        #: By key, the tools that are not a function named by their key.
        self.others = others
        #: The names and keys two of the run's tools share: their calls are refused.
        self.ambiguous = ambiguous
        #: The names of :attr:`others` (a function's name is its key in the run's tools).
        self.names = frozenset(i.name for i in others.values() if i.name is not None)

    def refuses(self, key: str, name: str, call_kind: str, tools: Mapping[str, Any]) -> bool:
        """Whether a call of ``name``, found under ``key``, is ambiguous (``tools``: the run's
        tools by key)."""
        if key in self.ambiguous or name in self.ambiguous:
            return True
        if call_kind != _APPROVAL_CALL:
            return False
        # An approval request's name is no key: is it a declared tool's name?
        return name in self.names or (name in tools and name not in self.others)

    def declared_as(self, key: str, call_kind: str) -> bool:
        """Whether the tool registered under ``key`` was declared as a tool that a call of
        ``call_kind`` calls: a function call, a tool named by its key (a function, an MCP
        entry, an Anthropic client tool); any other, a tool of the kind its item answers. A key
        alone never decides it: a function may be named ``custom:shell``."""
        identity = self.others.get(key)
        expected = _ITEM_KINDS.get(call_kind)
        if expected is None:
            return identity is None or identity.name == key
        return (identity is not None and identity.kind == expected
                and (identity.name is None) == (call_kind == _APPROVAL_CALL))

    def key_of(self, name: str, tools: Mapping[str, Any]) -> str | None:
        """The key of the run's tool named ``name`` (``tools``: the run's tools by key); None
        when none is (or only an MCP server's approval requests may be)."""
        if name in tools and name not in self.others:
            return name
        return next((k for k, i in self.others.items() if i.name == name), None)

    def attributes(self, key: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """A tool's attributes as a policy sees them: ``given`` (its annotations and toolset,
        ``tools.tool_attributes``), its ``kind`` and, for an MCP server, ``server_label``."""
        identity = self.others.get(key)
        if identity is None:
            return {**given, "kind": FUNCTION}
        found = {**given, "kind": identity.kind}
        if identity.server_label is not None:
            found["server_label"] = identity.server_label
        return found


NO_IDENTITIES = Identities({}, frozenset())


def identity(provider: str, key: str, entry: Mapping[str, Any]) -> ToolIdentity:
    """The identity of the tool ``entry`` declares, registered under ``key``."""
    kind = entry.get("type")
    if "inputSchema" in entry:  # an MCP tools/list entry, in any provider's list
        return ToolIdentity(key, MCP)
    if provider == "openai.responses" and kind != "function":
        if kind == "custom":
            return ToolIdentity(entry["name"], CUSTOM)
        if kind == "mcp":
            return ToolIdentity(None, MCP, entry["server_label"])
        row = _RESPONSES_NAMELESS.get(kind) if isinstance(kind, str) else None
        if row is None:  # not expected (tests/core/unit/test_identity.py): its key, then
            return ToolIdentity(key, str(kind))
        return ToolIdentity(*row)
    if provider == "openai.chat" and kind == "custom":  # (client_entries checked its name)
        return ToolIdentity(entry["custom"]["name"], CUSTOM)
    if provider == "anthropic.messages" and isinstance(kind, str) and kind != "custom":
        dated = _DATED.fullmatch(kind)
        return ToolIdentity(key, dated.group(1) if dated else kind)
    return ToolIdentity(key, FUNCTION)


def identities(provider: str, tools: Any) -> Identities:
    """The identities of the client tools of ``tools`` (``run.start``'s, in ``provider``'s
    format or MCP entries), and the names and keys that two of them share."""
    others: dict[str, ToolIdentity] = {}
    #: Each entry's (key, name): most are a function's (key, key), decided without a call.
    pairs: list[tuple[str, str | None]] = []
    plain = provider not in ("openai.responses", "anthropic.messages")
    for key, _, entry in client_entries(provider, tools):
        if plain and "inputSchema" not in entry and entry.get("type") != "custom":
            pairs.append((key, key))
            continue
        found = identity(provider, key, entry)
        pairs.append((key, found.name))
        if (found.name != key or found.kind != FUNCTION) and key not in others:
            others[sys.intern(key)] = found
    ambiguous = _shared(pairs)
    if not others and not ambiguous:
        return NO_IDENTITIES
    return Identities(others, ambiguous)


def _shared(pairs: list[tuple[str, str | None]]) -> frozenset[str]:
    """The keys and names that two of ``pairs`` (key, name) share, with the names and keys
    of the pairs that share them."""
    keys = {key for key, _ in pairs}
    names = [name for _, name in pairs if name is not None]
    if len(keys) == len(pairs) and len(set(names)) == len(names):
        return _NONE_SHARED  # (nearly every run: no key nor name twice)
    key_count: dict[str, int] = {}
    name_count: dict[str, int] = {}
    for key, name in pairs:
        key_count[key] = key_count.get(key, 0) + 1
        if name is not None:
            name_count[name] = name_count.get(name, 0) + 1
    shared = {k for k, n in key_count.items() if n > 1} | {
        k for k, n in name_count.items() if n > 1}
    for key, name in pairs:  # a pair with a shared key or name shares both
        if key in shared or name in shared:
            shared.add(key)
            if name is not None:
                shared.add(name)
    return frozenset(shared)


_NONE_SHARED: frozenset[str] = frozenset()
