"""The values the store returns: stored versions, pages, usage, sets, outbox and journal rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from controlplane.domain.errors import VersionError
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Verdict, Version
from controlplane.domain.version_set import SetMember, VersionSet

State = Literal["present", "missing"]
JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


@dataclass(frozen=True)
class StoredVersion:
    """One version this store holds of an object. `state` is `missing` when startup
    repair found its bytes gone or damaged (the row stays: see repair.py)."""

    dataset: str
    key: str
    version: Version
    state: State
    set_id: str | None
    stored_ms: int


@dataclass(frozen=True)
class Page:
    """One page of a listing; `cursor` is None on the last page, else pass it back."""

    items: list[StoredVersion]
    cursor: str | None


@dataclass(frozen=True)
class Usage:
    """`objects`: objects whose newest version is a put; `versions`: version files kept
    (bases included); `bytes`: their total size; `bytes_free`: space left for them."""

    objects: int
    versions: int
    bytes: int
    bytes_free: int


@dataclass(frozen=True)
class ApplyResult:
    """What `apply` did: the LWW verdict, and the version now newest for the object."""

    verdict: Verdict
    newest: Version
    restored: bool = False  # a SAME version whose missing bytes this call brought back


@dataclass(frozen=True)
class SetRecord:
    """A version set: its id, its HLC, each member's key and version HLC, and whether
    every member is stored (only then is it visible)."""

    dataset: str
    set_id: str
    hlc: HLC
    members: dict[str, HLC]
    complete: bool

    def as_version_set(self) -> VersionSet:
        """The domain's form of this set (what replicates)."""
        members = tuple(SetMember(key, hlc) for key, hlc in sorted(self.members.items()))
        return VersionSet(self.dataset, self.set_id, members, self.hlc)


@dataclass(frozen=True)
class OutboxEvent:
    """A change event waiting to be published to `meridian.changes` (standard class)."""

    seq: int
    event_id: str
    kind: Literal["version", "set"]
    dataset: str
    key: str | None
    version: Version | None
    set_id: str | None
    origin_region: str
    epoch: int
    policy_revision: int | None
    members: dict[str, HLC] = field(default_factory=dict)  # kind "set" only
    set_hlc: HLC | None = None  # kind "set" only

    def change_event(
        self, *, inline: bytes | None = None, origin_agent: str | None = None
    ) -> ChangeEvent:
        """The domain's ChangeEvent of a `version` event, for the drainer to publish; the
        caller adds the content source (inline bytes read from the store, or its own
        address). VersionError for a `set` event or one without a policy revision."""
        if self.kind != "version" or self.key is None or self.version is None:
            raise VersionError(f"outbox event {self.event_id} is a set record, not a change")
        return ChangeEvent(
            event_id=self.event_id,
            dataset=self.dataset,
            key=self.key,
            version=self.version,
            origin_region=self.origin_region,
            policy_revision=self.policy_revision or 0,
            epoch=self.epoch,
            set=self.set_id,
            inline=inline,
            origin_agent=origin_agent,
        )


@dataclass(frozen=True)
class JournalEntry:
    """A record for the catalog, in commit order. `kind` is `version` (stored), `removed`
    (a base pruned or a tombstone expired), `missing` (lost bytes found at startup),
    `restored`, `set` or `transfer`; `data` holds the fields of that kind."""

    seq: int
    kind: str
    dataset: str
    key: str | None
    hlc: str | None
    at_ms: int
    data: dict[str, JsonValue]


# The `reason` of the `removed` journal records of `ObjectStore.evict`.
EVICTED = "evicted"


@dataclass(frozen=True)
class Evicted:
    """What `ObjectStore.evict` forgot: objects, their versions and the bytes of their
    puts; `kept`, (key, why) of the objects it left as they are."""

    objects: int = 0
    versions: int = 0
    bytes: int = 0
    kept: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RepairReport:
    """What startup repair found and did."""

    temporaries_removed: int = 0
    orphans_removed: int = 0
    marked_missing: int = 0
    restored: int = 0


@dataclass(frozen=True, slots=True)
class SmallPut:
    """One small Put (`ObjectStore.stamp_small`): `put_small`'s arguments."""

    dataset: str
    key: str
    data: bytes
    expected_size: int | None = None
    max_size: int | None = None
    expected_digest: Digest | None = None
    end_digest: Digest | None = None
    set_id: str | None = None
    outbox: bool = False
    epoch: int = 0
    policy_revision: int | None = None
