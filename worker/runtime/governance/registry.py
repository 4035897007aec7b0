"""The registry: toolsets and policy sets by version, as every worker reads them.

Engine-neutral and pure (no Kafka client, no clock): :mod:`.registry_io` reads the
registry topic (``topics.registry``, one compacted partition, ``LogAppendTime``) into a
:class:`RegistryState`, and the core asks it for a toolset through a pure lookup
(:meth:`RegistryState.toolset`, ``Assembler.toolsets``). ``docs/decisions/0014-registry.md``
says why it is built this way.

Records (``schemas/registry.schema.json``), keyed so that compaction keeps every version::

    toolset/<name>/<version>/<sha256-12>  {"v": 1, "type": "toolset", "name", "version", "tools"}
    policy/<version>/<sha256-12>          {"v": 1, "type": "policy", "version", "cedar"}
    fence                                 null (a tombstone: a reader's probe of the broker clock)

**Versions are immutable.** The key carries a digest of the content, so compaction (which keeps
the last record per key) never replaces one content by another; a reader takes, per version,
the record it reads first, the one with the lowest offset. A later record for the same version
with another digest is a *conflict*: ignored, and reported by ``latch registry list``.

**The wait rule.** A run that names ``{"toolset": NAME, "version": N}`` gets that version iff
its registry record's broker append time is at most the run.start record's time (also the
broker's: the events topic is ``LogAppendTime``) plus ``registry.wait_s``. Otherwise every
call of the run fails ``unknown_toolset``. Whether it counts depends on the two logs only, so
replay decides as the live worker did; live, the worker holds that run (its records parked:
:mod:`worker.runtime.hold`) until its reader has read the version, or has read a record
appended after that deadline (:meth:`settled`), probing with a ``fence`` tombstone when the
registry is quiet.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from worker.core import strictjson
from worker.core.envelope import MAX_TOOLSET_NAME_LENGTH, PROVIDERS
from worker.core.settings import AssembleSettings
from worker.core.tools import (
    MCP_ANNOTATIONS,
    MCP_INPUT_SCHEMA,
    ValidatorCache,
    client_tools,
    output_schemas,
)

__all__ = ["FENCE", "POLICY", "TOOLSET", "Entry", "Invalid", "RegistryState", "check_policy",
           "check_toolset", "content_key", "decode", "encode"]

TOOLSET, POLICY = "toolset", "policy"
#: The key of the readers' fence records (tombstones: compaction drops them).
FENCE = b"fence"
#: The longest Cedar policy text a policy set record may hold (bytes; the worker's build
#: refuses a longer one too: governance/policy_file.py).
MAX_CEDAR_BYTES = 512 * 1024


class Invalid(ValueError):
    """A registry record or a version to register that does not validate (the message says
    what is wrong where, never the content)."""


class Entry(NamedTuple):
    """One version as the registry holds it."""

    kind: str
    #: The toolset's name ("" for a policy set).
    name: str
    version: int
    #: The toolset's tools array, or the policy set's Cedar text.
    content: Any
    digest: str
    offset: int
    #: The broker's append time of its record (ms).
    time_ms: int


def digest(kind: str, name: str, version: int, content: Any) -> str:
    """The first 12 hex digits of the SHA-256 of the version's canonical JSON."""
    body = orjson.dumps([kind, name, version, content], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(body).hexdigest()[:12]


def content_key(kind: str, name: str, version: int, content: Any) -> bytes:
    """The record key of a version: its kind, name, version and content digest."""
    where = f"{kind}/{name}/{version}" if kind == TOOLSET else f"{kind}/{version}"
    return f"{where}/{digest(kind, name, version, content)}".encode()


def encode(kind: str, name: str, version: int, content: Any) -> tuple[bytes, bytes]:
    """The key and value of the record that registers a version."""
    doc: dict[str, Any] = {"v": 1, "type": kind}
    if kind == TOOLSET:
        doc |= {"name": name, "version": version, "tools": content}
    else:
        doc |= {"version": version, "cedar": content}
    return content_key(kind, name, version, content), orjson.dumps(doc)


def decode(key: bytes | None, value: bytes) -> tuple[str, str, int, Any]:
    """A registry record as ``(kind, name, version, content)``; raises :class:`Invalid`
    (a record that is not one, or whose key does not match its content)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise Invalid(f"not JSON ({exc.msg})") from exc
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise Invalid("not a registry record (v 1)")
    kind, version = doc.get("type"), doc.get("version")
    if type(version) is not int or version < 1:
        raise Invalid("version is not a positive integer")
    if kind == TOOLSET:
        name, content = doc.get("name"), doc.get("tools")
        if not _is_name(name) or not isinstance(content, list):
            raise Invalid("a toolset needs a name and a tools array")
    elif kind == POLICY:
        name, content = "", doc.get("cedar")
        if not isinstance(content, str):
            raise Invalid("a policy set needs its cedar text")
    else:
        raise Invalid("type is neither toolset nor policy")
    assert isinstance(name, str)
    if key != content_key(kind, name, version, content):
        raise Invalid("the key does not match the record's content")
    return kind, name, version, content


def _is_name(name: Any) -> bool:
    return (isinstance(name, str) and 0 < len(name) <= MAX_TOOLSET_NAME_LENGTH
            and "/" not in name)


def check_toolset(name: str, tools: Any, settings: AssembleSettings | None = None
                  ) -> list[str]:
    """Check a toolset to register; return the providers whose format reads its every entry
    as a client tool. Raises :class:`Invalid` saying what is wrong where: the bounds of a
    ``run.start``'s tools (nesting, schema size, a schema the worker cannot use), which an MCP
    entry's ``outputSchema`` meets too, and an MCP entry's ``annotations`` that is not an
    object (both are kept as the entry holds them: ``worker.core.tools.output_schemas``)."""
    settings = settings or AssembleSettings()
    if not _is_name(name):
        raise Invalid(f"a toolset name has 1 to {MAX_TOOLSET_NAME_LENGTH} characters, no '/'")
    if not isinstance(tools, list) or not tools:
        raise Invalid("tools must be a non-empty JSON array, in a provider's own format")
    if strictjson.nested_deeper({"tools": tools}):
        raise Invalid(f"tools nest deeper than {strictjson.MAX_DEPTH} levels")
    cache = ValidatorCache()
    readers = []
    for provider in sorted(PROVIDERS):
        found = client_tools(provider, tools)
        if not found:
            continue
        for tool, schema in found.items():
            prepared = cache.prepare(schema, settings.max_tool_schema_bytes)
            broken = prepared.check().broken
            if broken is not None:
                raise Invalid(f"tool {tool!r} ({provider} format): its schema is not usable "
                              f"({broken})")
        for tool, schema in output_schemas(provider, tools).items():
            broken = cache.prepare(schema, settings.max_tool_schema_bytes).check().broken
            if broken is not None:
                raise Invalid(f"tool {tool!r}: its outputSchema is not usable ({broken})")
        readers.append(provider)
    if not readers:
        raise Invalid("no entry of tools is a client tool in any provider's format")
    for entry in tools:
        if isinstance(entry, dict) and MCP_INPUT_SCHEMA in entry and \
                entry.get(MCP_ANNOTATIONS) is not None and \
                not isinstance(entry[MCP_ANNOTATIONS], dict):
            raise Invalid(f"tool {entry.get('name')!r}: its annotations are not an object")
    return readers


def check_policy(text: str, version: int = 1) -> None:
    """Check a policy set's Cedar text by the worker's own build of a registry version
    (:func:`worker.runtime.governance.policy.registry_policy`: size, Cedar's parser, no
    template, unique ids), so that ``put`` registers exactly the sets every worker can build;
    raises :class:`Invalid` saying why and where (``registry policy N:LINE:COLUMN``)."""
    try:  # the policy step's engine (issue 25); optional here
        from worker.runtime.governance.policy import registry_policy
    except ImportError as exc:
        raise Invalid("cannot check Cedar policies: cedarpy is not installed (pip install "
                      "cedarpy)") from exc
    try:
        registry_policy(text, "enforce", version)
    except ValueError as exc:
        raise Invalid(f"no worker can build this policy set (it does not parse, or Latch "
                      f"refuses it): {exc}") from exc


@dataclass
class RegistryState:
    """What a reader has read of the registry: the versions, the conflicts, and how far."""

    #: (kind, name, version) -> the version's first record.
    entries: dict[tuple[str, str, int], Entry] = field(default_factory=dict)
    #: Later records for a version with another content: ignored, reported.
    conflicts: list[Entry] = field(default_factory=list)
    #: Records that are not registry records: (offset, why).
    invalid: list[tuple[int, str]] = field(default_factory=list)
    #: The offset of the next record to read.
    next_offset: int = 0
    #: The latest append time read (ms), fences included; -1: nothing read.
    read_ms: int = -1

    def apply(self, key: bytes | None, value: bytes | None, offset: int, time_ms: int) -> None:
        """One registry record, in offset order."""
        self.next_offset = max(self.next_offset, offset + 1)
        self.read_ms = max(self.read_ms, time_ms)
        if value is None:  # a fence (or any tombstone): only the clock moves
            return
        try:
            kind, name, version, content = decode(key, value)
        except Invalid as exc:
            self.invalid.append((offset, str(exc)))
            return
        entry = Entry(kind, name, version, content, key.decode().rsplit("/", 1)[1]
                      if key else "", offset, time_ms)
        first = self.entries.get((kind, name, version))
        if first is None:
            self.entries[(kind, name, version)] = entry
        elif first.digest != entry.digest and first.offset < offset:
            self.conflicts.append(entry)

    def get(self, kind: str, name: str, version: int) -> Entry | None:
        return self.entries.get((kind, name, version))

    def toolset(self, name: str, version: int, at_ms: int, wait_ms: int) -> Any:
        """The tools of toolset ``name`` ``version`` for a run.start at record time ``at_ms``:
        None unless its record was appended at most ``wait_ms`` later (the wait rule)."""
        entry = self.entries.get((TOOLSET, name, version))
        if entry is None or entry.time_ms > at_ms + wait_ms:
            return None
        return entry.content

    def settled(self, name: str, version: int, at_ms: int, wait_ms: int) -> bool:
        """Whether :meth:`toolset` is final for this run.start: the version is read, or a
        record appended after the deadline is (append times do not go back in one log)."""
        return (TOOLSET, name, version) in self.entries or self.read_ms > at_ms + wait_ms

    def policy(self, version: int) -> Entry | None:
        return self.entries.get((POLICY, "", version))

    def policy_text(self, version: int) -> str | None:
        """The Cedar text of policy set ``version`` (None: not read)."""
        entry = self.policy(version)
        return None if entry is None else str(entry.content)

    def policy_registered(self, version: int, at_ms: int) -> bool | None:
        """Whether policy set ``version`` was registered (its record's append time) by
        ``at_ms`` plus :data:`MARKER_SKEW_MS`, so that a marker at record time ``at_ms`` may
        name it: True or False once final, None while the registry is not read far enough to
        say (:func:`marker_refusal`). A worker marks only a version its reader has read, so
        its marker is later than the version's record, but for the two brokers' clocks."""
        entry = self.policy(version)
        if entry is not None:
            return entry.time_ms <= at_ms + MARKER_SKEW_MS
        return False if self.read_ms > at_ms + MARKER_SKEW_MS else None

    def latest_policy(self) -> int | None:
        """The highest policy set version read (None: none)."""
        versions = [v for (kind, _, v) in self.entries if kind == POLICY]
        return max(versions) if versions else None

    def listing(self) -> list[Entry]:
        """Every version, by kind, name and version."""
        return [self.entries[k] for k in sorted(self.entries)]


# -- the policy set in force, as each events partition records it --------------------------
#
# When a worker's reader sees a new policy set version, the worker writes a marker into each
# events partition it owns (beside its ticks); the driver puts the version in force when it
# applies the marker, so live and replay change policy at the same log position. A marker
# written twice (by a worker that died and by its successor) is harmless: same version.
#
# Who writes what: the worker that owns the partition writes markers, only for a version newer
# than the one in force that its reader has read. But whoever may write the events topic (the
# gateway) can write a record with the marker's key too, so a marker is trusted for no more
# than the worker would do itself (:func:`marker_refusal`): it never puts an older version back
# in force (a forged marker naming a permissive old set), and never a version the registry did
# not hold by the marker's time (a forged marker naming a version nobody registered would deny
# every call of the partition, and hold the engine while the reader looks for it).

#: How much later than a marker's record time (the events partition leader's clock) its
#: version's registry record may be appended (the registry leader's clock): the skew allowed
#: between two brokers' clocks. A marker naming a version not registered by then is refused,
#: final once the reader has read that far (a fence round trip when it follows the registry).
MARKER_SKEW_MS = 2_000
#: The key of the policy markers in the events topic.
POLICY_MARKER_KEY = "__latch_policy__"
POLICY_MARKER = POLICY_MARKER_KEY.encode()
#: How many markers a partition's policy head remembers (a rebuild starts with the version
#: its first run's head names, ``partition.POLICY_AT``; these decide only for a head that
#: names none, and at the committed offset when there is nothing to read).
POLICY_HISTORY = 16


def marker_value(version: int, ts_ms: int) -> bytes:
    """The value of a policy marker naming ``version``."""
    return orjson.dumps({"v": 1, "type": "policy", "version": version, "ts": ts_ms})


def marker_version(value: bytes) -> int | None:
    """The version a policy marker names (None: not a marker Latch wrote)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != "policy":
        return None
    version = doc.get("version")
    if type(version) is not int or version < 1:
        return None
    return version


def marker_refusal(version: int, in_force: int | None, registered: bool | None) -> str | None:
    """Why a policy marker naming ``version`` changes nothing (None: it puts ``version`` in
    force). ``in_force``: the version in force in the partition; ``registered``:
    :meth:`RegistryState.policy_registered` at the marker's record time (None: unknown, as
    when a reader could not read far enough within its hold: then the version goes in force,
    unread, and denies every call until its text is read: fail closed)."""
    if in_force is not None and version < in_force:
        return (f"it names policy set version {version}, older than version {in_force} in "
                "force (versions only go forward)")
    if registered is False:
        return f"the registry held no policy set version {version} by the marker's time"
    return None


def policy_head_key(partition: int) -> bytes:
    """The heads-table key of events partition ``partition``'s policy history."""
    return f"{POLICY_MARKER_KEY}:{partition}".encode()


def in_force(history: Any, offset: int) -> int | None:
    """The version in force at ``offset`` after the markers ``history`` ([[offset, version]],
    oldest first): the latest one before it (None: none, or too old to be remembered). An
    entry that is not ``[offset, version]`` (never written by Latch) is skipped."""
    version = None
    for entry in history if isinstance(history, list) else []:
        if (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int
                and type(entry[1]) is int and entry[1] >= 1 and entry[0] < offset):
            version = entry[1]
    return version
