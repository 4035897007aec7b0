"""``worker.runtime.config``: the file, the ``LATCH_`` overrides, validation, defaults that cannot
drift from the schema, and secrets that never print."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest

from worker.core.settings import ApprovalSettings, AssembleSettings, ResultSettings
from worker.runtime.config import (
    ApproverSettings,
    AuditSettings,
    Config,
    ConfigError,
    KafkaSettings,
    PolicySettings,
    RegistrySettings,
    ResultsSection,
    RunnerSettings,
    SigningSettings,
    TopicNames,
    WorkerSettings,
    load_config,
)
from worker.runtime.schemas import load_schema

REPO = Path(__file__).resolve().parents[3]
SECTIONS: dict[str, Any] = {
    "agent_stream_assemble": AssembleSettings,
    "kafka": KafkaSettings,
    "topics": TopicNames,
    "worker": WorkerSettings,
    "signing": SigningSettings,
    "policy": PolicySettings,
    "registry": RegistrySettings,
    "approvals": ApprovalSettings,
    "approvers": ApproverSettings,
    "audit": AuditSettings,
    "runner": RunnerSettings,
    "results": ResultsSection,
}


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in an empty directory, so no stray latch.yaml is picked up."""
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "latch.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(path: Path | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={} if env is None else env)
    return str(caught.value)


# -- defaults -----------------------------------------------------------------------------


def test_no_file_no_env_gives_defaults() -> None:
    """Without latch.yaml and without LATCH_ variables, every setting is its default."""
    config = load_config(env={})
    assert config == Config()
    # (the core's own default leaves the result latch off; the worker's turns it on)
    assert config.assemble == AssembleSettings(results=ResultSettings(enabled=True))
    assert config.source is None


def test_approvals_section_reaches_the_core() -> None:
    """The ``approvals`` section (issue 26) is read, and the core's settings carry it
    (``AssembleSettings.approvals``), so every assembler the worker, replay or assemble makes
    holds calls the same way."""
    config = load_config(env={"LATCH_APPROVALS__REQUIRE_APPROVAL": "delete_file,wire_money",
                              "LATCH_APPROVALS__DESTRUCTIVE": "true",
                              "LATCH_APPROVALS__APPROVAL_TIMEOUT_S": "30"})
    expected = ApprovalSettings(("delete_file", "wire_money"), True, 30.0)
    assert config.approvals == expected
    assert config.assemble.approvals == expected


def test_schema_defaults_equal_dataclass_defaults() -> None:
    """For every key of every section, config.schema.json's default is the dataclass default
    (absent in the schema exactly where the dataclass default is None), and the schema names
    exactly the dataclass fields: the two can never drift."""
    schema = load_schema("config")["properties"]
    assert set(schema) == set(SECTIONS)
    for section, cls in SECTIONS.items():
        props = schema[section]["properties"]
        # (AssembleSettings.approvals is the approvals section, merged in by load_config, as
        # is registry.require_toolsets_for; its audit_key is read from where audit.keys says)
        merged = {"approvals", "audit_key"} | (
            {"require_toolsets_for", "results"} if section == "agent_stream_assemble"
            else set())
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"} - merged
        assert set(props) == names, section
        for key, value in dataclasses.asdict(cls()).items():
            if key == "extra" or (key in merged and section != "approvals"):
                continue
            expected = list(value) if isinstance(value, tuple) else value
            assert props[key].get("default") == expected, f"{section}.{key}"


def test_default_path_is_latch_yaml_in_cwd(tmp_path: Path) -> None:
    """With no path, ./latch.yaml is read when it exists."""
    write(tmp_path, "topics:\n  partitions: 3\n")
    config = load_config(env={})
    assert config.topics.partitions == 3
    assert config.source == Path("latch.yaml")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "kafka:\n"])
def test_empty_file_or_section_gives_defaults(tmp_path: Path, text: str) -> None:
    """An empty file, or a section with nothing under it, means the defaults."""
    config = load_config(write(tmp_path, text), env={})
    assert dataclasses.replace(config, source=None) == Config()


# -- the file -----------------------------------------------------------------------------


def test_yaml_overrides(tmp_path: Path) -> None:
    """Keys in the file replace the defaults, converted to the dataclass field types."""
    path = write(
        tmp_path,
        """
agent_stream_assemble:
  max_tool_calls_per_run: 4
  assemble_idle_timeout_s: 2
  allow_pipelined_execute: [read_file, search]
  execute_before_stream_end: true
kafka:
  bootstrap_servers: broker:9093
  security_protocol: SASL_SSL
  enable_idempotence: true
  linger_ms: 5
topics:
  events: in.events
worker:
  log_level: debug
""",
    )
    config = load_config(path, env={})
    assert config.assemble.max_tool_calls_per_run == 4
    assert config.assemble.assemble_idle_timeout_s == 2.0
    assert isinstance(config.assemble.assemble_idle_timeout_s, float)
    assert config.assemble.allow_pipelined_execute == ("read_file", "search")
    assert config.assemble.execute_before_stream_end is True
    assert config.kafka.bootstrap_servers == "broker:9093"
    assert config.kafka.extra == {"enable_idempotence": "true", "linger_ms": "5"}
    assert config.topics.events == "in.events"
    assert config.topics.control == "llm.stream.control"
    assert config.worker.log_level == "debug"
    assert config.source == path


def test_confluent_config() -> None:
    """confluent_config() gives librdkafka names for the set keys plus the pass-throughs."""
    kafka = KafkaSettings(
        bootstrap_servers="b:9092",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="p",
        ssl_cafile="ca",
        ssl_certfile="cert",
        ssl_keyfile="key",
        client_id="c",
        extra={"enable_idempotence": "true"},
    )
    assert kafka.confluent_config() == {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": "ca",
        "ssl.certificate.location": "cert",
        "ssl.key.location": "key",
        "client.id": "c",
        "enable.idempotence": "true",
    }
    assert KafkaSettings().confluent_config() == {"bootstrap.servers": "127.0.0.1:9092"}


# -- environment overrides ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "section", "key", "expected"),
    [
        ("LATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_CALLS_PER_RUN", "4", "assemble",
         "max_tool_calls_per_run", 4),
        ("LATCH_AGENT_STREAM_ASSEMBLE__ASSEMBLE_IDLE_TIMEOUT_S", "2.5", "assemble",
         "assemble_idle_timeout_s", 2.5),
        ("LATCH_AGENT_STREAM_ASSEMBLE__EMIT_PROGRESS", "true", "assemble", "emit_progress", True),
        ("LATCH_AGENT_STREAM_ASSEMBLE__ARGUMENTS_MUST_BE_OBJECT", "false", "assemble",
         "arguments_must_be_object", False),
        ("LATCH_AGENT_STREAM_ASSEMBLE__ALLOW_PIPELINED_EXECUTE", "read_file, search", "assemble",
         "allow_pipelined_execute", ("read_file", "search")),
        ("LATCH_AGENT_STREAM_ASSEMBLE__ALLOW_PIPELINED_EXECUTE", "read_file", "assemble",
         "allow_pipelined_execute", ("read_file",)),
        ("LATCH_AGENT_STREAM_ASSEMBLE__ALLOW_PIPELINED_EXECUTE", "", "assemble",
         "allow_pipelined_execute", ()),
        ("LATCH_AGENT_STREAM_ASSEMBLE__ALLOW_PIPELINED_EXECUTE", "[a, b]", "assemble",
         "allow_pipelined_execute", ("a", "b")),
        ("LATCH_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092", "kafka", "bootstrap_servers",
         "k1:9092,k2:9092"),
        ("LATCH_KAFKA__SASL_PASSWORD", "123456", "kafka", "sasl_password", "123456"),
        ("LATCH_TOPICS__EVENTS", "2024", "topics", "events", "2024"),
        ("LATCH_TOPICS__PARTITIONS", "3", "topics", "partitions", 3),
        ("LATCH_WORKER__TICK_INTERVAL_S", "1", "worker", "tick_interval_s", 1.0),
        ("LATCH_WORKER__OTEL_EXPORTER", "console", "worker", "otel_exporter", "console"),
    ],
)  # fmt: skip
def test_env_override(name: str, value: str, section: str, key: str, expected: object) -> None:
    """LATCH_<SECTION>__<KEY> sets one key: numbers and booleans parsed, list keys split on
    commas (or given as a YAML list), string keys taken as is even when they look numeric."""
    config = load_config(env={name: value})
    got = getattr(getattr(config, section), key)
    assert got == expected
    assert type(got) is type(expected)


def test_env_overrides_the_file(tmp_path: Path) -> None:
    """An environment variable wins over the same key in the file."""
    path = write(tmp_path, "agent_stream_assemble:\n  max_tool_calls_per_run: 8\n")
    env = {"LATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_CALLS_PER_RUN": "2"}
    assert load_config(path, env=env).assemble.max_tool_calls_per_run == 2


def test_env_kafka_pass_through() -> None:
    """An unnamed kafka key from the environment is a librdkafka pass-through setting."""
    config = load_config(env={"LATCH_KAFKA__ENABLE_IDEMPOTENCE": "true"})
    assert config.kafka.confluent_config()["enable.idempotence"] == "true"


def test_latch_variables_without_double_underscore_are_ignored() -> None:
    """LATCH_KAFKA_HOME and the like belong to other tools; they change nothing."""
    env = {"LATCH_KAFKA_HOME": "/opt/kafka", "LATCH_CONFIG": "x.yaml", "PATH": "/bin"}
    assert load_config(env=env) == Config()


# -- errors -------------------------------------------------------------------------------


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    """A misspelled key in the file is reported by its dotted path, with the file name."""
    path = write(tmp_path, "agent_stream_assemble:\n  max_tool_call: 3\n")
    message = config_error(path)
    assert str(path) in message
    assert "unknown key agent_stream_assemble.max_tool_call" in message


def test_unknown_section_in_file_is_named(tmp_path: Path) -> None:
    """A section that does not exist is reported by name."""
    message = config_error(write(tmp_path, "kafak:\n  bootstrap_servers: x\n"))
    assert "unknown section kafak" in message


def test_unknown_key_in_env_is_named() -> None:
    """A misspelled LATCH_ variable is reported with its key path and its variable name."""
    message = config_error(env={"LATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_CALL": "3"})
    assert (
        "unknown key agent_stream_assemble.max_tool_call "
        "(from LATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_CALL)" in message
    )


def test_unknown_section_in_env_is_named() -> None:
    """LATCH_<X>__<KEY> with an unknown section is an error, not silently ignored."""
    assert "unknown section kafak (from LATCH_KAFAK__X)" in config_error(
        env={"LATCH_KAFAK__X": "1"}
    )


def test_bad_value_in_file_is_named(tmp_path: Path) -> None:
    """A value out of bounds is reported by dotted path and file, with the schema's reason."""
    path = write(tmp_path, "agent_stream_assemble:\n  max_tool_calls_per_run: -1\n")
    message = config_error(path)
    assert str(path) in message
    assert (
        "agent_stream_assemble.max_tool_calls_per_run: -1 is less than the minimum of 0" in message
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("worker:\n  web_port: http\n", "worker.web_port: 'http' is not of type 'integer'"),
        ("worker:\n  log_level: loud\n", "worker.log_level: 'loud' is not one of"),
        ("agent_stream_assemble:\n  emit_progress: 1\n",
         "agent_stream_assemble.emit_progress: 1 is not of type 'boolean'"),
        ("agent_stream_assemble:\n  allow_pipelined_execute: read_file\n",
         "agent_stream_assemble.allow_pipelined_execute: 'read_file' is not of type 'array'"),
        ("agent_stream_assemble:\n  assemble_idle_timeout_s: 0\n",
         "agent_stream_assemble.assemble_idle_timeout_s: 0 is less than or equal to the minimum"),
        ("topics:\n  partitions: 0\n", "topics.partitions: 0 is less than the minimum of 1"),
    ],
)  # fmt: skip
def test_bad_type_is_named(tmp_path: Path, text: str, expected: str) -> None:
    """A value of the wrong type or outside its enum is reported by its dotted path."""
    assert expected in config_error(write(tmp_path, text))


def test_bad_value_from_env_names_the_variable() -> None:
    """A value from the environment that fails validation names the variable too."""
    message = config_error(env={"LATCH_WORKER__WEB_PORT": "http"})
    assert (
        "worker.web_port: 'http' is not of type 'integer' (from LATCH_WORKER__WEB_PORT)" in message
    )


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    """Several problems are listed together, so one run fixes them all."""
    path = write(tmp_path, "topics:\n  partitions: 0\nworker:\n  web_port: -1\n")
    message = config_error(path)
    assert "2 problems" in message
    assert "topics.partitions" in message and "worker.web_port" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", "the top level must be a mapping of sections, not a list"),
        ("just a string\n", "the top level must be a mapping of sections, not a string"),
        ("kafka: 127.0.0.1:9092\n", "kafka: must be a mapping, not a string"),
        ("topics: [a]\n", "topics: must be a mapping, not a list"),
        ("worker:\n  log_level: [\n", "invalid YAML"),
    ],
)
def test_not_a_mapping_or_not_yaml(tmp_path: Path, text: str, expected: str) -> None:
    """A file that is not YAML, not a mapping, or has a section that is not a mapping, is a
    ConfigError (not a crash) that names the file."""
    path = write(tmp_path, text)
    message = config_error(path)
    assert message.startswith(str(path))
    assert expected in message


def test_missing_explicit_file(tmp_path: Path) -> None:
    """An explicit path that does not exist is an error naming it, never silent defaults."""
    missing = tmp_path / "nope.yaml"
    message = config_error(missing)
    assert str(missing) in message and "no such file" in message


def test_kafka_pass_through_cannot_shadow_a_named_key() -> None:
    """ssl_ca_location would become ssl.ca.location, which ssl_cafile owns: it is refused."""
    message = config_error(env={"LATCH_KAFKA__SSL_CA_LOCATION": "/ca.pem"})
    assert "use kafka.ssl_cafile instead of kafka.ssl_ca_location" in message


def test_config_error_is_a_value_error() -> None:
    """Callers that catch ValueError also catch configuration errors."""
    assert issubclass(ConfigError, ValueError)


# -- secrets ------------------------------------------------------------------------------


def test_repr_hides_the_password(tmp_path: Path) -> None:
    """Neither repr(Config) nor repr(KafkaSettings) prints sasl_password, nor a secret-looking
    pass-through setting; other values do print."""
    path = write(tmp_path, "kafka:\n  sasl_username: alice\n  sasl_password: hunter2\n")
    env = {"LATCH_KAFKA__SSL_KEY_PASSWORD": "swordfish"}
    config = load_config(path, env=env)
    assert config.kafka.sasl_password == "hunter2"
    for text in (repr(config), repr(config.kafka), str(config)):
        assert "hunter2" not in text and "swordfish" not in text
        assert "alice" in text and "sasl_password='***'" in text


def test_error_messages_hide_the_password(tmp_path: Path) -> None:
    """A password of the wrong type is reported without its value."""
    message = config_error(write(tmp_path, "kafka:\n  sasl_password: 98765\n"))
    assert "kafka.sasl_password" in message and "98765" not in message


def test_config_is_frozen_and_hashable() -> None:
    """The configuration is an immutable value."""
    config = load_config(env={"LATCH_KAFKA__LINGER_MS": "5"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.topics = TopicNames()  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.kafka.extra["linger_ms"] = "6"  # type: ignore[index]
    assert hash(config) == hash(load_config(env={"LATCH_KAFKA__LINGER_MS": "5"}))


def test_config_copies_and_pickles() -> None:
    """A Config survives deepcopy, pickle and dataclasses.asdict (to show or ship it)."""
    config = load_config(env={"LATCH_KAFKA__LINGER_MS": "5"})
    assert copy.deepcopy(config) == config
    assert pickle.loads(pickle.dumps(config)) == config
    assert dataclasses.asdict(config)["kafka"]["extra"] == {"linger_ms": "5"}


# -- limits that would let a record outgrow the output topics' record size -------------------


def test_limits_that_let_a_record_outgrow_the_output_size_are_refused() -> None:
    """Issue 23: the schema accepts ``max_tool_argument_bytes: 100 MiB``,
    ``max_buffered_bytes: 256 MiB`` and ``max_run_text_bytes: 100 MiB``, which let one 70 MB
    argument become a 67 MiB committed call and final message, records the output topics
    (64 MiB) refuse for good. The configuration refuses them: one problem per record kind,
    each naming the keys that bound it, their values and the bound."""
    mib = 1024 * 1024
    message = config_error(env={
        "LATCH_AGENT_STREAM_ASSEMBLE__MAX_TOOL_ARGUMENT_BYTES": str(100 * mib),
        "LATCH_AGENT_STREAM_ASSEMBLE__MAX_BUFFERED_BYTES": str(256 * mib),
        "LATCH_AGENT_STREAM_ASSEMBLE__MAX_RUN_TEXT_BYTES": str(100 * mib)})
    assert "2 problems" in message
    assert (f"a committed call may take {100 * mib + 64 * 1024} bytes under "
            f"max_tool_argument_bytes ({100 * mib}), more than the {63 * mib} bytes") in message
    assert ("a final message may take" in message and f"max_run_text_bytes ({100 * mib})"
            in message and "max_choices_per_run (128)" in message and "lower one of them"
            in message)


@pytest.mark.parametrize(("key", "value"), [
    ("max_tool_calls_in_flight_assemble", 64),  # 257 calls x 256 KiB > 64 MiB of arguments
    ("max_run_text_bytes", 48 * 1024 * 1024),
    ("max_choices_per_run", 200_000),
])
def test_one_limit_raised_too_far_is_refused(tmp_path: Path, key: str, value: int) -> None:
    """Each limit that bounds the final message is refused, raised alone too far from the
    defaults, with its name in the error; the defaults themselves are accepted."""
    path = write(tmp_path, f"agent_stream_assemble:\n  {key}: {value}\n")
    message = config_error(path)
    assert "a final message may take" in message and f"{key} ({value})" in message
    assert str(tmp_path / "latch.yaml") in message


def test_limits_within_the_output_size_are_accepted(tmp_path: Path) -> None:
    """Raised limits whose largest records still fit are accepted: 10 MiB arguments with a
    run's arguments bounded by 40 MiB and its text by 8 MiB."""
    path = write(tmp_path, "agent_stream_assemble:\n  max_tool_argument_bytes: 10485760\n"
                           "  max_buffered_bytes: 41943040\n  max_run_text_bytes: 8388608\n")
    assert load_config(path, env={}).assemble.max_tool_argument_bytes == 10 * 1024 * 1024


SECRET = "hunter2-swordfish"


def _config_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "latch.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    return str(caught.value)


# -- latch.yaml ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (f'kafka:\n  sasl_password: "{SECRET}\n', "line 3, column 1"),
        (f"kafka:\n  sasl_password: !{SECRET} x\n", "line 2, column 18"),
        (f"kafka:\n  sasl_password: {SECRET}: x\n", "line 2, column "),
        (f"kafka:\n\tsasl_password: {SECRET}\n", "line 2, column 1"),
        (f"kafka: {{sasl_password: {SECRET}\n", "line 2, column 1"),
    ],
)
def test_broken_yaml_names_the_place_never_the_text(tmp_path: Path, text: str,
                                                    where: str) -> None:
    """A YAML error names the file, the line and column and the problem; the offending line
    (which holds a password here) is never quoted, nor a tag or anchor taken from it."""
    message = _config_error(tmp_path, text)
    assert "latch.yaml" in message and where in message and "invalid YAML" in message
    assert SECRET not in message and "sasl_password" not in message


@pytest.mark.parametrize(
    "text",
    [
        f"kafka:\n  sasl_password: [{SECRET}]\n",
        f"kafka:\n  ssl_key_pem: [{SECRET}]\n",
        f"kafka:\n  ssl_key_password: [{SECRET}]\n",
        f"kafka:\n  sasl_oauthbearer_config: [{SECRET}]\n",
        f"kafka:\n  ssl_keystore_password: {{a: {SECRET}}}\n",
    ],
)
def test_a_secret_of_the_wrong_type_is_named_not_shown(tmp_path: Path, text: str) -> None:
    """A secret-like key with an invalid value is reported by its dotted name and the rule it
    fails, never with its value."""
    message = _config_error(tmp_path, text)
    assert "kafka." in message and "invalid value" in message
    assert SECRET not in message


def test_protocol_repair_and_echo_tenants_load(tmp_path: Path) -> None:
    """``on_invalid_json: drop_with_protocol_repair`` (refused before issue 26 item 3) and
    ``echo_invalid_input_tenants`` load from the file and from LATCH_ variables; the echo is
    off (no tenant) and ``error_result`` the policy by default; another policy is refused."""
    defaults = load_config(env={}).assemble
    assert defaults.on_invalid_json == "error_result"
    assert defaults.echo_invalid_input_tenants == ()
    text = ("agent_stream_assemble:\n  on_invalid_json: drop_with_protocol_repair\n"
            "  echo_invalid_input_tenants: [acme, beta]\n")
    settings = load_config(write(tmp_path, text), env={}).assemble
    assert settings.on_invalid_json == "drop_with_protocol_repair"
    assert settings.echo_invalid_input_tenants == ("acme", "beta")
    env = {"LATCH_AGENT_STREAM_ASSEMBLE__ECHO_INVALID_INPUT_TENANTS": "acme",
           "LATCH_AGENT_STREAM_ASSEMBLE__ON_INVALID_JSON": "drop_with_protocol_repair"}
    settings = load_config(env=env).assemble
    assert settings.echo_invalid_input_tenants == ("acme",)
    assert settings.on_invalid_json == "drop_with_protocol_repair"
    assert "agent_stream_assemble.on_invalid_json: 'repair' is not one of" in config_error(
        write(tmp_path, "agent_stream_assemble:\n  on_invalid_json: repair\n"))
    assert "echo_invalid_input_tenants" in config_error(
        write(tmp_path, "agent_stream_assemble:\n  echo_invalid_input_tenants: acme\n"))


def test_the_runner_section_names_the_mcp_server(tmp_path: Path) -> None:
    """``runner:`` (latch runner --mcp): absent, no server and the documented bounds; a file's
    URL, and ``LATCH_RUNNER__MCP`` over it; a URL that is not http(s), or a timeout of 0, is
    refused naming the key."""
    defaults = load_config(env={}).runner
    assert (defaults.mcp, defaults.mcp_timeout_s, defaults.tool_timeout_s, defaults.group_id,
            defaults.transactional_id) == (None, 30.0, 120.0, "latch-runner", None)
    path = tmp_path / "latch.yaml"
    path.write_text("runner:\n  mcp: http://127.0.0.1:8000/mcp\n  tool_timeout_s: 5\n")
    loaded = load_config(path, env={})
    assert (loaded.runner.mcp, loaded.runner.tool_timeout_s) == ("http://127.0.0.1:8000/mcp", 5.0)
    over = load_config(path, env={"LATCH_RUNNER__MCP": "https://mcp.internal/mcp"})
    assert over.runner.mcp == "https://mcp.internal/mcp"
    with pytest.raises(ConfigError, match=r"runner\.mcp"):
        load_config(path, env={"LATCH_RUNNER__MCP": "ftp://x"})
    with pytest.raises(ConfigError, match=r"runner\.mcp_timeout_s"):
        load_config(path, env={"LATCH_RUNNER__MCP_TIMEOUT_S": "0"})
