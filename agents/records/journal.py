"""What each store journal record means to the catalog: the facts it ships.

`plan` turns one record into facts for `Catalog.record_holdings` (versions to
register, this region's holdings, transfers); the recorder ships a batch's facts
in one transaction. Each fact is idempotent, and so is any run of them in journal
order, which is what makes a batch shipped twice (a crash between the catalog's
commit and `journal_shipped`) harmless:

* `version` (a version stored here, written or applied): register the version
  (its HLC names it; the dataset and object are registered on the way if new, and
  placed by the applied policy through the catalog's placer) and hold it
  `completed` here with its digest.
* `removed`: a base pruned past `keep_versions` → this region no longer holds it.
  A tombstone expired after its retention → nothing: the catalog keeps the delete
  and the fact that this region applied it (forgetting it would make the region
  look behind on a deleted object for ever). An evicted one (reason `evicted`:
  `meridian dataset evict`, the region no longer placed) goes like any version:
  the region holds no copy of the dataset any more, and nothing expects one there.
* `missing` (startup repair found the bytes gone or damaged) → held `failed`, with
  the reason, so `replication status --state failed` shows it and a resync
  re-drives it; `restored` → `completed` again.
* `set`: the catalog has no table of version sets (members carry their set id):
  nothing to record.
* `transfer` (see transfer.py) → one `transfers` row, keyed by the transfer's id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agents.records.transfer import read_transfer
from agents.store.model import EVICTED, JournalEntry
from controlplane.catalog.records import HeldVersion, Holding, HoldingState, TransferRecord
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.errors import InvalidInputError

# The version this store still holds of an object at an HLC, or None (pruned since).
Lookup = Callable[[str, str, str], Version | None]


@dataclass
class Plan:
    """The catalog facts of some journal records, in journal order."""

    versions: list[HeldVersion] = field(default_factory=list)
    holdings: list[Holding] = field(default_factory=list)
    transfers: list[TransferRecord] = field(default_factory=list)

    def extend(self, other: Plan) -> None:
        self.versions += other.versions
        self.holdings += other.holdings
        self.transfers += other.transfers


def plan(region: str, entry: JournalEntry, lookup: Lookup) -> Plan:
    """The facts of one journal record; InvalidInputError for a malformed one."""
    build = _KINDS.get(entry.kind)
    if build is None:
        raise InvalidInputError(f"journal record {entry.seq}: kind {entry.kind!r} is not known")
    return build(region, entry, lookup)


def _version(region: str, entry: JournalEntry, _: Lookup) -> Plan:
    # The commonest record (one per version stored, so per object a replicator applies):
    # its fields are checked here as far as the catalog does not check them again
    # (`holdings.check_version` parses the HLC and the digest), and its texts are used
    # as they are for both facts.
    key, text = _object(entry)
    data = entry.data
    op, size, digest = data.get("op"), data.get("size"), data.get("digest")
    if (
        op not in ("put", "delete")
        or type(size) is not int
        or size < 0
        or not (digest is None or isinstance(digest, str))
        or (op == "delete" and (size != 0 or digest is not None))
    ):
        _version_of(entry, text)  # says what is wrong
        raise InvalidInputError(f"journal record {entry.seq} ({entry.kind}) is malformed")
    try:
        hlc = HLC.parse(text)
    except InvalidInputError as exc:
        raise InvalidInputError(f"journal record {entry.seq} ({entry.kind}): {exc}") from exc
    set_id = data.get("set")
    return Plan(
        versions=[
            HeldVersion(
                dataset=entry.dataset,
                key=key,
                version=text,
                op="put" if op == "put" else "delete",  # (typed as the literal checked)
                size=size,
                digest="" if digest is None else digest,
                origin_region=hlc.region,
                created_at=utc_ms(hlc.wall_ms),
                set_id=set_id if isinstance(set_id, str) else None,
            )
        ],
        holdings=[
            Holding(
                dataset=entry.dataset,
                key=key,
                version=text,
                region=region,
                state="completed",
                at=_at(entry),
                digest=digest,
            )
        ],
    )


def _removed(region: str, entry: JournalEntry, _: Lookup) -> Plan:
    key, hlc = _object(entry)
    version = _version_of(entry, hlc)
    if version.is_tombstone and entry.data.get("reason") != EVICTED:
        return Plan()  # an expired tombstone: the catalog keeps the delete
    return Plan(holdings=[_holding(region, entry, key, version, "removed")])


def _missing(region: str, entry: JournalEntry, _: Lookup) -> Plan:
    key, hlc = _object(entry)
    version = _version_of(entry, hlc)
    reason = entry.data.get("reason") or "missing"
    return Plan(
        versions=[_held(entry.dataset, key, version, None)],
        holdings=[
            _holding(
                region, entry, key, version, "failed", error=f"bytes lost in {region}: {reason}"
            )
        ],
    )


def _restored(region: str, entry: JournalEntry, lookup: Lookup) -> Plan:
    key, hlc = _object(entry)
    version = lookup(entry.dataset, key, hlc)
    if version is None:
        return Plan()  # restored, then pruned: its removal follows in the journal
    return Plan(
        versions=[_held(entry.dataset, key, version, None)],
        holdings=[_holding(region, entry, key, version, "completed")],
    )


def _set(region: str, entry: JournalEntry, _: Lookup) -> Plan:
    return Plan()


def _transfer(region: str, entry: JournalEntry, _: Lookup) -> Plan:
    facts = read_transfer(entry.data)
    key = entry.key or facts.object
    if key is None:
        raise InvalidInputError(f"journal record {entry.seq} (transfer) names no object")
    return Plan(
        transfers=[
            TransferRecord(
                id=facts.id,
                dataset=entry.dataset,
                object=key,
                version=entry.hlc,
                from_region=facts.from_region,
                to_region=facts.to_region,
                logical_bytes=facts.logical_bytes,
                wire_bytes=facts.wire_bytes,
                outcome=facts.outcome,
                at=_at(entry),
                policy_revision=facts.policy_revision,
                from_jurisdiction=facts.from_jurisdiction,
                to_jurisdiction=facts.to_jurisdiction,
                residency=facts.residency,
                residency_revision=facts.residency_revision,
            )
        ]
    )


_KINDS: dict[str, Callable[[str, JournalEntry, Lookup], Plan]] = {
    "version": _version,
    "removed": _removed,
    "missing": _missing,
    "restored": _restored,
    "set": _set,
    "set_removed": _set,
    "transfer": _transfer,
}


def _object(entry: JournalEntry) -> tuple[str, str]:
    if entry.key is None or entry.hlc is None:
        raise InvalidInputError(
            f"journal record {entry.seq} ({entry.kind}) names no object version"
        )
    return entry.key, entry.hlc


def _version_of(entry: JournalEntry, hlc: str) -> Version:
    """The version a record describes (its data holds op, size and digest)."""
    data = entry.data
    digest = data.get("digest")
    try:
        return Version(
            HLC.parse(hlc),
            data.get("op"),  # type: ignore[arg-type]  # checked by Version
            data.get("size"),  # type: ignore[arg-type]
            None if digest is None else Digest.parse(digest),
        )
    except InvalidInputError as exc:
        raise InvalidInputError(f"journal record {entry.seq} ({entry.kind}): {exc}") from exc


def _held(dataset: str, key: str, version: Version, set_id: str | None) -> HeldVersion:
    hlc = version.hlc
    return HeldVersion(
        dataset=dataset,
        key=key,
        version=hlc.text,
        op=version.op,
        size=version.size,
        digest="" if version.digest is None else version.digest.text,
        origin_region=hlc.region,
        created_at=utc_ms(hlc.wall_ms),
        set_id=set_id,
    )


def _holding(
    region: str,
    entry: JournalEntry,
    key: str,
    version: Version,
    state: HoldingState,
    *,
    error: str | None = None,
) -> Holding:
    return Holding(
        dataset=entry.dataset,
        key=key,
        version=version.hlc.text,
        region=region,
        state=state,
        at=_at(entry),
        digest=None if version.digest is None else version.digest.text,
        error=error,
    )


def _at(entry: JournalEntry) -> datetime:
    return utc_ms(entry.at_ms)


@functools.lru_cache(maxsize=4096)
def utc_ms(ms: int) -> datetime:
    """The UTC time of a count of milliseconds. Cached: a bundle's records share their
    `at_ms`, and versions written in one burst their HLC's millisecond."""
    return datetime.fromtimestamp(ms / 1000, UTC)
