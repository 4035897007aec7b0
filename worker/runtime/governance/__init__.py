"""Governance: what decides whether a call may run, and who may say so.

One room for the rooms that answer "may this run?" and "who said so?":

- :mod:`.policy` -- Cedar policies: the Cedar schema built from the tools, decisions.
- :mod:`.policy_file` -- reading a policy set (ids and annotations from Cedar), and the one
  acceptance rule that ``latch registry put`` and the worker share.
- :mod:`.policy_scope` -- which policies of a set can match a request (scope pruning).
- :mod:`.policy_source` -- which policy set is in force for a partition (config or registry).
- :mod:`.registry` -- toolsets and policy sets by version: the records and their state.
- :mod:`.registry_io` -- the registry topic's reader thread and the ``latch registry`` command.
- :mod:`.signing` -- the keys committed calls are signed with, and their verification.
"""
