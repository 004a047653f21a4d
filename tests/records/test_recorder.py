"""The recorder ships the store's journal to a real catalog (SQLite and PostgreSQL):
once, in order, idempotently across a crash, without wedging on a bad record."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime

import pytest
from records_helpers import DATASET, REGION, StoreFactory
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agents.metrics import AgentMetrics
from agents.records import Recorder, RecorderSettings
from agents.store import ObjectStore
from agents.store.model import JsonValue
from agents.transfer.records import Outcome, TransferTally
from controlplane.catalog.api import Catalog
from controlplane.catalog.errors import CatalogError
from controlplane.catalog.models import CatalogObject, Dataset, ObjectVersion, Replica, Transfer
from replicator.resync import plan_resync
from replicator.status import replication_status

SqlSession = Callable[[str], AbstractContextManager[Session]]


def _ship_all(recorder: Recorder) -> int:
    total = 0
    for _ in range(100):  # bounded: a few batches at most
        done = recorder.ship_pending()
        total += done
        if done == 0:
            return total
    raise AssertionError("the recorder never caught up")


def _transfer(
    tid: str,
    dataset: str,
    key: str,
    from_region: str,
    to_region: str,
    logical: int,
    wire: int,
    outcome: Outcome,
) -> dict[str, JsonValue]:
    """A transfer record as the transfers journal it (their own TransferTally)."""
    tally = TransferTally(tid, dataset, key, from_region, to_region, "in", "sync", logical, wire)
    return tally.record(outcome, lambda: None, "why" if outcome != "completed" else "")


def _counts(cat: Catalog, sql: SqlSession) -> dict[str, int]:
    with sql(cat.url) as s:
        return {
            str(model.__tablename__): int(s.scalar(select(func.count()).select_from(model)) or 0)
            for model in (Dataset, CatalogObject, ObjectVersion, Replica, Transfer)
        }


def _locations(cat: Catalog, key: str, dataset: str = DATASET) -> list[tuple[str, str, str]]:
    """(version, region, state) of every version of an object; region '' when none holds it."""
    return [
        (row["version"], row["region"] or "", row["state"] or "")
        for row in cat.dataset_locations(dataset)
        if row["object"] == key
    ]


def test_every_kind_is_shipped_once_in_order(
    store: ObjectStore, cat: Catalog, metrics: AgentMetrics
) -> None:
    # Three puts of one object with keep_versions=2: the first is pruned, and the
    # catalog must see its removal after its registration (order matters).
    v1 = store.put(DATASET, "a.parquet", [b"one"])
    v2 = store.put(DATASET, "a.parquet", [b"two"])
    v3 = store.put(DATASET, "a.parquet", [b"three"])
    b1 = store.put(DATASET, "b.parquet", [b"bee"])
    tomb = store.delete(DATASET, "b.parquet")
    recorder = Recorder(store, cat, metrics, REGION, RecorderSettings(batch_size=2))

    # 5 versions and 1 removal, in batches of 2.
    assert _ship_all(recorder) == 6
    assert store.journal_pending() == []
    assert metrics.registry.get_sample_value("meridian_records_shipped_total") == 6
    assert _locations(cat, "a.parquet") == [
        (v1.hlc.text, "", ""),  # registered, then no longer held here
        (v2.hlc.text, REGION, "completed"),
        (v3.hlc.text, REGION, "completed"),
    ]
    latest = cat.latest_version(DATASET, "a.parquet")
    assert latest is not None and (latest.version, latest.digest) == (v3.hlc.text, str(v3.digest))
    assert _locations(cat, "b.parquet") == [
        (b1.hlc.text, REGION, "completed"),
        (tomb.hlc.text, REGION, "completed"),
    ]
    deleted = cat.latest_version(DATASET, "b.parquet")
    assert deleted is not None and (deleted.op, deleted.digest) == ("delete", "")
    assert cat.oldest_incomplete_at(DATASET, [REGION]) is None


def test_a_batch_shipped_twice_makes_no_duplicate(
    store: ObjectStore, cat: Catalog, metrics: AgentMetrics, sql: SqlSession
) -> None:
    """A crash between the catalog's commits and `journal_shipped`: the next recorder
    ships the same records again, which must change nothing."""
    store.put(DATASET, "a", [b"one"])
    store.put(DATASET, "a", [b"two"])
    store.put(DATASET, "a", [b"three"])  # prunes the first: a removal in the batch
    moved = store.put(DATASET, "c", [b"copied"])
    store.record_transfer(
        DATASET,
        "c",
        moved.hlc.text,
        _transfer(uuid.uuid4().hex, DATASET, "c", "us-east", REGION, 6, 4, "completed"),
    )
    first = Recorder(store, cat, metrics, REGION)
    assert first.ship_pending(mark=False) == 6
    assert store.journal_position() == 0  # as after a crash before the mark
    once = _counts(cat, sql)
    where = _locations(cat, "a")

    second = Recorder(store, cat, AgentMetrics(REGION), REGION)
    assert _ship_all(second) == 6
    assert _counts(cat, sql) == once
    assert _locations(cat, "a") == where
    assert once["transfers"] == 1 and once["replicas"] == 3


def test_missing_bytes_fail_the_replica_and_a_restore_completes_it(
    open_store: StoreFactory, cat: Catalog, metrics: AgentMetrics
) -> None:
    store = open_store()
    version = store.put(DATASET, "lost", [b"soon gone"])
    _ship_all(Recorder(store, cat, metrics, REGION))
    root = store.root
    store.close()
    for path in (root / "objects").rglob("*"):
        if path.is_file():
            path.unlink()  # the disk lost it: startup repair marks it missing
    store = open_store()
    assert store.repair_report.marked_missing == 1
    _ship_all(Recorder(store, cat, metrics, REGION))
    [failed] = cat.replica_status(DATASET, key="lost")
    assert failed.state == "failed" and failed.last_error is not None
    assert "bytes lost in eu-west" in failed.last_error
    # Made here and lost here: status shows it failed, and resync re-drives it (a fetch
    # from another region is the only way back).
    [row] = replication_status(cat, datetime.now(UTC), dataset_glob=DATASET, region=REGION)
    assert (row["failed"], row["pending"]) == (1, 0)
    [item] = [i for i in plan_resync(cat, cat.list_placements(), REGION) if i.key == "lost"]
    assert (item.version, item.state) == (version, "failed")

    store.apply(DATASET, "lost", version, [b"soon gone"])  # refilled from elsewhere
    _ship_all(Recorder(store, cat, metrics, REGION))
    [again] = cat.replica_status(DATASET, key="lost")
    assert (again.state, again.verified_digest) == ("completed", str(version.digest))


def test_a_dataset_new_to_the_catalog_is_registered_not_set_aside(
    store: ObjectStore, cat: Catalog, metrics: AgentMetrics
) -> None:
    version = store.put("logs/unplaced", "k", [b"x"])
    recorder = Recorder(store, cat, metrics, REGION)
    assert _ship_all(recorder) == 1
    assert recorder.set_aside.read() == []
    assert _locations(cat, "k", "logs/unplaced") == [(version.hlc.text, REGION, "completed")]


def test_a_record_the_catalog_refuses_is_set_aside_and_the_queue_moves_on(
    store: ObjectStore, cat: Catalog, metrics: AgentMetrics
) -> None:
    # No region mars-1 in the catalog: refused for good.
    store.record_transfer(
        DATASET, "k", None, _transfer("t-mars", DATASET, "k", "mars-1", REGION, 1, 1, "refused")
    )
    after = store.put(DATASET, "after", [b"next"])
    recorder = Recorder(store, cat, metrics, REGION)

    assert _ship_all(recorder) == 2
    [kept] = recorder.set_aside.read()
    assert kept["what"] == "journal"
    assert "mars-1" in str(kept["reason"])
    assert kept["record"]["data"]["id"] == "t-mars"  # type: ignore[index]
    assert (
        metrics.registry.get_sample_value("meridian_records_set_aside_total", {"queue": "journal"})
        == 1
    )
    assert _locations(cat, "after") == [(after.hlc.text, REGION, "completed")]
    assert store.journal_pending() == []


def test_a_failing_catalog_sets_nothing_aside_and_ships_it_all_once_it_works(
    store: ObjectStore, cat: Catalog, metrics: AgentMetrics
) -> None:
    # Not one record's fault (a permission revoked, a read-only file): the batch is
    # retried as it is, not drained into the set-aside file record by record.
    first = store.put(DATASET, "a", [b"one"])
    second = store.put(DATASET, "b", [b"two"])
    recorder = Recorder(store, cat, metrics, REGION)
    real = cat.record_holdings

    def denied(*args: object, **kwargs: object) -> None:
        raise CatalogError("the catalog failed: permission denied for table replicas")

    cat.record_holdings = denied  # type: ignore[method-assign]
    with pytest.raises(CatalogError, match="permission denied"):
        recorder.ship_pending()
    assert recorder.set_aside.read() == []
    assert len(store.journal_pending()) == 2  # nothing marked shipped
    cat.record_holdings = real  # type: ignore[method-assign]
    assert _ship_all(recorder) == 2
    assert recorder.set_aside.read() == []
    assert _locations(cat, "a") == [(first.hlc.text, REGION, "completed")]
    assert _locations(cat, "b") == [(second.hlc.text, REGION, "completed")]


def test_a_refused_transfer_is_audited_but_is_no_residency_violation(
    store: ObjectStore, cat: Catalog, metrics: AgentMetrics
) -> None:
    # ckpt/llama-70b may live in the EU only: us-east was refused a copy.
    refused = _transfer(
        "t-refused", "ckpt/llama-70b", "shard-0", REGION, "us-east", 100, 0, "refused"
    )
    store.record_transfer("ckpt/llama-70b", "shard-0", None, refused)
    _ship_all(Recorder(store, cat, metrics, REGION))
    [row] = cat.transfers()
    assert (row["id"], row["outcome"], row["to"]) == ("t-refused", "refused", "us-east")
    assert cat.residency_violations() == []


def test_records_behind_is_right_after_a_restart(
    open_store: StoreFactory, cat: Catalog, metrics: AgentMetrics
) -> None:
    store = open_store()
    store.put(DATASET, "a", [b"x"])
    oldest_ms = store.journal_pending()[0].at_ms
    store.close()
    store = open_store()  # a restart: nothing in memory knows the backlog

    recorder = Recorder(store, cat, metrics, REGION)
    behind = metrics.registry.get_sample_value("meridian_records_behind_seconds")
    assert behind is not None and behind > 0
    assert behind >= (store.journal_pending()[0].at_ms - oldest_ms) / 1000
    _ship_all(recorder)
    assert metrics.registry.get_sample_value("meridian_records_behind_seconds") == 0
