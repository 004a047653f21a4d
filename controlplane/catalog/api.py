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
  dataset's residency, computed when written, so residency audits are index scans;
- "latest" means highest HLC (dataplane.md), never the last row written; a tombstone
  (`op = "delete"`) is a version like any other;
- replica states move only `pending` → `completed` | `failed` and `failed` →
  `pending`; a `completed` replica names the digest it verified;
- no SQLAlchemy type or error leaves the catalog: every public method is wrapped by
  `translate.translated`, and callers ask `error.retriable`.

Every SQL statement of the project runs here (or in the modules this one calls:
`revisions`, `audit`, `bulk`), so the schema can change behind one door.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

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
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, aliased, sessionmaker

from controlplane.catalog import audit, bulk, revisions
from controlplane.catalog import holdings as holdings_mod
from controlplane.catalog.engine import check_migrated, make_engine, redacted, sqlite_file
from controlplane.catalog.errors import (
    CatalogConflictError,
    CatalogInputError,
    CatalogNotMigratedError,
    CatalogUnavailableError,
)
from controlplane.catalog.hlc_text import check_hlc, is_hlc, stamp_after, wall_time
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
from controlplane.catalog.placements import placement_columns, placement_of
from controlplane.catalog.records import (
    FAILOVER_KINDS,
    FAILOVER_OUTCOMES,
    REPLICA_STATES,
    VERSION_OPS,
    CatalogState,
    CopyRecord,
    FailoverRecord,
    HeldVersion,
    Holding,
    Placement,
    Placer,
    PolicyRevisionRecord,
    RegionRecord,
    ReplicaStatus,
    RevisionOutcome,
    TransferRecord,
    VersionRef,
)
from controlplane.catalog.translate import translate_error, translated


def utcnow() -> datetime:
    return datetime.now(UTC)


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


# Replica state machine (dataplane.md): where each state may go next. A new replica
# row may start in any state (the origin's own copy is completed at once).
NEXT_STATES: dict[str, frozenset[str]] = {
    "pending": frozenset({"completed", "failed"}),
    "failed": frozenset({"pending"}),
    "completed": frozenset(),
}
ERROR_TEXT_MAX = 2000


class Catalog:
    """The SQL catalog. Build it with `open_catalog(url)`; `close()` releases the pool.

    `placer` places a dataset first seen on a write under the head revision's policy
    (see `records.Placer`); a catalog opened without one refuses to register a new
    dataset while a policy is applied, rather than leave it unplaced and unjudged."""

    def __init__(self, engine: Engine, url: str, *, placer: Placer | None = None) -> None:
        self._engine = engine
        self._url = url
        self._placer = placer
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        return self._url

    @property
    def dialect(self) -> str:
        """ "sqlite" or "postgresql"."""
        return str(self._engine.dialect.name)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------

    def _session(self) -> Session:
        return self._sessions()

    def _insert_ignore(self, model: Any, values: dict[str, Any], keys: Sequence[str]) -> Insert:
        if self.dialect == "postgresql":
            return (
                postgresql.insert(model)
                .values(**values)
                .on_conflict_do_nothing(index_elements=list(keys))
            )
        if self.dialect == "sqlite":
            return (
                sqlite.insert(model)
                .values(**values)
                .on_conflict_do_nothing(index_elements=list(keys))
            )
        raise CatalogInputError(f"catalog dialect {self.dialect} is not supported")

    def _tx(self) -> Session:
        return self._sessions.begin()  # type: ignore[return-value]

    # -- reads: topology, placements, journal -----------------------------------

    @translated
    def list_regions(self) -> list[RegionRecord]:
        with self._session() as s:
            rows = s.scalars(select(Region).order_by(Region.name)).all()
            return [RegionRecord(r.name, r.jurisdiction) for r in rows]

    @translated
    def list_placements(self) -> list[Placement]:
        """Every dataset that an applied policy places, by name."""
        with self._session() as s:
            rows = s.scalars(
                select(Dataset).where(Dataset.policy.is_not(None)).order_by(Dataset.name)
            ).all()
            return [p for p in map(placement_of, rows) if p is not None]

    @translated
    def get_placement(self, dataset: str) -> Placement | None:
        with self._session() as s:
            row = s.get(Dataset, dataset)
            return placement_of(row) if row is not None else None

    @translated
    def datasets(self, pattern: str = "*") -> list[tuple[str, Placement | None]]:
        """Every dataset whose name matches the glob `pattern`, with its placement, or
        None when no applied policy places it (registered on first write, or its
        policy was removed)."""
        query = select(Dataset).order_by(Dataset.name)
        if pattern != "*":
            # LIKE narrows the scan; fnmatch decides (LIKE's escapes differ per dialect).
            query = query.where(Dataset.name.like(audit.glob_to_like(pattern), escape="\\"))
        with self._session() as s:
            return [
                (row.name, placement_of(row))
                for row in s.scalars(query).all()
                if fnmatch.fnmatchcase(row.name, pattern)
            ]

    @translated
    def list_failovers(self, since: datetime | None = None) -> list[FailoverRecord]:
        """The failover journal, oldest first (newest last)."""
        query = select(Failover).order_by(Failover.started_at, Failover.id)
        if since is not None:
            query = query.where(Failover.started_at >= since)
        with self._session() as s:
            return [failover_of(r) for r in s.scalars(query).all()]

    @translated
    def missing_failovers(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have no row in the failover journal (primary-key lookups)."""
        wanted = list(dict.fromkeys(ids))
        found: set[str] = set()
        with self._session() as s:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                found.update(s.scalars(select(Failover.id).where(Failover.id.in_(chunk))))
        return set(wanted) - found

    @translated
    def latest_revision(self) -> PolicyRevisionRecord | None:
        with self._session() as s:
            row = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
            if row is None:
                return None
            return PolicyRevisionRecord(
                row.id, row.digest, row.source, row.applied_by, row.applied_at
            )

    @translated
    def revision_count(self) -> int:
        with self._session() as s:
            return int(s.scalar(select(func.count()).select_from(PolicyRevision)) or 0)

    # -- reads: versions and replicas -------------------------------------------

    @translated
    def latest_version(self, dataset: str, key: str) -> VersionRef | None:
        """The version of highest HLC of one object (a tombstone if it was deleted last)."""
        query = (
            select(CatalogObject.key, ObjectVersion)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(CatalogObject.dataset == dataset, CatalogObject.key == key)
            .order_by(ObjectVersion.hlc.desc())
            .limit(1)
        )
        with self._session() as s:
            row = s.execute(query).first()
            return None if row is None else _ref(row[0], row[1])

    @translated
    def incomplete_versions(self, dataset: str, region: str) -> list[VersionRef]:
        """The LATEST version (highest HLC, puts and tombstones alike) of each object of
        `dataset` whose replica in `region` is missing or not `completed`, by key.

        Older versions superseded by a newer one are not listed: a catch-up only needs
        the newest, and an object counts once in RPO exposure."""
        latest = _latest_versions(dataset)
        query = (
            select(CatalogObject.key, ObjectVersion)
            .join(latest, latest.c.vid == ObjectVersion.id)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(~_replica_in(region, "completed"))
            .order_by(CatalogObject.key)
        )
        with self._session() as s:
            return [_ref(k, v) for k, v in s.execute(query).all()]

    @translated
    def oldest_incomplete_at(self, dataset: str, regions: Sequence[str]) -> datetime | None:
        """The HLC wall time of the oldest version a region of `regions` has not completed
        (versions it originated aside, but for one whose replica there is `failed`:
        startup repair found its bytes lost, and only a fetch from another region brings
        them back), among each object's versions newer than the newest it has completed;
        None when every region is up to date. The replication
        lag of the dataset is the age of this time (dataplane.md, Metrics): an object
        rewritten every second while a region completes nothing shows a lag that grows,
        not the one second to its latest version."""
        oldest: str | None = None
        with self._session() as s:
            for region in dict.fromkeys(regions):
                done = (
                    select(
                        ObjectVersion.object_id.label("oid"),
                        func.max(ObjectVersion.hlc).label("top"),
                    )
                    .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
                    .join(Replica, Replica.version_id == ObjectVersion.id)
                    .where(
                        CatalogObject.dataset == dataset,
                        Replica.region == region,
                        Replica.state == "completed",
                    )
                    .group_by(ObjectVersion.object_id)
                    .subquery()
                )
                # The region's own replica of each version, by one probe of the unique
                # (version_id, region) index: both conditions on it read the one row.
                here = aliased(Replica)
                query = (
                    select(func.min(ObjectVersion.hlc))
                    .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
                    .outerjoin(done, done.c.oid == ObjectVersion.object_id)
                    .outerjoin(
                        here, and_(here.version_id == ObjectVersion.id, here.region == region)
                    )
                    .where(
                        CatalogObject.dataset == dataset,
                        or_(done.c.top.is_(None), ObjectVersion.hlc > done.c.top),
                        or_(here.state.is_(None), here.state != "completed"),
                        or_(
                            ObjectVersion.origin_region.is_(None),
                            ObjectVersion.origin_region != region,
                            here.state == "failed",
                        ),
                    )
                )
                at = s.scalar(query)
                if at is not None and (oldest is None or at < oldest):
                    oldest = at
        return None if oldest is None else wall_time(oldest)

    @translated
    def holders(self, dataset: str, key: str, version: str) -> list[str]:
        """The regions that hold `version` of an object completed (sources for a copy),
        by name; empty when none does or the version is unknown."""
        query = (
            select(Replica.region)
            .join(ObjectVersion, ObjectVersion.id == Replica.version_id)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(
                CatalogObject.dataset == dataset,
                CatalogObject.key == key,
                ObjectVersion.version == version,
                Replica.state == "completed",
            )
            .order_by(Replica.region)
        )
        with self._session() as s:
            return list(s.scalars(query).all())

    @translated
    def replica_status(
        self,
        dataset: str,
        *,
        key: str | None = None,
        region: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[ReplicaStatus]:
        """Per-object replica state of a dataset (optionally one object, one region, some
        states), with the last attempt's time and error; by key, HLC, region."""
        query = (
            select(CatalogObject.key, ObjectVersion.version, ObjectVersion.hlc, Replica)
            .join(ObjectVersion, ObjectVersion.id == Replica.version_id)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(CatalogObject.dataset == dataset)
            .order_by(CatalogObject.key, ObjectVersion.hlc, Replica.region)
        )
        if key is not None:
            query = query.where(CatalogObject.key == key)
        if region is not None:
            query = query.where(Replica.region == region)
        if states is not None:
            query = query.where(Replica.state.in_(list(states)))
        if limit is not None:
            query = query.limit(limit)
        with self._session() as s:
            return [
                ReplicaStatus(
                    dataset=dataset,
                    object=k,
                    version=v,
                    hlc=h,
                    region=r.region,
                    state=r.state,  # type: ignore[arg-type]  # checked on write
                    verified_digest=r.verified_digest,
                    attempts=r.attempts,
                    last_error=r.last_error,
                    attempted_at=r.attempted_at,
                    updated_at=r.updated_at,
                )
                for k, v, h, r in s.execute(query).all()
            ]

    # -- reads: audit -----------------------------------------------------------

    @translated
    def residency_violations(self) -> list[dict[str, Any]]:
        """Every replica, and every past transfer, outside its dataset's residency."""
        with self._session() as s:
            return audit.residency_violations(s)

    @translated
    def transfers(
        self,
        *,
        since: datetime | None = None,
        dataset_glob: str | None = None,
        cross_border: bool = False,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Who copied what, from where to where, when, and how many bytes; oldest first."""
        with self._session() as s:
            return audit.transfers(
                s, since=since, dataset_glob=dataset_glob, cross_border=cross_border, limit=limit
            )

    @translated
    def dataset_locations(self, name: str) -> list[dict[str, Any]]:
        """Where each version of each object of a dataset lives, with digests and states."""
        with self._session() as s:
            return audit.dataset_locations(s, name)

    # -- policy revisions (the SQL half of `policy plan` and `policy apply`) ----

    @translated
    def policy_state(self) -> CatalogState:
        """What the catalog holds of the applied policy (regions, datasets, placements)."""
        with self._session() as s:
            return revisions.read_state(s)

    def apply_revision(
        self, decide: revisions.Decide, *, source: str, applied_by: str
    ) -> RevisionOutcome:
        """Commit the revision `decide` computes from the state read under the exclusive
        residency lock, in one transaction; refuse stranding replicas outside their new
        residency (`StrandedReplicasError`); record nothing when nothing changes."""
        # Not `@translated` as a whole: these two answers say what happened, where the
        # generic translation would only say "refused a write".
        try:
            return self._apply_revision(decide, source=source, applied_by=applied_by)
        except IntegrityError as exc:
            if "parent" not in str(exc.orig):  # only the one-revision-per-head rule says so
                raise translate_error(exc, self.url) from exc
            raise CatalogConflictError(
                "another `policy apply` committed first; run `meridian policy plan` and apply again"
            ) from exc
        except OperationalError as exc:
            if "locked" in str(exc).lower():
                raise CatalogConflictError(
                    "another `policy apply` is running on this catalog; try again when it is done"
                ) from exc
            raise translate_error(exc, self.url) from exc
        except SQLAlchemyError as exc:
            raise translate_error(exc, self.url) from exc

    def _apply_revision(
        self, decide: revisions.Decide, *, source: str, applied_by: str
    ) -> RevisionOutcome:
        with self._session() as s, s.begin():
            # Exclusive: a second apply waits, and so do writes judging copies against
            # a residency (on SQLite, a second writer waits in busy_timeout instead of
            # both reading and then one failing to upgrade).
            residency_lock(s, exclusive=True)
            state = revisions.read_state(s)
            draft = decide(state)
            if not draft.changed:
                head = s.get(PolicyRevision, state.head) if state.head else None
                return RevisionOutcome(
                    revision=head.id if head else 0,
                    digest=head.digest if head else draft.digest,
                    applied_at=head.applied_at if head else utcnow(),
                    recorded=False,
                    lineage=_lineage(s),
                )
            revisions.refuse_stranding(s, state, draft)
            now = utcnow()
            revisions.write(s, state, draft, now)
            rev = PolicyRevision(
                parent=state.head,
                digest=draft.digest,
                source=source,
                applied_by=applied_by,
                applied_at=now,
                document=draft.document,
            )
            s.add(rev)
            s.flush()
            return RevisionOutcome(
                rev.id, rev.digest, rev.applied_at, recorded=True, lineage=_lineage(s)
            )

    # -- writes -----------------------------------------------------------------

    @translated
    def register_dataset(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Register a dataset on first write (idempotent; labels of an existing one stay).

        A new dataset is placed at once by the last applied policy, if one selects it."""
        with self._tx() as s:
            residency_lock(s, exclusive=False)  # placed by the head, not a superseded one
            self._ensure_dataset(s, name, labels or {})

    def _ensure_dataset(self, s: Session, name: str, labels: dict[str, str]) -> None:
        if s.get(Dataset, name) is not None:
            return
        values: dict[str, Any] = {
            "name": name,
            "labels": labels,
            "declared": False,
            "registered_at": utcnow(),
        }
        values.update(placement_columns(self._place_new(s, name, labels)))
        s.execute(self._insert_ignore(Dataset, values, ["name"]))

    def _place_new(self, s: Session, name: str, labels: dict[str, str]) -> Placement | None:
        head = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
        if head is None:
            return None
        if self._placer is None:
            raise CatalogInputError(
                f"dataset {name!r} is new and this catalog was opened without a placer, "
                "so it cannot be placed under the applied policy; open it with "
                "controlplane.policy.placer.place"
            )
        return self._placer(head.document, name, labels)

    @translated
    def register_object(self, dataset: str, key: str) -> None:
        """Register an object (and its dataset if new); idempotent on (dataset, key)."""
        with self._tx() as s:
            residency_lock(s, exclusive=False)
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

    @translated
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
        hlc: str | None = None,
        op: str = "put",
        set_id: str | None = None,
    ) -> None:
        """Register an object version (and its object and dataset if new); idempotent on
        (dataset, key, version). The same version with another digest is refused.

        `hlc` orders it among the object's versions; when not given, a `version` that is
        HLC text is its own HLC (the data plane names versions so), and any other name
        gets one just above the object's newest (registered last = latest). `op` is
        "put" or "delete" (a tombstone, whose digest may be empty)."""
        if op not in VERSION_OPS:
            raise CatalogInputError(f"version op {op!r} is not one of {', '.join(VERSION_OPS)}")
        what = f"version {version} of {dataset}/{key}"
        if hlc is not None:
            check_hlc(hlc, what=what)
            if is_hlc(version) and hlc != version:
                raise CatalogInputError(f"{what} is HLC text, so its HLC cannot be {hlc}")
        if op == "delete" and digest:
            raise CatalogInputError(f"{what} is a delete (a tombstone), which has no digest")
        if op == "put":
            holdings_mod.check_digest(digest, what=what)
        with self._tx() as s:
            residency_lock(s, exclusive=False)
            self._ensure_version(
                s,
                dataset,
                key,
                version,
                digest,
                size,
                origin_region,
                created_at,
                hlc,
                op,
                set_id,
            )

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
        hlc: str | None,
        op: str,
        set_id: str | None,
    ) -> int:
        oid = self._ensure_object(s, dataset, key)
        if hlc is None and not is_hlc(version) and self.dialect == "postgresql":
            # Two registrations numbering the same object at once would compute the same
            # stamp; the object's row lock makes the second wait for the first's commit.
            # (SQLite's writer lock, taken by the residency lock, already serialises them.)
            s.execute(select(CatalogObject.id).where(CatalogObject.id == oid).with_for_update())
        existing = s.execute(
            select(
                ObjectVersion.id, ObjectVersion.digest, ObjectVersion.op, ObjectVersion.hlc
            ).where(ObjectVersion.object_id == oid, ObjectVersion.version == version)
        ).first()
        what = f"version {version} of {dataset}/{key}"
        if existing is not None and (
            existing.op != op or (hlc is not None and existing.hlc != hlc)
        ):
            raise CatalogInputError(
                f"{what} is registered as a {existing.op} at HLC {existing.hlc}, "
                f"not as a {op}{'' if hlc is None else f' at {hlc}'}"
            )
        if existing is None:
            at = created_at or utcnow()
            if hlc is None:
                if is_hlc(version):
                    hlc = version
                else:
                    newest = s.scalar(
                        select(func.max(ObjectVersion.hlc)).where(ObjectVersion.object_id == oid)
                    )
                    hlc = stamp_after(newest, at, origin_region)
            s.execute(
                self._insert_ignore(
                    ObjectVersion,
                    {
                        "object_id": oid,
                        "version": version,
                        "digest": digest,
                        "size": size,
                        "origin_region": origin_region,
                        "created_at": at,
                        "hlc": hlc,
                        "op": op,
                        "set_id": set_id,
                    },
                    ["object_id", "version"],
                )
            )
            existing = s.execute(
                select(
                    ObjectVersion.id, ObjectVersion.digest, ObjectVersion.op, ObjectVersion.hlc
                ).where(ObjectVersion.object_id == oid, ObjectVersion.version == version)
            ).one()
        if existing.digest != digest:
            raise CatalogInputError(
                f"version {version} of {dataset}/{key} is registered with digest "
                f"{existing.digest}, not {digest}"
            )
        return int(existing.id)

    @translated
    def set_replica_state(
        self,
        dataset: str,
        key: str,
        version: str,
        region: str,
        state: str,
        *,
        digest: str | None = None,
        error: str | None = None,
        attempted_at: datetime | None = None,
    ) -> None:
        """Create the replica of a registered version in `region`, or move it to `state`.

        Moves follow `NEXT_STATES`; setting the state it already has is a no-op (a
        completed replica then must name the same digest). `completed` needs `digest`,
        the digest the region verified, which must be the version's. `error` and
        `attempted_at` record an attempt (a `failed` replica should say why)."""
        with self._tx() as s:
            residency_lock(s, exclusive=False)
            self._set_replica(s, dataset, key, version, region, state, digest, error, attempted_at)

    def _set_replica(
        self,
        s: Session,
        dataset: str,
        key: str,
        version: str,
        region: str,
        state: str,
        digest: str | None,
        error: str | None,
        attempted_at: datetime | None,
    ) -> None:
        if state not in REPLICA_STATES:
            raise CatalogInputError(
                f"replica state {state!r} is not one of {', '.join(REPLICA_STATES)}"
            )
        where = f"the replica of {dataset}/{key}@{version} in {region}"
        row = s.execute(
            select(ObjectVersion.id, ObjectVersion.digest, ObjectVersion.op)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(
                CatalogObject.dataset == dataset,
                CatalogObject.key == key,
                ObjectVersion.version == version,
            )
        ).first()
        if row is None:
            raise CatalogInputError(f"version {version} of {dataset}/{key} is not registered")
        vid, version_digest, op = int(row.id), row.digest, row.op
        if state == "completed":
            if digest is None and op == "delete":
                digest = version_digest  # a tombstone has no content to verify
            if digest is None:
                raise CatalogInputError(f"{where} cannot complete without the digest it verified")
            if digest != version_digest:
                raise CatalogInputError(
                    f"{where} verified digest {digest}, but the version's digest is "
                    f"{version_digest}; it stays incomplete"
                )
        jurisdiction, allowed = self._judge(s, dataset, region)
        now = utcnow()
        attempt: dict[str, Any] = {}
        if error is not None or attempted_at is not None:
            attempt = {
                "attempted_at": attempted_at or now,
                "last_error": None if error is None else error[:ERROR_TEXT_MAX],
                "attempts": Replica.attempts + 1,
            }
        created = s.execute(
            self._insert_ignore(
                Replica,
                {
                    "version_id": vid,
                    "region": region,
                    "jurisdiction": jurisdiction,
                    "allowed": allowed,
                    "state": state,
                    "updated_at": now,
                    "verified_digest": digest if state == "completed" else None,
                    "attempts": 1 if attempt else 0,
                    "attempted_at": attempt.get("attempted_at"),
                    "last_error": attempt.get("last_error"),
                },
                ["version_id", "region"],
            ).returning(Replica.id)
        )
        if created.first() is not None:
            return  # a new replica may start in any state
        current = s.execute(
            select(Replica.id, Replica.state, Replica.verified_digest).where(
                Replica.version_id == vid, Replica.region == region
            )
        ).one()
        if current.state == state:
            if state == "completed" and current.verified_digest != digest:
                raise CatalogInputError(
                    f"{where} is completed with digest {current.verified_digest}, not {digest}"
                )
            if attempt:
                s.execute(update(Replica).where(Replica.id == current.id).values(**attempt))
            return
        if state not in NEXT_STATES[current.state]:
            raise CatalogInputError(
                f"{where} is {current.state} and cannot become {state} "
                f"(allowed: {_allowed_moves(current.state)})"
            )
        # Guarded on the state read above, so two racing movers cannot both move it.
        moved = s.execute(
            update(Replica)
            .where(Replica.id == current.id, Replica.state == current.state)
            .values(
                state=state,
                updated_at=now,
                verified_digest=digest if state == "completed" else None,
                **attempt,
            )
            .returning(Replica.id)
        )
        if moved.first() is None:
            raise CatalogConflictError(f"{where} changed state while being moved; retry")

    @translated
    def record_holdings(
        self,
        versions: Sequence[HeldVersion],
        holdings: Sequence[Holding],
        transfers: Sequence[TransferRecord] = (),
    ) -> None:
        """Record, in one transaction, a batch of what an agent reports: versions it
        stored (registered as `register_version` would, with their datasets and objects),
        its region's replica of versions (`Holding`: completed, failed or removed; the
        holder is the authority on its own copy, so this sets the state whatever it was,
        and the last holding of a replica in the batch stands), and transfers
        (idempotent on their id). All or nothing; repeating a batch changes nothing.
        See `holdings.py`."""
        with self._tx() as s:
            residency_lock(s, exclusive=False)
            holdings_mod.record(self, s, versions, holdings, transfers)

    @translated
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
        # Fail closed: a dataset no applied policy places has no residency that admits
        # any copy, so its copies are recorded outside residency (audits show them)
        # until a policy places it and `policy apply` judges them again.
        allowed = residency is not None and jurisdiction in residency
        return jurisdiction, allowed

    @translated
    def record_transfer(self, rec: TransferRecord) -> None:
        """Record one cross-region copy; idempotent on `rec.id`. Jurisdictions and
        whether the destination lies inside the residency in force are stored with it."""
        with self._tx() as s:
            # before any write, so that waiting for an apply holds no row lock it needs
            residency_lock(s, exclusive=False)  # (see _judge)
            self._insert_transfer(s, rec)

    def _insert_transfer(self, s: Session, rec: TransferRecord) -> bool:
        """Insert the transfer row unless its id exists; True when this call inserted it."""
        self._ensure_dataset(s, rec.dataset, {})  # audits find transfers by dataset
        # The catalog's jurisdictions now; the record's for a region removed since.
        from_now = (
            s.scalar(select(Region.jurisdiction).where(Region.name == rec.from_region))
            or rec.from_jurisdiction
        )
        to_now = (
            s.scalar(select(Region.jurisdiction).where(Region.name == rec.to_region))
            or rec.to_jurisdiction
        )
        if to_now is None:
            raise CatalogInputError(
                f"region {rec.to_region!r} is not in the catalog; apply a topology naming it"
            )
        if from_now is None:
            raise CatalogInputError(f"region {rec.from_region!r} is not in the catalog")
        residency = s.scalar(select(Dataset.residency).where(Dataset.name == rec.dataset))
        in_force = (
            holdings_mod.in_force_at(holdings_mod.revisions_in_force(s), rec.at)
            if rec.residency_revision is not None
            else None
        )
        row = holdings_mod.transfer_row(
            rec, *holdings_mod.judged_then(rec, from_now, to_now, residency, in_force)
        )
        # RETURNING says whether this call inserted the row (psycopg's rowcount does not).
        inserted = s.execute(self._insert_ignore(Transfer, row, ["id"]).returning(Transfer.id))
        return inserted.first() is not None

    @translated
    def record_copy(self, rec: CopyRecord) -> bool:
        """Record a replica's new state and the transfer that produced it, together, in
        one transaction; idempotent on `rec.id` (a repeat changes nothing and returns
        False; the first call returns True). The version must be registered."""
        with self._tx() as s:
            residency_lock(s, exclusive=False)
            # The transfer row goes first: of two callers racing with one id, the second
            # waits on the first's insert (PostgreSQL) or its writer lock (SQLite), then
            # inserts nothing and leaves the replica alone.
            if not self._insert_transfer(
                s,
                TransferRecord(
                    id=rec.id,
                    dataset=rec.dataset,
                    object=rec.object,
                    version=rec.version,
                    from_region=rec.from_region,
                    to_region=rec.to_region,
                    logical_bytes=rec.logical_bytes,
                    wire_bytes=rec.wire_bytes,
                    outcome=rec.state,
                    at=rec.at,
                    policy_revision=rec.policy_revision,
                ),
            ):
                return False
            self._set_replica(
                s,
                rec.dataset,
                rec.object,
                rec.version,
                rec.to_region,
                rec.state,
                rec.verified_digest if rec.state == "completed" else None,
                rec.error,
                rec.at,
            )
            return True

    @translated
    def append_failover(self, rec: FailoverRecord) -> None:
        """Append to the failover journal; idempotent on `rec.id` (a repeat is ignored),
        but for a row another controller rebuilt late (`details.backfilled`: its mover
        seemed gone): the mover's own row, with its RPO exposure, replaces it."""
        if rec.kind not in FAILOVER_KINDS:
            raise CatalogInputError(
                f"failover kind {rec.kind!r} is not one of {', '.join(FAILOVER_KINDS)}"
            )
        if rec.outcome not in FAILOVER_OUTCOMES:
            raise CatalogInputError(
                f"failover outcome {rec.outcome!r} is not one of {', '.join(FAILOVER_OUTCOMES)}"
            )
        row = {
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
        }
        with self._tx() as s:
            inserted = s.execute(
                self._insert_ignore(Failover, row, ["id"]).returning(Failover.id)
            ).first()
            if inserted is not None or rec.details_json.get("backfilled"):
                return
            held = s.scalar(select(Failover.details).where(Failover.id == rec.id))
            if held is not None and _backfilled(held):
                s.execute(update(Failover).where(Failover.id == rec.id).values(**row))

    # -- bulk loading (imports and benchmarks, not the online path) -------------

    @translated
    def bulk_load(
        self,
        table: str,
        columns: Sequence[str],
        rows: Any,
        *,
        defer_checks: bool = False,
    ) -> int:
        """Load rows into `table` (see `bulk.bulk_load`); returns how many."""
        return bulk.bulk_load(self._engine, table, columns, rows, defer_checks=defer_checks)

    @translated
    def after_load(self, tables: Sequence[str]) -> None:
        """Refresh planner statistics after a bulk load (see `bulk.after_load`)."""
        bulk.after_load(self._engine, list(tables))


def _lineage(s: Session) -> str:
    """A name for this catalog's line of policy revisions: a digest of its first one."""
    first = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id).limit(1)).first()
    if first is None:
        return ""
    seed = f"{first.id}|{first.digest}|{first.applied_by}|{first.applied_at.isoformat()}"
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def _allowed_moves(state: str) -> str:
    nxt = sorted(NEXT_STATES[state])
    return ", ".join(nxt) if nxt else "none: it is final"


def _ref(key: str, v: ObjectVersion) -> VersionRef:
    return VersionRef(key, v.version, v.digest, v.hlc, "delete" if v.op == "delete" else "put")


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


def open_catalog(url: str, *, placer: Placer | None = None) -> Catalog:
    """Open the catalog at `url`; raise one sentence if it is unreachable or not migrated
    (naming `meridian db upgrade`). See `Catalog` for `placer`."""
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
    return Catalog(engine, url, placer=placer)


__all__ = [
    "Catalog",
    "CatalogUnavailableError",
    "open_catalog",
    "redacted",
]


def _latest_versions(dataset: str) -> Subquery:
    """The id (as `vid`) of the version of highest HLC of each object of `dataset`."""
    newest = (
        select(ObjectVersion.object_id, func.max(ObjectVersion.hlc).label("top"))
        .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
        .where(CatalogObject.dataset == dataset)
        .group_by(ObjectVersion.object_id)
        .subquery()
    )
    return (
        select(ObjectVersion.id.label("vid"))
        .join(
            newest,
            and_(newest.c.object_id == ObjectVersion.object_id, newest.c.top == ObjectVersion.hlc),
        )
        .subquery()
    )


def _backfilled(details: str) -> bool:
    """Whether a journal row's details say a controller rebuilt it late."""
    try:
        value = json.loads(details) if details else {}
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("backfilled") is True


def _replica_in(region: str, state: str) -> Exists:
    """True for an ObjectVersion row whose replica in `region` is in `state` (a lookup
    on the unique index of replicas (version_id, region))."""
    return (
        select(Replica.id)
        .where(
            and_(
                Replica.version_id == ObjectVersion.id,
                Replica.region == region,
                Replica.state == state,
            )
        )
        .exists()
    )
