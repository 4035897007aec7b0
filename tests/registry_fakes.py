"""A worker's registry reader for the driver's unit tests (``driver.RegistryView``), without a
broker: policy set version ``n``'s Cedar text is ``texts[n]`` (None: not read yet), or, given
no ``texts``, a set that permits everything, for any version; ``latest`` is the newest version
the reader has read (default: the highest of ``texts``)."""

from __future__ import annotations

from typing import Any


def permit_all(version: int) -> str:
    """Version ``version`` of a policy set that permits everything (its one ``@id``: vN)."""
    return f'@id("v{version}")\npermit(principal, action, resource);'


class FakeRegistry:
    """A registry reader that answers at once, as a reader that has read ``texts``."""

    #: Why the reader is not following the registry (None: it is).
    failure: str | None = None

    def __init__(self, texts: dict[int, str | None] | None = None,
                 latest: int | None = None) -> None:
        self.texts, self.latest = texts, latest

    def toolsets(self, name: str, version: int, at_ms: int) -> Any:
        return None

    def policy_text(self, version: int) -> str | None:
        return permit_all(version) if self.texts is None else self.texts.get(version)

    def policy_read(self, version: int) -> str | None:
        return self.policy_text(version)

    def policy_registered(self, version: int, at_ms: int) -> bool | None:
        """True for a version of ``texts``; else unknown (the marker's version goes in force,
        unread until its text is: registry.py ``marker_refusal``)."""
        return True if self.texts is not None and version in self.texts else None

    def latest_policy(self) -> int | None:
        if self.latest is not None or not self.texts:
            return self.latest
        return max(self.texts)
