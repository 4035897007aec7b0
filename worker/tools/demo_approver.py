"""``latch demo``'s approver (docs/policies.md, "Approvals";
docs/decisions/0019-approver-identity.md).

A worker never counts an unsigned decision, so the demo, which approves the one call its
policy holds, approves as a known person: the approver ``latch demo`` with a key made for
this demo run. Who holds what:

* the key is random per run (32 random bytes, hex), handed to the demo's worker subprocess
  and to the demo's own Publisher through one variable (:data:`KEY_VAR`, an ``env:``
  reference in ``approvers.keys``); never written to a file, to the demo's own environment
  or to its output, and useless after the run;
* the worker lists it (``approvers.keys``, ``approvers.owners``) beside the approvers the
  configuration already lists; the demo's Publisher signs with it (``approvers.key_id``);
* the shipped ``examples/demo.cedar`` permits ``Latch::Approver::"latch demo"`` to decide;
  a policy of the user's own must permit it too, or the demo's approve goes to the DLQ
  (``approver_not_allowed``) and the held call waits for its ``approval_timeout``.
"""

from __future__ import annotations

import secrets

import orjson

from worker.runtime.config import Config

__all__ = ["APPROVER", "KEY_ID", "KEY_VAR", "approver_env"]

#: Who the demo's approvals name (the decision's ``by``, the Cedar principal's id).
APPROVER = "latch demo"
#: The id of the demo approver's key (``approvers.keys``, ``approvers.key_id``).
KEY_ID = "latch-demo"
#: The variable holding the demo approver's key, in the worker's and the signer's environment.
KEY_VAR = "LATCH_DEMO_APPROVER_KEY"


def approver_env(config: Config) -> dict[str, str]:
    """The variables that make the demo's worker know a new key of :data:`APPROVER` (with the
    approvers ``config`` lists already) and make the demo sign its decisions with it."""
    settings = config.approvers
    keys = {**settings.keys, KEY_ID: f"env:{KEY_VAR}"}
    owners = {**settings.owners, KEY_ID: APPROVER}
    return {"LATCH_APPROVERS__KEYS": orjson.dumps(keys).decode(),
            "LATCH_APPROVERS__OWNERS": orjson.dumps(owners).decode(),
            "LATCH_APPROVERS__KEY_ID": KEY_ID, KEY_VAR: secrets.token_hex(32)}
