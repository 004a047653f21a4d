"""The catalog port: the typed, synchronous, thread-safe API over the SQL catalog.

Guarantees:
- every call is one short transaction: it commits entirely or changes nothing;
- calls are safe from many threads (one engine, one session per call); the async
  controllers call them through `asyncio.to_thread`;
- writes keyed by a natural key (dataset name; dataset+object key; object+version;
  version+region) or by a caller-chosen id (transfer id, failover id) are
  idempotent: repeating one is a no-op, also when two callers race (the losers'
  inserts are ignored by ON CONFLICT DO NOTHING, never raised);
- replica rows carry the jurisdiction of their region and whether it lies inside the
  dataset's residency, computed when written, so residency audits are index scans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    Engine,
    Exists,
    Insert,
    Subquery,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, object_session, sessionmaker

from controlplane.catalog.engine import check_migrated, make_engine, redacted, sqlite_file
from controlplane.catalog.errors import (
    CatalogInputError,
    CatalogNotMigratedError,
    CatalogUnavailableError,
)
from controlplane.catalog.models import (
    CatalogObject,
    Dataset,
    Failover,
    ObjectVersion,
    PolicyRevision,
    Region,
    Replica,
    Transfer,
)
from controlplane.catalog.records import (
    FAILOVER_KINDS,
    FAILOVER_OUTCOMES,
    REPLICA_STATES,
    FailoverRecord,
    PolicyRevisionRecord,
    RegionRecord,
    TransferRecord,
    VersionRef,
)
from controlplane.domain.placement import DatasetClass, FailoverMode, Placement

PolicyTerms = Mapping[str, Mapping[str, Any]]
_TERMS_KEY = "meridian.policy_terms"


def utcnow() -> datetime:
    return datetime.now(UTC)


def head_policy_terms(s: Session) -> PolicyTerms:
    """The placement terms (rpo, ack, transfer, deletes) of each policy of the last
    applied revision, by policy name; remembered for the rest of the session.

    The `datasets` row holds a placement's regions; these terms are read from the
    revision's document, which every row was compiled from: each apply rewrites
    every row, and a dataset registered later is placed by the head revision."""
    cached = s.info.get(_TERMS_KEY)
    if cached is not None:
        return cast(PolicyTerms, cached)
    head = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
    from controlplane.policy.planner import document_terms  # policy depends on the catalog

    terms = document_terms(head.document) if head is not None else {}
    s.info[_TERMS_KEY] = terms
    return terms


def placement_of(row: Dataset, terms: PolicyTerms | None = None) -> Placement | None:
    """The placement stored in a `datasets` row, or None if no applied policy places it.

    `terms` are the head revision's (`head_policy_terms`); read through the row's own
    session when not given."""
    if row.policy is None or row.home is None or row.dataset_class is None:
        return None
    if terms is None:
        session = object_session(row)
        if session is None:
            raise CatalogInputError(f"dataset {row.name}: its row is detached from a session")
        terms = head_policy_terms(session)
    policy_terms = terms.get(row.policy)
    if policy_terms is None:
        raise CatalogInputError(
            f"dataset {row.name} is placed by policy {row.policy!r}, which the last applied "
            "policy revision does not hold; run `meridian policy apply` again"
        )
    return Placement(
        dataset=row.name,
        policy=row.policy,
        # Checked by Placement itself: a bad stored value is refused, never guessed.
        dataset_class=cast(DatasetClass, row.dataset_class),
        home=row.home,
        replicas=tuple(row.replicas),
        residency=tuple(row.residency),
        failover_mode=cast(FailoverMode, row.failover_mode),
        failover_order=tuple(row.failover_order),
        labels=dict(row.labels),
        **policy_terms,
    )


def failover_of(row: Failover) -> FailoverRecord:
    return FailoverRecord(
        id=row.id,
        dataset=row.dataset,
        from_region=row.from_region,
        to_region=row.to_region,
        epoch=row.epoch,
        kind=row.kind,  # type: ignore[arg-type]  # checked on write
        reason=row.reason,
        actor=row.actor,
        detected_at=row.detected_at,
        started_at=row.started_at,
        completed_at=row.completed_at,
        rpo_versions=row.rpo_versions,
        details=row.details,
        outcome="aborted" if row.outcome == "aborted" else "moved",
    )


# The PostgreSQL advisory lock around residency: `policy apply` holds it exclusively
# while it rewrites residencies and re-judges replicas; a write that judges a copy
# against a residency holds it shared, so neither interleaves with the other.
RESIDENCY_LOCK_KEY = 0x4D455249  # "MERI"


def residency_lock(s: Session, *, exclusive: bool) -> None:
    """Take the residency lock for the rest of the transaction (see RESIDENCY_LOCK_KEY).

    SQLite has one writer at a time: a write statement takes its RESERVED lock
    now, so the reads that follow already run under it (an empty DELETE)."""
    if s.get_bind().dialect.name == "postgresql":
        fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        s.execute(text(f"SELECT {fn}(:k)"), {"k": RESIDENCY_LOCK_KEY})
    else:
        s.execute(delete(Region).where(text("1 = 0")))


class Catalog:
    """The SQL catalog. Build it with `open_catalog(url)`; `close()` releases the pool."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------

    def session(self) -> Session:
        return self._sessions()

    def _insert_ignore(self, model: Any, values: dict[str, Any], keys: Sequence[str]) -> Insert:
        if self.engine.dialect.name == "postgresql":
            return (
                postgresql.insert(model)
                .values(**values)
                .on_conflict_do_nothing(index_elements=list(keys))
            )
        if self.engine.dialect.name == "sqlite":
            return (
                sqlite.insert(model)
                .values(**values)
                .on_conflict_do_nothing(index_elements=list(keys))
            )
        raise CatalogInputError(f"catalog dialect {self.engine.dialect.name} is not supported")

    def _tx(self) -> Session:
        return self._sessions.begin()  # type: ignore[return-value]

    # -- reads ----------------------------------------------------------------

    def list_regions(self) -> list[RegionRecord]:
        with self.session() as s:
            rows = s.scalars(select(Region).order_by(Region.name)).all()
            return [RegionRecord(r.name, r.jurisdiction) for r in rows]

    def list_placements(self) -> list[Placement]:
        """Every dataset that an applied policy places, by name."""
        with self.session() as s:
            rows = s.scalars(
                select(Dataset).where(Dataset.policy.is_not(None)).order_by(Dataset.name)
            ).all()
            terms = head_policy_terms(s)
            return [p for p in (placement_of(r, terms) for r in rows) if p is not None]

    def get_placement(self, dataset: str) -> Placement | None:
        with self.session() as s:
            row = s.get(Dataset, dataset)
            return placement_of(row) if row is not None else None

    def list_failovers(self, since: datetime | None = None) -> list[FailoverRecord]:
        """The failover journal, oldest first (newest last)."""
        query = select(Failover).order_by(Failover.started_at, Failover.id)
        if since is not None:
            query = query.where(Failover.started_at >= since)
        with self.session() as s:
            return [failover_of(r) for r in s.scalars(query).all()]

    def incomplete_versions(self, dataset: str, region: str) -> list[VersionRef]:
        """The LATEST version of each object of `dataset` (the most recently registered
        one) whose replica in `region` is missing or not `completed`, by object key.

        Older versions superseded by a newer one are not listed: a catch-up only needs
        the newest, and an object counts once in RPO exposure."""
        latest = _latest_versions(dataset)
        query = (
            select(CatalogObject.key, ObjectVersion.version, ObjectVersion.digest)
            .join(latest, latest.c.vid == ObjectVersion.id)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(~_completed_in(region))
            .order_by(CatalogObject.key)
        )
        with self.session() as s:
            return [VersionRef(k, v, d) for k, v, d in s.execute(query).all()]

    def oldest_incomplete_at(self, dataset: str, regions: Sequence[str]) -> datetime | None:
        """When the oldest latest version of the dataset's objects was written, among those
        that one of `regions` (other than the version's origin) has not completed; None
        when every region has completed every object's latest version. The replication
        lag of the dataset is the age of this time."""
        oldest: datetime | None = None
        with self.session() as s:
            for region in dict.fromkeys(regions):
                latest = _latest_versions(dataset)
                query = (
                    select(func.min(ObjectVersion.created_at))
                    .join(latest, latest.c.vid == ObjectVersion.id)
                    .where(
                        ~_completed_in(region),
                        or_(
                            ObjectVersion.origin_region.is_(None),
                            ObjectVersion.origin_region != region,
                        ),
                    )
                )
                at = s.scalar(query)
                if at is not None and (oldest is None or at < oldest):
                    oldest = at
        return oldest

    def latest_revision(self) -> PolicyRevisionRecord | None:
        with self.session() as s:
            row = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
            if row is None:
                return None
            return PolicyRevisionRecord(
                row.id, row.digest, row.source, row.applied_by, row.applied_at
            )

    # -- writes ---------------------------------------------------------------

    def register_dataset(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Register a dataset on first write (idempotent; labels of an existing one stay).

        A new dataset is placed at once by the last applied policy, if one selects it."""
        with self._tx() as s:
            self._ensure_dataset(s, name, labels or {})

    def _ensure_dataset(self, s: Session, name: str, labels: dict[str, str]) -> None:
        if s.get(Dataset, name) is not None:
            return
        values: dict[str, Any] = {
            "name": name,
            "labels": labels,
            "declared": False,
            "replicas": [],
            "residency": [],
            "failover_order": [],
            "registered_at": utcnow(),
        }
        placement = self._place_new(s, name, labels)
        if placement is not None:
            values.update(placement_columns(placement))
        s.execute(self._insert_ignore(Dataset, values, ["name"]))

    def _place_new(self, s: Session, name: str, labels: dict[str, str]) -> Placement | None:
        head = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
        if head is None:
            return None
        from controlplane.policy.compiler import PolicySet  # policy depends on catalog records

        return PolicySet.from_document(head.document).placements({name: labels}).get(name)

    def register_object(self, dataset: str, key: str) -> None:
        """Register an object (and its dataset if new); idempotent on (dataset, key)."""
        with self._tx() as s:
            self._ensure_object(s, dataset, key)

    def _ensure_object(self, s: Session, dataset: str, key: str) -> int:
        self._ensure_dataset(s, dataset, {})
        s.execute(
            self._insert_ignore(CatalogObject, {"dataset": dataset, "key": key}, ["dataset", "key"])
        )
        return s.execute(
            select(CatalogObject.id).where(
                CatalogObject.dataset == dataset, CatalogObject.key == key
            )
        ).scalar_one()

    def register_version(
        self,
        dataset: str,
        key: str,
        version: str,
        digest: str,
        *,
        size: int = 0,
        origin_region: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        """Register an object version (and its object and dataset if new); idempotent on
        (dataset, key, version). The same version with another digest is refused."""
        with self._tx() as s:
            self._ensure_version(s, dataset, key, version, digest, size, origin_region, created_at)

    def _ensure_version(
        self,
        s: Session,
        dataset: str,
        key: str,
        version: str,
        digest: str,
        size: int,
        origin_region: str | None,
        created_at: datetime | None,
    ) -> int:
        oid = self._ensure_object(s, dataset, key)
        s.execute(
            self._insert_ignore(
                ObjectVersion,
                {
                    "object_id": oid,
                    "version": version,
                    "digest": digest,
                    "size": size,
                    "origin_region": origin_region,
                    "created_at": created_at or utcnow(),
                },
                ["object_id", "version"],
            )
        )
        row = s.execute(
            select(ObjectVersion.id, ObjectVersion.digest).where(
                ObjectVersion.object_id == oid, ObjectVersion.version == version
            )
        ).one()
        if row.digest != digest:
            raise CatalogInputError(
                f"version {version} of {dataset}/{key} is registered with digest {row.digest}, "
                f"not {digest}"
            )
        return int(row.id)

    def set_replica_state(
        self, dataset: str, key: str, version: str, region: str, state: str
    ) -> None:
        """Create or move the replica of a registered version in `region` to `state`
        (pending, completed or failed). Setting the state it already has is a no-op."""
        if state not in REPLICA_STATES:
            raise CatalogInputError(
                f"replica state {state!r} is not one of {', '.join(REPLICA_STATES)}"
            )
        with self._tx() as s:
            residency_lock(s, exclusive=False)
            vid = _version_id(s, dataset, key, version)
            if vid is None:
                raise CatalogInputError(f"version {version} of {dataset}/{key} is not registered")
            jurisdiction, allowed = self._judge(s, dataset, region)
            now = utcnow()
            s.execute(
                self._insert_ignore(
                    Replica,
                    {
                        "version_id": vid,
                        "region": region,
                        "jurisdiction": jurisdiction,
                        "allowed": allowed,
                        "state": state,
                        "updated_at": now,
                    },
                    ["version_id", "region"],
                )
            )
            s.execute(
                update(Replica)
                .where(Replica.version_id == vid, Replica.region == region, Replica.state != state)
                .values(state=state, updated_at=now)
            )

    def remove_replica(self, dataset: str, key: str, version: str, region: str) -> None:
        """Forget the replica of a version in `region` (its bytes were deleted there)."""
        with self._tx() as s:
            vid = _version_id(s, dataset, key, version)
            if vid is not None:
                s.execute(
                    delete(Replica).where(Replica.version_id == vid, Replica.region == region)
                )

    def _judge(self, s: Session, dataset: str, region: str) -> tuple[str, bool]:
        """(jurisdiction of region, whether the dataset's residency allows it).

        Callers hold the residency lock (see `residency_lock`), taken before their
        first write, so `policy apply` cannot change the residency between this
        judgement and the row that records it."""
        jurisdiction = s.scalar(select(Region.jurisdiction).where(Region.name == region))
        if jurisdiction is None:
            raise CatalogInputError(
                f"region {region!r} is not in the catalog; apply a topology naming it"
            )
        residency = s.scalar(select(Dataset.residency).where(Dataset.name == dataset))
        # A dataset no policy places has no residency constraint yet.
        allowed = not residency or jurisdiction in residency
        return jurisdiction, allowed

    def record_transfer(self, rec: TransferRecord) -> None:
        """Record one cross-region copy; idempotent on `rec.id`. Jurisdictions and
        whether the destination lies inside the residency in force are stored with it."""
        with self._tx() as s:
            # before any write, so that waiting for an apply holds no row lock it needs
            residency_lock(s, exclusive=False)  # (see _judge)
            self._ensure_dataset(s, rec.dataset, {})  # audits find transfers by dataset
            from_j = s.scalar(select(Region.jurisdiction).where(Region.name == rec.from_region))
            to_j, allowed = self._judge(s, rec.dataset, rec.to_region)
            if from_j is None:
                raise CatalogInputError(f"region {rec.from_region!r} is not in the catalog")
            residency = s.scalar(select(Dataset.residency).where(Dataset.name == rec.dataset))
            s.execute(
                self._insert_ignore(
                    Transfer,
                    {
                        "id": rec.id,
                        "dataset": rec.dataset,
                        "object": rec.object,
                        "version": rec.version,
                        "from_region": rec.from_region,
                        "to_region": rec.to_region,
                        "from_jurisdiction": from_j,
                        "to_jurisdiction": to_j,
                        "logical_bytes": rec.logical_bytes,
                        "wire_bytes": rec.wire_bytes,
                        "policy_revision": rec.policy_revision,
                        "outcome": rec.outcome,
                        "cross_border": from_j != to_j,
                        "allowed": allowed,
                        "residency": list(residency or []),
                        "at": rec.at,
                    },
                    ["id"],
                )
            )

    def append_failover(self, rec: FailoverRecord) -> None:
        """Append to the failover journal; idempotent on `rec.id` (a repeat is ignored)."""
        if rec.kind not in FAILOVER_KINDS:
            raise CatalogInputError(
                f"failover kind {rec.kind!r} is not one of {', '.join(FAILOVER_KINDS)}"
            )
        if rec.outcome not in FAILOVER_OUTCOMES:
            raise CatalogInputError(
                f"failover outcome {rec.outcome!r} is not one of {', '.join(FAILOVER_OUTCOMES)}"
            )
        with self._tx() as s:
            s.execute(
                self._insert_ignore(
                    Failover,
                    {
                        "id": rec.id,
                        "dataset": rec.dataset,
                        "from_region": rec.from_region,
                        "to_region": rec.to_region,
                        "epoch": rec.epoch,
                        "kind": rec.kind,
                        "reason": rec.reason,
                        "actor": rec.actor,
                        "detected_at": rec.detected_at,
                        "started_at": rec.started_at,
                        "completed_at": rec.completed_at,
                        "rpo_versions": rec.rpo_versions,
                        "details": rec.details,
                        "outcome": rec.outcome,
                    },
                    ["id"],
                )
            )


def _version_id(s: Session, dataset: str, key: str, version: str) -> int | None:
    return s.scalar(
        select(ObjectVersion.id)
        .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
        .where(
            CatalogObject.dataset == dataset,
            CatalogObject.key == key,
            ObjectVersion.version == version,
        )
    )


def placement_columns(p: Placement) -> dict[str, Any]:
    """The `datasets` columns of a placement; its policy terms stay in the revision's
    document (see `head_policy_terms`)."""
    return {
        "policy": p.policy,
        "dataset_class": p.dataset_class,
        "home": p.home,
        "replicas": list(p.replicas),
        "residency": list(p.residency),
        "failover_mode": p.failover_mode,
        "failover_order": list(p.failover_order),
    }


def open_catalog(url: str) -> Catalog:
    """Open the catalog at `url`; raise one sentence if it is unreachable or not migrated
    (naming `meridian db upgrade`)."""
    missing = sqlite_file(url)
    if missing is not None and not missing.exists():
        # Opening would create an empty file; only `db upgrade` should create a catalog.
        folder = "" if missing.parent.is_dir() else f" (nor does its folder {missing.parent})"
        raise CatalogNotMigratedError(
            f"the catalog file {missing} does not exist{folder}; "
            "run `meridian db upgrade` to create it"
        )
    engine = make_engine(url)
    try:
        check_migrated(engine, url)
    except BaseException:
        engine.dispose()
        raise
    return Catalog(engine, url)


__all__ = [
    "Catalog",
    "CatalogUnavailableError",
    "OperationalError",
    "open_catalog",
    "redacted",
]


def _latest_versions(dataset: str) -> Subquery:
    """The id (as `vid`) of the most recently registered version of each object."""
    return (
        select(func.max(ObjectVersion.id).label("vid"))
        .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
        .where(CatalogObject.dataset == dataset)
        .group_by(ObjectVersion.object_id)
        .subquery()
    )


def _completed_in(region: str) -> Exists:
    """True for an ObjectVersion row whose replica in `region` is completed."""
    return (
        select(Replica.id)
        .where(
            and_(
                Replica.version_id == ObjectVersion.id,
                Replica.region == region,
                Replica.state == "completed",
            )
        )
        .exists()
    )
