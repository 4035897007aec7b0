"""Load ``latch.yaml``: the file, then ``LATCH_<SECTION>__<KEY>`` overrides, then the schema.

The result is one frozen :class:`Config`; nothing else in Latch reads the file or the
environment for settings. ``schemas/config.schema.json`` is the single description of every
key (type, bounds, default, meaning); the dataclasses below repeat the defaults, and a test
holds the two equal. The steps of :func:`load_config`:

1. read YAML (``latch.yaml`` in the working directory when no path is given and it exists;
   pure defaults otherwise; an explicit path that does not exist is an error);
2. check the shape: a mapping of known sections, each a mapping of known keys (``kafka``
   also takes any librdkafka setting, written with ``_`` for ``.``);
3. apply each ``LATCH_<SECTION>__<KEY>=value`` variable: string keys take the value as is,
   list keys split it on commas, other keys parse it as YAML (``4``, ``2.5``, ``true``).
   ``LATCH_`` variables without ``__`` belong to other tools and are ignored;
4. validate against the schema, then build the dataclasses (absent keys take defaults);
5. refuse ``agent_stream_assemble`` limits that let one record outgrow the output topics'
   record size (``worker.core.settings.largest_records``): the error names the keys to
   lower and the bound.

Plain data and its own validation only: the ``policy`` section names a Cedar file, which the
governance package reads and builds (``assembler_policy`` in governance/policy_source.py) in
the commands that decide calls (``latch worker``, ``latch assemble``, ``latch replay``), each
stopping with the file's ``FILE:LINE:COLUMN`` when it cannot be used. This module imports
nothing of governance (an import-linter contract in pyproject.toml).

Errors::

    ValueError
     └── ConfigError   the configuration is unusable; the message names the file, the key
                       as a dotted path and, for an override, the LATCH_ variable

Secrets: ``kafka.sasl_password`` and pass-through settings whose name looks secret never
appear in a ``repr`` or in an error message. The signing and audit keys are not in the
configuration at all: ``signing.keys`` and ``audit.keys`` say where each is (``file:``,
``env:``; :mod:`signing` reads them), and an invalid value there is never echoed (a key written
inline by mistake).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import yaml

from worker.core.redaction import RedactionError, Redactor, parse_tenant_rules
from worker.core.settings import (
    MAX_RECORD_BYTES,
    OUTPUT_RECORD_BYTES,
    ApprovalSettings,
    AssembleSettings,
    ResultSettings,
    ToolResultLimits,
    largest_records,
)
from worker.runtime.schemas import load_schema, validator

__all__ = [
    "DEFAULT_PATH",
    "ApproverSettings",
    "AuditSettings",
    "Config",
    "ConfigError",
    "KafkaSettings",
    "RegistrySettings",
    "SigningSettings",
    "TopicNames",
    "WorkerSettings",
    "load_config",
]

#: The file :func:`load_config` reads when it is given no path (relative to the cwd).
DEFAULT_PATH = "latch.yaml"

_ENV_PREFIX = "LATCH_"
_KAFKA_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_SECRET_KEY = re.compile(
    r"password|passwd|secret|token|credential|jaas|pem|ssl_key|keystore|private|oauthbearer"
    r"|^signing\.keys|^approvers\.keys|^audit\.keys")
#: A quoted part of a YAML error message longer than one character (``'!hunter2'``).
_QUOTED = re.compile(r"'[^']{2,}'|\"[^\"]{2,}\"")
_REDACTED = "***"

#: Named ``kafka`` keys and the librdkafka setting each becomes.
_LIBRDKAFKA_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "bootstrap_servers": "bootstrap.servers",
        "security_protocol": "security.protocol",
        "sasl_mechanism": "sasl.mechanism",
        "sasl_username": "sasl.username",
        "sasl_password": "sasl.password",
        "ssl_cafile": "ssl.ca.location",
        "ssl_certfile": "ssl.certificate.location",
        "ssl_keyfile": "ssl.key.location",
        "client_id": "client.id",
    }
)
_NAMED_BY_LIBRDKAFKA = MappingProxyType({v: k for k, v in _LIBRDKAFKA_NAMES.items()})


class ConfigError(ValueError):
    """The configuration cannot be used. ``str()`` names the file (or says there was none),
    each bad key as a dotted path, and the ``LATCH_`` variable when one set it."""

    def __init__(self, source: Path | None, problems: list[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        where = str(source) if source is not None else "configuration (no file)"
        if len(problems) == 1:
            message = f"{where}: {problems[0]}"
        else:
            message = "\n  ".join([f"{where}: {len(problems)} problems:", *problems])
        super().__init__(message)


class _FrozenDict(dict[str, Any]):
    """A dict that refuses changes, yet copies, pickles and ``asdict``s like a dict."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("configuration values are read-only")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[_FrozenDict], tuple[dict[str, str]]]:
        return (type(self), (dict(self),))


@dataclass(frozen=True, slots=True, repr=False)
class KafkaSettings:
    """The ``kafka`` section: how the worker's Kafka clients connect."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    client_id: str | None = None
    #: Pass-through librdkafka settings, keyed as written (``_``), values as strings.
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", _FrozenDict(self.extra))

    def confluent_config(self) -> dict[str, str]:
        """librdkafka settings for confluent-kafka clients: the named keys that are set,
        then every pass-through key with ``_`` replaced by ``.``."""
        named = {
            rdkafka: value
            for key, rdkafka in _LIBRDKAFKA_NAMES.items()
            if (value := getattr(self, key)) is not None
        }
        return named | {key.replace("_", "."): value for key, value in self.extra.items()}

    def __repr__(self) -> str:
        shown = [
            f"{f.name}={_REDACTED!r}"
            if f.name == "sasl_password" and self.sasl_password is not None
            else f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name != "extra"
        ]
        extra = {k: _REDACTED if _SECRET_KEY.search(k) else v for k, v in self.extra.items()}
        return f"KafkaSettings({', '.join(shown)}, extra={extra!r})"


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The ``topics`` section: topic names and how the worker creates the topics."""

    events: str = "llm.stream.events"
    control: str = "llm.stream.control"
    committed: str = "tool.calls.committed"
    errors: str = "tool.calls.errors"
    final: str = "llm.messages.final"
    progress: str = "llm.stream.progress"
    dlq: str = "llm.stream.dlq"
    audit: str = "latch.audit"
    run_ended: str = "llm.runs.ended"
    results: str = "tool.calls.results"
    turns: str = "llm.turns"
    journal: str = "tool.calls.journal"
    registry: str = "latch.registry"
    pending: str = "tool.calls.pending"
    partitions: int = 12
    replication_factor: int = 1


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """The ``worker`` section: the worker process."""

    app_id: str = "latch"
    tick_interval_s: float = 5.0
    finished_run_retention_s: float = 3600.0
    web_enabled: bool = False
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    http_port: int = 9464
    http_host: str = "127.0.0.1"
    log_level: str = "info"
    log_format: str = "text"
    store: str = "memory://"
    otel_exporter: str = "none"
    engine: str = "kafka"
    instance_id: str | None = None
    batch_max_records: int = 10000
    batch_max_ms: int = 100
    transaction_timeout_s: float = 10.0
    init_timeout_s: float = 30.0
    metrics_labels: tuple[str, ...] = ()
    metrics_label_cap: int = 100
    metrics_label_tools: tuple[str, ...] = ()
    metrics_label_tenants: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SigningSettings:
    """The ``signing`` section: where the committed calls' signing keys are (key id ->
    ``file:PATH`` or ``env:NAME``), and the one the worker signs with (:mod:`signing`)."""

    key_id: str | None = None
    keys: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", _FrozenDict(self.keys))


@dataclass(frozen=True, slots=True)
class ApproverSettings:
    """The ``approvers`` section: who may decide a held call (core/approvers.py; docs/policies.md,
    *Approvals*). The worker reads ``keys`` (key id -> ``file:PATH`` or ``env:NAME``, as
    ``signing.keys``), ``owners`` (key id -> the approver it proves) and ``groups`` (approver
    -> its groups); an approval tool signs with ``key_id``. No keys: no decision counts."""

    key_id: str | None = None
    keys: Mapping[str, str] = field(default_factory=dict, hash=False)
    owners: Mapping[str, str] = field(default_factory=dict, hash=False)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", _FrozenDict(self.keys))
        object.__setattr__(self, "owners", _FrozenDict(self.owners))
        groups = {k: tuple(v) for k, v in self.groups.items()}
        object.__setattr__(self, "groups", _FrozenDict(groups))


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The ``policy`` section: whether and how calls are decided by Cedar policies
    (:mod:`worker.runtime.governance.policy`; docs/policies.md, *Policies*)."""

    mode: str = "off"
    file: str | None = None
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    """The ``registry`` section: toolsets and policy sets by version (governance/registry.py)."""

    wait_s: float = 10.0
    #: The records and bytes of held runs one events partition may park (worker/runtime/hold.py).
    hold_max_records: int = 10_000
    hold_max_bytes: int = 64 * 1024 * 1024
    #: Tenants whose runs must name a registered toolset (``"*"``: all); merged into
    #: ``AssembleSettings.require_toolsets_for``.
    require_toolsets_for: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """The ``audit`` section: where the audit digests' keys are (key id -> ``file:PATH`` or
    ``env:NAME``), and the one the worker digests argument bytes with (``signing.audit_key``;
    unset: the audit records carry the argument size only)."""

    key_id: str | None = None
    keys: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", _FrozenDict(self.keys))


@dataclass(frozen=True, slots=True)
class ResultsSection:
    """The ``results`` section (the result latch; core ``ResultSettings``)."""

    enabled: bool = True
    deadline_s: float = 300.0
    max_bytes: int = 262_144
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)

    #: Tenant (``*``: every tenant) -> its redaction rules (``worker.core.redaction``).
    redact: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", _FrozenDict(
            {name: _FrozenDict(own) for name, own in self.tools.items()}))
        object.__setattr__(self, "redact", _FrozenDict(self.redact))

    def redactors(self) -> dict[str, Redactor]:
        """The tenants' redactors (``worker.core.redaction.parse_tenant_rules``); raises
        ``RedactionError`` naming the rule (checked when the configuration loads)."""
        return parse_tenant_rules({tenant: [dict(rule) for rule in rules]
                                   for tenant, rules in self.redact.items()})

    def settings(self) -> ResultSettings:
        """The core's settings of the result latch."""
        tools = tuple((name, ToolResultLimits(
            None if own.get("deadline_s") is None else float(own["deadline_s"]),
            None if own.get("max_bytes") is None else int(own["max_bytes"])))
            for name, own in sorted(self.tools.items()))
        return ResultSettings(self.enabled, self.deadline_s, self.max_bytes, tools)


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """The ``runner`` section: ``latch runner --mcp`` (worker/client/mcp.py, docs/runner.md)."""

    mcp: str | None = None
    mcp_timeout_s: float = 30.0
    tool_timeout_s: float = 120.0
    group_id: str = "latch-runner"
    transactional_id: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration; ``source`` is the file it was read from (None: no file)."""

    assemble: AssembleSettings = field(default_factory=lambda: AssembleSettings(
        results=ResultsSection().settings()))
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicNames = field(default_factory=TopicNames)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    signing: SigningSettings = field(default_factory=SigningSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    approvals: ApprovalSettings = field(default_factory=ApprovalSettings)
    approvers: ApproverSettings = field(default_factory=ApproverSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    results: ResultsSection = field(default_factory=ResultsSection)
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    source: Path | None = None


#: YAML section name -> the dataclass it becomes and the Config field holding it.
_SECTIONS: Mapping[str, tuple[type[Any], str]] = MappingProxyType(
    {
        "agent_stream_assemble": (AssembleSettings, "assemble"),
        "kafka": (KafkaSettings, "kafka"),
        "topics": (TopicNames, "topics"),
        "worker": (WorkerSettings, "worker"),
        "signing": (SigningSettings, "signing"),
        "policy": (PolicySettings, "policy"),
        "registry": (RegistrySettings, "registry"),
        "approvals": (ApprovalSettings, "approvals"),
        "approvers": (ApproverSettings, "approvers"),
        "audit": (AuditSettings, "audit"),
        "results": (ResultsSection, "results"),
        "runner": (RunnerSettings, "runner"),
    }
)


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Read, override, validate and freeze the configuration (see the module docstring).

    ``env`` defaults to ``os.environ``. Raises :class:`ConfigError`.
    """
    source = _resolve(path)
    data = _read(source) if source is not None else {}
    policy = data.get("policy")
    if isinstance(policy, dict) and policy.get("mode") is False:
        policy["mode"] = "off"  # YAML 1.1 reads an unquoted `off` as false
    problems = _check_shape(data)
    origins, env_problems = _apply_env(data, os.environ if env is None else env)
    problems += env_problems
    if not problems:
        problems = _validate(data, origins)
    if problems:
        raise ConfigError(source, problems)
    config = _build(data, source)
    problems = _record_problems(config.assemble)
    try:
        config.results.redactors()
    except RedactionError as exc:  # (names the rule, never its pattern)
        problems.append(str(exc))
    if problems:
        raise ConfigError(source, problems)
    return config


def _record_problems(settings: AssembleSettings) -> list[str]:
    """The records ``settings`` let grow past what an output record may hold, each naming the
    limits that bound it (see ``worker.core.settings.largest_records``)."""
    return [
        f"agent_stream_assemble: {what} may take {size} bytes under "
        f"{', '.join(f'{key} ({getattr(settings, key)})' for key in keys)}, more than the "
        f"{MAX_RECORD_BYTES} bytes a record may hold (the output topics' max.message.bytes, "
        f"{OUTPUT_RECORD_BYTES}, less 1 MiB for key, headers and framing): lower "
        f"{'it' if len(keys) == 1 else 'one of them'}"
        for what, size, keys in largest_records(settings) if size > MAX_RECORD_BYTES
    ]


def _resolve(path: str | os.PathLike[str] | None) -> Path | None:
    if path is None:
        default = Path(DEFAULT_PATH)
        return default if default.is_file() else None
    explicit = Path(path)
    if not explicit.is_file():
        raise ConfigError(explicit, ["no such file"])
    return explicit


def _read(source: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"cannot read: {exc}"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"invalid YAML: {_yaml_problem(exc)}"]) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            source, [f"the top level must be a mapping of sections, not {_kind(loaded)}"]
        )
    return loaded


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where (line, column), never a snippet of the file: the line at fault
    may hold a password. A quoted part longer than one character (a tag, an anchor) is left
    out for the same reason."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return type(exc).__name__
    problem = _QUOTED.sub("'...'", exc.problem or exc.context or "syntax error")
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = f" ({exc.context})" if exc.context and exc.problem else ""
    return f"{where}{problem}{context}"


def _check_shape(data: dict[str, Any]) -> list[str]:
    """Sections known and mappings (an empty ``section:`` is an empty one), keys known."""
    problems: list[str] = []
    for section in list(data):
        if section not in _SECTIONS:
            problems.append(f"unknown section {section}")
            continue
        if data[section] is None:
            data[section] = {}
        if not isinstance(data[section], dict):
            problems.append(f"{section}: must be a mapping, not {_kind(data[section])}")
            continue
        problems += [
            f"{p} {section}.{key}" for key in data[section] if (p := _bad_key(section, key))
        ]
    return problems


def _bad_key(section: str, key: object) -> str | None:
    """Why ``key`` cannot be in ``section`` ("unknown key", "invalid key"), or None."""
    if section == "kafka":
        if not isinstance(key, str) or _KAFKA_KEY.match(key) is None:
            return "invalid key (lower case letters, digits and _ only)"
        named = _NAMED_BY_LIBRDKAFKA.get(key.replace("_", "."))
        return f"use kafka.{named} instead of" if named not in (None, key) else None
    return None if key in _properties(section) else "unknown key"


def _apply_env(
    data: dict[str, Any], env: Mapping[str, str]
) -> tuple[dict[tuple[str, str], str], list[str]]:
    """Apply ``LATCH_<SECTION>__<KEY>`` variables in name order; return where each came from."""
    origins: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    for name in sorted(env):
        if not name.startswith(_ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name.removeprefix(_ENV_PREFIX).lower().partition("__")
        if section not in _SECTIONS:
            problems.append(f"unknown section {section} (from {name})")
        elif bad := _bad_key(section, key):
            problems.append(f"{bad} {section}.{key} (from {name})")
        elif isinstance(target := data.setdefault(section, {}), dict):
            prop = _properties(section).get(key, {"type": "string"})
            target[key] = _parse_env(env[name], prop)
            origins[(section, key)] = name
    return origins, problems


def _parse_env(value: str, prop: Mapping[str, Any]) -> Any:
    """A variable's value as the key's schema type expects it."""
    kind = prop.get("type", "string")
    if kind == "string":  # also enums of strings, which declare no type
        return value
    if kind == "array" and not value.lstrip().startswith("["):
        return [item.strip() for item in value.split(",") if item.strip()]
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value  # the schema reports the wrong type


def _validate(data: dict[str, Any], origins: Mapping[tuple[str, str], str]) -> list[str]:
    errors = sorted(
        validator("config").iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]
    )
    problems = []
    for error in errors:
        path = [str(part) for part in error.absolute_path]
        message = error.message
        if _SECRET_KEY.search(".".join(path)):  # the key is named; its value never is
            message = f"invalid value (fails {error.validator})"
        origin = origins.get((path[0], path[1])) if len(path) >= 2 else None
        suffix = f" (from {origin})" if origin else ""
        problems.append(f"{'.'.join(path) or '(top level)'}: {message}{suffix}")
    return problems


def _build(data: Mapping[str, Any], source: Path | None) -> Config:
    built: dict[str, Any] = {}
    for section, (cls, attribute) in _SECTIONS.items():
        values = dict(data.get(section, {}))
        props = _properties(section)
        if section == "kafka":
            extra = {k: _kafka_value(values.pop(k)) for k in list(values) if k not in props}
            values["extra"] = extra
        built[attribute] = cls(**{k: _convert(v, props.get(k, {})) for k, v in values.items()})
    # The core reads the approvals with the rest of its settings (AssembleSettings.approvals).
    # ...and the tenants that must name a registered toolset (registry.require_toolsets_for).
    # ...and the result latch (the results section).
    built["assemble"] = replace(built["assemble"], approvals=built["approvals"],
                                require_toolsets_for=built["registry"].require_toolsets_for,
                                results=built["results"].settings())
    return Config(**built, source=source)


def _convert(value: Any, prop: Mapping[str, Any]) -> Any:
    """A validated value as its dataclass field holds it."""
    kind = prop.get("type")
    if kind == "array":
        return tuple(value)
    if kind == "number":
        return float(value)
    if kind == "integer":
        return int(value)  # JSON Schema counts 3.0 as an integer
    return value


def _kafka_value(value: str | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@cache
def _config_schema() -> dict[str, Any]:
    """config.schema.json, parsed once; read only."""
    return load_schema("config")


def _properties(section: str) -> dict[str, Any]:
    props: dict[str, Any] = _config_schema()["properties"][section]["properties"]
    return props


def _kind(value: object) -> str:
    """``a list``, ``a string``, ``an int``: for messages about a value of the wrong kind."""
    names: dict[type, str] = {list: "list", str: "string", dict: "mapping"}
    name = names.get(type(value), type(value).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
