"""Change events: one change of one object, as the change log carries it.

`ChangeEvent` is what the origin agent's outbox publishes to Kafka
`meridian.changes` (key `dataset/key`, see `log_key`) and what every region's
applier consumes (spec/dataplane.md): `event_id` (appliers are idempotent on it),
`dataset`, `key`, the `version`, `origin_region`, `epoch` (critical) or 0, the
`policy_revision` the write was admitted under, the optional version `set`, and
where the bytes come from: `inline` content (small objects) or the
`origin_agent` address to fetch them from; a tombstone has neither. `schema` is
the layout's version; `CHANGE_EVENT_SCHEMA` is the one this code writes and reads.

`SetEvent` is the change log's form of a version set committed at the origin
(schema `SET_EVENT_SCHEMA`, 2): the set record (id, HLC, each member's version),
published after its members' own events. It is a separate type, not a ChangeEvent
without a key: everything that reads a ChangeEvent relies on its key and version.
Its Kafka key (`set_log_key`) holds a NUL, which no object name may, so it never
equals an object's `dataset/key`, and one set id's events stay in one partition,
in order. `LogEvent` is either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.domain.errors import VersionError
from controlplane.domain.hlc import REGION_PATTERN
from controlplane.domain.names import check_name
from controlplane.domain.version import Version
from controlplane.domain.version_set import VersionSet

CHANGE_EVENT_SCHEMA = 1
SET_EVENT_SCHEMA = 2


_REGION_RE = re.compile(REGION_PATTERN)


# What one change event may take, encoded: Kafka's producer refuses a request over
# 1 MiB (`max_request_size`), its record overhead included.
MAX_EVENT_BYTES = 1024 * 1024 - 16 * 1024


@dataclass(frozen=True, kw_only=True)
class ChangeEvent:
    event_id: str
    dataset: str
    key: str
    version: Version
    origin_region: str
    policy_revision: int
    epoch: int = 0
    set: str | None = None
    inline: bytes | None = None
    origin_agent: str | None = None
    schema: int = CHANGE_EVENT_SCHEMA

    def __post_init__(self) -> None:
        where = f"change event {self.event_id!r}"
        if not isinstance(self.event_id, str) or not self.event_id:
            raise VersionError("change event: event_id is empty")
        check_name("dataset", self.dataset)
        check_name("key", self.key)
        if not isinstance(self.version, Version):
            raise VersionError(f"{where}: version must be a Version")
        if not isinstance(self.origin_region, str) or not _REGION_RE.fullmatch(self.origin_region):
            raise VersionError(
                f"{where}: origin_region {self.origin_region!r} is not a region name"
            )
        if self.origin_region != self.version.hlc.region:
            # The origin stamps the version: a mismatch is a forged or mangled event.
            raise VersionError(
                f"{where}: origin_region {self.origin_region} differs from the region of "
                f"its version's HLC ({self.version.hlc.region})"
            )
        for name, value in (("epoch", self.epoch), ("policy_revision", self.policy_revision)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise VersionError(f"{where}: {name} must be an integer >= 0, got {value!r}")
        if self.policy_revision == 0:
            raise VersionError(f"{where}: policy_revision is 0 (no applied policy admitted it)")
        if self.schema != CHANGE_EVENT_SCHEMA:
            raise VersionError(
                f"{where}: schema {self.schema} is not known (this code knows "
                f"{CHANGE_EVENT_SCHEMA})"
            )
        if self.set is not None and not self.set:
            raise VersionError(f"{where}: set is empty; leave it out instead")
        if self.inline is not None and self.origin_agent is not None:
            raise VersionError(f"{where}: carries both inline bytes and an origin_agent")
        if self.version.is_tombstone:
            if self.inline is not None or self.origin_agent is not None:
                raise VersionError(f"{where}: a delete carries no content source")
        elif self.inline is None and not self.origin_agent:
            raise VersionError(f"{where}: a put needs inline bytes or an origin_agent")
        elif self.inline is not None and len(self.inline) != self.version.size:
            raise VersionError(
                f"{where}: inline holds {len(self.inline)} bytes but the version's size "
                f"is {self.version.size}"
            )

    @property
    def log_key(self) -> str:
        """The Kafka key: one object's changes stay in one partition, in order."""
        return f"{self.dataset}/{self.key}"


def set_log_key(dataset: str, set_id: str) -> str:
    """The Kafka key of a version set's events: its dataset and id, with a NUL between
    (no object name holds one, so it never equals an object's `dataset/key`)."""
    return f"{dataset}\0set/{set_id}"


@dataclass(frozen=True, kw_only=True)
class SetEvent:
    """A version set committed at `origin_region` (stamped: `version_set.hlc` is set)."""

    event_id: str
    version_set: VersionSet
    origin_region: str
    policy_revision: int
    epoch: int = 0
    schema: int = SET_EVENT_SCHEMA

    def __post_init__(self) -> None:
        where = f"set event {self.event_id!r}"
        if not isinstance(self.event_id, str) or not self.event_id:
            raise VersionError("set event: event_id is empty")
        if not isinstance(self.version_set, VersionSet):
            raise VersionError(f"{where}: version_set must be a VersionSet")
        hlc = self.version_set.hlc
        if hlc is None:
            raise VersionError(f"{where}: the set carries no HLC (the origin stamps it)")
        if not isinstance(self.origin_region, str) or not _REGION_RE.fullmatch(self.origin_region):
            raise VersionError(
                f"{where}: origin_region {self.origin_region!r} is not a region name"
            )
        if self.origin_region != hlc.region:
            raise VersionError(
                f"{where}: origin_region {self.origin_region} differs from the region of "
                f"its set's HLC ({hlc.region})"
            )
        for name, value in (("epoch", self.epoch), ("policy_revision", self.policy_revision)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise VersionError(f"{where}: {name} must be an integer >= 0, got {value!r}")
        if self.policy_revision == 0:
            raise VersionError(f"{where}: policy_revision is 0 (no applied policy admitted it)")
        if self.schema != SET_EVENT_SCHEMA:
            raise VersionError(
                f"{where}: schema {self.schema} is not the set form ({SET_EVENT_SCHEMA})"
            )

    @property
    def dataset(self) -> str:
        return self.version_set.dataset

    @property
    def set_id(self) -> str:
        return self.version_set.id

    @property
    def log_key(self) -> str:
        return set_log_key(self.dataset, self.set_id)


LogEvent = ChangeEvent | SetEvent
