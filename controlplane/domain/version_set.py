"""Version sets: several objects made visible together (spec/dataplane.md).

`VersionSet(dataset, id, members, hlc)` names, for each member key, the version
(HLC) it has in the set. A region shows a set only once every member has arrived
and verified; sets are ordered by their own `hlc` like versions (last set wins,
by `controlplane.domain.version.lww`'s rule). `hlc` is None until the agent that
commits the set stamps it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from controlplane.domain.errors import VersionError
from controlplane.domain.hlc import HLC
from controlplane.domain.names import check_name


@dataclass(frozen=True)
class SetMember:
    key: str
    version: HLC

    def __post_init__(self) -> None:
        check_name("key", self.key)
        if not isinstance(self.version, HLC):
            raise VersionError(f"set member {self.key}: version must be an HLC")


@dataclass(frozen=True)
class VersionSet:
    dataset: str
    id: str
    members: tuple[SetMember, ...]
    hlc: HLC | None = None

    def __post_init__(self) -> None:
        check_name("dataset", self.dataset)
        if not isinstance(self.id, str) or not self.id:
            raise VersionError(f"version set of {self.dataset}: its id is empty")
        if not self.members:
            raise VersionError(f"version set {self.id} of {self.dataset} has no members")
        keys = [m.key for m in self.members]
        if len(set(keys)) != len(keys):
            # Counted once each (a set can name tens of thousands of keys: a quadratic
            # count held the event loop for seconds), and a few named, not all.
            twice = sorted(k for k, n in Counter(keys).items() if n > 1)
            named = ", ".join(twice[:10]) + (
                f" and {len(twice) - 10} more" if len(twice) > 10 else ""
            )
            raise VersionError(
                f"version set {self.id} of {self.dataset} names a key twice: {named}"
            )
        if self.hlc is not None and not isinstance(self.hlc, HLC):
            raise VersionError(f"version set {self.id}: hlc must be an HLC or None")

    def member(self, key: str) -> SetMember | None:
        return next((m for m in self.members if m.key == key), None)
