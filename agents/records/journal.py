"""What each store journal record means to the catalog, and the calls that say it.

One function per record kind; each is idempotent, and so is any run of them in
journal order, which is what makes a batch shipped twice (a crash between the
catalog's commit and `journal_shipped`) harmless:

* `version` (a version stored here, written or applied): register the version
  (its HLC names it; idempotent on dataset, key, version; the dataset and object
  are registered on the way if new, and placed by the applied policy through the
  catalog's placer) and record this region's replica `completed` with its digest.
* `removed`: a base pruned past `keep_versions` → this region's replica is
  forgotten. A tombstone expired after its retention → nothing: the catalog keeps
  the delete and the fact that this region applied it (forgetting the replica
  would make the region look behind on a deleted object for ever).
* `missing` (startup repair found the bytes gone or damaged) → the replica is
  `failed` with the reason, so `replication status --state failed` shows it and a
  resync re-drives it; `restored` → `completed` again.
* `set`: the catalog has no table of version sets (members carry their set id):
  nothing to record.
* `transfer` (see transfer.py) → one `transfers` row, keyed by the transfer's id.

Replica states are written with `Catalog.record_holding`: the holder is the
authority on its own copy, so the last record in journal order decides, whatever
the replicator's state machine says.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from agents.records.transfer import read_transfer
from agents.store.model import JournalEntry, JsonValue
from controlplane.catalog.api import Catalog
from controlplane.catalog.records import TransferRecord
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.errors import InvalidInputError

# The version this store still holds of an object at an HLC, or None (pruned since).
Lookup = Callable[[str, str, str], Version | None]


def ship_entry(catalog: Catalog, region: str, entry: JournalEntry, lookup: Lookup) -> str:
    """Record one journal entry in the catalog; return a word for the logs. Raises the
    catalog's errors (`retriable` or not), or InvalidInputError for a malformed record."""
    ship = _KINDS.get(entry.kind)
    if ship is None:
        raise InvalidInputError(f"journal record {entry.seq}: kind {entry.kind!r} is not known")
    return ship(catalog, region, entry, lookup)


def _version(catalog: Catalog, region: str, entry: JournalEntry, _: Lookup) -> str:
    key, hlc = _object(entry)
    version = _version_of(entry, hlc)
    _register(catalog, entry.dataset, key, version, entry.data.get("set"))
    catalog.record_holding(
        entry.dataset,
        key,
        hlc,
        region,
        state="completed",
        digest=None if version.digest is None else version.digest.text,
        at=_at(entry),
    )
    return "stored"


def _removed(catalog: Catalog, region: str, entry: JournalEntry, _: Lookup) -> str:
    key, hlc = _object(entry)
    if _version_of(entry, hlc).is_tombstone:
        return "tombstone expired (kept in the catalog)"
    catalog.remove_replica(entry.dataset, key, hlc, region)
    return "removed"


def _missing(catalog: Catalog, region: str, entry: JournalEntry, _: Lookup) -> str:
    key, hlc = _object(entry)
    version = _version_of(entry, hlc)
    _register(catalog, entry.dataset, key, version, None)
    reason = entry.data.get("reason")
    catalog.record_holding(
        entry.dataset,
        key,
        hlc,
        region,
        state="failed",
        error=f"bytes lost in {region}: {reason or 'missing'}",
        at=_at(entry),
    )
    return "missing"


def _restored(catalog: Catalog, region: str, entry: JournalEntry, lookup: Lookup) -> str:
    key, hlc = _object(entry)
    version = lookup(entry.dataset, key, hlc)
    if version is None:
        return "restored, then pruned (its removal follows)"
    _register(catalog, entry.dataset, key, version, None)
    catalog.record_holding(
        entry.dataset,
        key,
        hlc,
        region,
        state="completed",
        digest=None if version.digest is None else version.digest.text,
        at=_at(entry),
    )
    return "restored"


def _set(catalog: Catalog, region: str, entry: JournalEntry, _: Lookup) -> str:
    return "set (not recorded)"


def _transfer(catalog: Catalog, region: str, entry: JournalEntry, _: Lookup) -> str:
    if entry.key is None:
        raise InvalidInputError(f"journal record {entry.seq} (transfer) names no object")
    facts = read_transfer(entry.data)
    catalog.record_transfer(
        TransferRecord(
            id=facts.id,
            dataset=entry.dataset,
            object=entry.key,
            version=facts.version or entry.hlc,
            from_region=facts.from_region,
            to_region=facts.to_region,
            logical_bytes=facts.logical_bytes,
            wire_bytes=facts.wire_bytes,
            outcome=facts.outcome,
            at=_at(entry),
            policy_revision=facts.policy_revision,
        )
    )
    return f"transfer {facts.outcome}"


_KINDS: dict[str, Callable[[Catalog, str, JournalEntry, Lookup], str]] = {
    "version": _version,
    "removed": _removed,
    "missing": _missing,
    "restored": _restored,
    "set": _set,
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


def _register(
    catalog: Catalog, dataset: str, key: str, version: Version, set_id: JsonValue
) -> None:
    hlc = version.hlc
    catalog.register_version(
        dataset,
        key,
        hlc.text,
        "" if version.digest is None else version.digest.text,
        size=version.size,
        origin_region=hlc.region,
        created_at=_wall(hlc),
        hlc=hlc.text,
        op=version.op,
        set_id=set_id if isinstance(set_id, str) else None,
    )


def _wall(hlc: HLC) -> datetime:
    return datetime.fromtimestamp(hlc.wall_ms / 1000, UTC)


def _at(entry: JournalEntry) -> datetime:
    return datetime.fromtimestamp(entry.at_ms / 1000, UTC)
