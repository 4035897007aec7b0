"""Which policy is in force: the ``policy:`` section's file, or the registry's versions.

One place for the live worker (:class:`worker.runtime.driver.Driver`), a rebuild and
``latch replay`` to turn "policy set version N is in force here" into the
:class:`~worker.core.policy.Policy` an assembler asks (README, *Policies*; decisions 0013, 0014):

* ``policy.mode: off``: none; markers change nothing.
* ``policy.file`` set: that file decides every call (version None); markers change nothing.
* otherwise (``log_only`` or ``enforce`` without a file) the registry's policy sets decide:
  the version a policy marker in the events log put in force at that position, so that replay
  decides as the live worker did. Where no version is in force yet, or the version's text was
  never read, no policy *permits*: every call is denied in ``enforce`` (recorded as a
  would-deny in ``log_only``) with an error that says which, never committed unchecked
  (fail closed).

Engine-neutral: cedarpy is imported only when a policy is built (:mod:`.policy`).
"""

from __future__ import annotations

from collections.abc import Callable

from worker.core.policy import OFF, Policy, PolicyDecision, PolicyRequest
from worker.runtime.config import Config, assembler_policy

__all__ = ["NoPolicySet", "PolicySource"]


class NoPolicySet:
    """The policy where the registry decides and no usable version is in force: denies."""

    __slots__ = ("_decision", "_mode", "_version")

    def __init__(self, mode: str, version: int | None, why: str) -> None:
        self._mode, self._version = mode, version
        self._decision = PolicyDecision(mode, False, (), (why,), version)

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def version(self) -> int | None:
        return self._version

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        return self._decision


class PolicySource:
    """The policy in force at a position of the events log, for one configuration."""

    def __init__(self, config: Config) -> None:
        self.mode = config.policy.mode
        #: The file's policy (None: mode off, or the registry decides).
        self.file: Policy | None = assembler_policy(config)
        #: Whether policy markers decide (no file, mode not off).
        self.registry = self.mode != OFF and self.file is None
        self._built: dict[int, Policy] = {}

    def initial(self) -> Policy | None:
        """The policy before any marker (a fresh partition, a replay from the beginning)."""
        if self.registry:
            return NoPolicySet(self.mode, None, "no policy set version is in force yet")
        return self.file

    def at(self, version: int, text: Callable[[int], str | None] | None) -> Policy | None:
        """The policy once a marker put ``version`` in force; ``text``: the registry's Cedar
        text of a version (None: no registry)."""
        if not self.registry:
            return self.file
        built = self._built.get(version)
        if built is not None:
            return built
        source = None if text is None else text(version)
        if source is None:
            # (not cached: the reader may read it later; a rebuild then decides with it)
            return NoPolicySet(self.mode, version,
                               f"policy set version {version} was not read from the registry")
        from worker.runtime.governance.policy import CedarPolicy

        try:
            policy: Policy = CedarPolicy(source, self.mode, f"registry policy {version}",
                                         version=version)
        except ValueError as exc:  # (put validates; a hand-written record may not)
            policy = NoPolicySet(self.mode, version,
                                 f"policy set version {version} does not parse: "
                                 f"{type(exc).__name__}")
        self._built[version] = policy
        return policy
