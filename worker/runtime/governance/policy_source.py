"""Which policy is in force: the ``policy:`` section's file, or the registry's versions.

One place for the live worker (:class:`worker.runtime.driver.Driver`), a rebuild and
``latch replay`` to turn "policy set version N is in force here" into the
:class:`~worker.core.policy.Policy` an assembler asks (docs/policies.md, *Policies*; decisions 0013,
0014):

* ``policy.mode: off``: none; markers change nothing.
* ``policy.file`` set: that file decides every call (version None); markers change nothing.
* otherwise (``log_only`` or ``enforce`` without a file) the registry's policy sets decide:
  the version a policy marker in the events log put in force at that position, so that replay
  decides as the live worker did. Where no version is in force yet, or the version's text was
  not read (yet), no policy *permits*: every call is denied in ``enforce`` (recorded as a
  would-deny in ``log_only``) with an error that says which, never committed unchecked
  (fail closed); a text read later is taken up at the partition's next tick
  (:meth:`worker.runtime.driver.Driver.markers`).
* A version that cannot be built (a registry record no ``latch registry put`` would have
  written: two policies with one ``@id``, a template, text Cedar cannot parse, more than
  512 KiB; :func:`~.policy.registry_policy`, the rule ``put`` runs too) never goes into force:
  the version in force stays, live, in a rebuild and in replay alike (the marker changes
  nothing, so the policy head never records it). The worker says so once per version: a log
  line (error) with the version and why, ``latch_policy_versions_refused_total``, and
  ``/readyz``'s ``policy.refused`` (:attr:`PolicySource.refused`). It never falls back to
  denying every call because of it.

Who writes the text: an operator through ``latch registry put``, or anyone else who can
write the registry topic; so a version's text is untrusted input here, and every text ends in
a policy or in :attr:`PolicySource.refused`, never an exception (policy_file.py bounds the
work).

Engine-neutral: cedarpy is imported only when a policy is built (:mod:`.policy`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from worker.core.policy import OFF, Policy, PolicyDecision, PolicyRequest
from worker.runtime.config import Config

__all__ = ["NoPolicySet", "PolicySource", "assembler_policy"]

log = logging.getLogger("latch.worker")


def assembler_policy(config: Config) -> Policy | None:
    """The policy the configuration's ``policy.file`` puts in force (``Assembler.policy``),
    None when ``policy.mode`` is off or the registry decides; loaded once per process
    (``governance.policy.policy_for``). Raises :class:`~.policy_file.PolicyFileError` (file,
    line, column) or ValueError for a file that cannot be used: the commands that decide
    calls call it first and stop with the message."""
    if config.policy.mode == OFF:
        return None
    from worker.runtime.governance.policy import policy_for  # (cedarpy: only when policies are on)

    return policy_for(config.policy)


class NoPolicySet:
    """The policy where the registry decides and no usable version is in force: denies."""

    __slots__ = ("_decision", "_mode", "_version", "unread")

    def __init__(self, mode: str, version: int | None, why: str, unread: bool = False) -> None:
        self._mode, self._version = mode, version
        self._decision = PolicyDecision(mode, False, (), (why,), version)
        #: The version's text was not read in time: worth asking again.
        self.unread = unread

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
        #: The registry versions that cannot be built, and why (``/readyz``, the metric).
        self.refused: dict[int, str] = {}

    def initial(self) -> Policy | None:
        """The policy before any marker (a fresh partition, a replay from the beginning)."""
        if self.registry:
            return NoPolicySet(self.mode, None, "no policy set version is in force yet")
        return self.file

    def at(self, version: int, text: Callable[[int], str | None] | None,
           current: Policy | None = None) -> Policy | None:
        """The policy once a marker put ``version`` in force; ``text``: the registry's Cedar
        text of a version (None: no registry); ``current``: the policy in force before the
        marker, which stays when ``version`` cannot be built (then ``version`` is in
        :attr:`refused`; with nothing in force, :meth:`initial`)."""
        if not self.registry:
            return self.file
        built = self._built.get(version)
        if built is not None:
            return built
        if version in self.refused:
            return self.initial() if current is None else current
        source = None if text is None else text(version)
        if source is None:
            # (not cached: the reader may read it later; the driver asks again at each tick)
            return NoPolicySet(self.mode, version,
                               f"policy set version {version} was not read from the registry",
                               unread=True)
        from worker.runtime.governance.policy import registry_policy

        try:
            policy: Policy = registry_policy(source, self.mode, version)
        except ValueError as exc:  # (put refuses it; a record not written by put may not)
            self.refused[version] = str(exc)
            kept = "none" if current is None or current.version is None else \
                f"version {current.version}"
            log.error("policy set version %d cannot be built, so it is not put in force; the "
                      "version in force stays (%s): %s", version, kept, exc)
            return self.initial() if current is None else current
        self._built[version] = policy
        return policy
