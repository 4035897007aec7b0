"""Hostile inputs to the runtime (issue 9): every kind has a defined result, and this file (or
the integration test it names) proves each one. The core's own table is
``tests/core/unit/test_abuse.py``; this is its successor for what the core never sees.

=========================================  ===========================================  ======
Hostile input                              Defined result                               Test
=========================================  ===========================================  ======
tick sent through ``Publisher``            ``ValueError`` naming the reserved type;     here
                                           nothing is sent
``__latch_…`` run id through ``Publisher``  ``ValueError`` naming the reserved prefix;   here
(``run``, ``cancel``, ``send_raw``)        nothing is sent
tick or ``__latch_…`` line in              the line is skipped with its line number and here
``latch publish``                          the reason; exit 1
far-future ``ts`` in a tick (or any        expiry follows the record time only; the     here
envelope)                                  events topic stamps it (``LogAppendTime``)
events topic created with ``CreateTime``   ``latch topics create`` and the worker's     integ.
                                           start refuse it, naming the setting          [1]
output sent, no final follows (DLQ,        confirmed before its input record is acked;  here
early commit, forwarded cancel)            a failed delivery stops the worker unacked
more unconfirmed sends than the bound      awaited at once (count and bytes bounded)    here
partition revoked, compacted, re-assigned  heads of a revoked partition leave the       here
                                           memory store: the changelog alone decides
broken ``latch.yaml`` holding a password   file, line, column and problem; no snippet   here
secret of the wrong type or value          the key and the failed rule; never the value here
no ``web_*`` setting                       faust's web server off                       here
``web_enabled: true``                      bound to 127.0.0.1 unless ``web_host`` says  here
control partition whose first record       read from the log on assignment and at each  integ.
faust never delivers                       tick, without waiting for a later record     [2]
=========================================  ===========================================  ======

[1] ``tests/runtime/integration/test_worker_topics.py``.
[2] ``tests/runtime/integration/test_control_gap.py`` (a ``kill -9`` of the owner of a
control partition while a cancel is in flight; the cancel ends the run's calls ``cancelled``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.runtime.app import app_settings
from worker.runtime.config import ConfigError, load_config

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


# -- faust's web server -------------------------------------------------------------------


def test_web_server_is_off_by_default() -> None:
    """With no ``web_*`` setting, faust's web server (which serves run ids and heads without
    authentication) is not started."""
    settings = app_settings(load_config(None, env={}), {})
    assert settings["web_enabled"] is False


def test_web_server_binds_to_localhost_when_enabled() -> None:
    """``web_enabled: true`` alone binds to 127.0.0.1; ``web_host`` chooses another address."""
    on = load_config(None, env={"LATCH_WORKER__WEB_ENABLED": "true"})
    settings = app_settings(on, {})
    assert settings["web_enabled"] is True and settings["web_bind"] == "127.0.0.1"
    anywhere = load_config(None, env={"LATCH_WORKER__WEB_ENABLED": "true",
                                      "LATCH_WORKER__WEB_HOST": "0.0.0.0"})
    assert app_settings(anywhere, {})["web_bind"] == "0.0.0.0"
