"""plan and apply against a real catalog (SQLite and PostgreSQL) and a real etcd."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd3aio import Etcd3Client
from harness.digests import fake_digest
from sqlalchemy import select

from controlplane.catalog.api import Catalog, open_catalog
from controlplane.catalog.errors import CatalogConflictError
from controlplane.catalog.models import PolicyRevision
from controlplane.errors import ConflictError, UnavailableError
from controlplane.policy.apply import StrandedReplicasError, apply_policy, plan_changes
from controlplane.policy.compiler import PolicySet, compile_files, compile_text
from controlplane.policy.placer import place
from controlplane.policy.publisher import POLICY_KEY, EtcdPolicyPublisher

DATA = Path(__file__).parent / "data"
EXAMPLE = (DATA / "example.yaml").read_text()


def policy_of(text: str) -> PolicySet:
    policy, problems = compile_text(text)
    assert policy is not None, problems
    return policy


@pytest.fixture
def cat(catalog_url: str) -> Iterator[Catalog]:
    catalog = open_catalog(catalog_url, placer=place)
    yield catalog
    catalog.close()


def revisions(cat: Catalog, sql: Any) -> list[tuple[int, int, str, str]]:
    with sql(cat.url) as s:
        rows = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id)).all()
        return [(r.id, r.parent, r.digest, r.applied_by) for r in rows]


def test_apply_is_idempotent_and_records_the_revision(cat: Catalog, sql: Any) -> None:
    policy = policy_of(EXAMPLE)
    first = apply_policy(cat, policy, source="git:abc", publisher=None, applied_by="alice")
    assert first.changes and first.revision == 1
    again = apply_policy(cat, policy, source="git:abc", publisher=None, applied_by="alice")
    assert again.changes == [] and again.revision == 1
    assert revisions(cat, sql) == [(1, 0, policy.digest, "alice")]
    assert plan_changes(cat, policy) == []
    with sql(cat.url) as s:
        rev = s.get(PolicyRevision, 1)
        assert rev is not None and rev.source == "git:abc"


def test_an_apply_whose_confirmed_plan_went_stale_applies_nothing(cat: Catalog, sql: Any) -> None:
    """The CLI plans, asks, then applies under the lock: another apply that committed in
    between makes the change set differ from the one confirmed."""
    policy = policy_of(EXAMPLE)
    shown = plan_changes(cat, policy)
    assert shown
    other = apply_policy(cat, policy, source="git:other", publisher=None, applied_by="bob")
    with pytest.raises(ConflictError, match="changed after the plan you confirmed"):
        apply_policy(cat, policy, source="git:mine", publisher=None, confirmed=shown)
    assert revisions(cat, sql) == [(other.revision, 0, policy.digest, "bob")]
    # What is shown now is what is applied (nothing, here).
    again = apply_policy(
        cat, policy, source="git:mine", publisher=None, confirmed=plan_changes(cat, policy)
    )
    assert again.changes == [] and again.revision == other.revision


def test_catalog_returns_the_planned_placements_whole(cat: Catalog) -> None:
    policy = policy_of(EXAMPLE)
    apply_policy(cat, policy, source="a", publisher=None)
    cat.register_dataset("corpus/web")  # placed on first write, by the head revision
    planned = policy.placements({"corpus/web": {}})
    stored = {p.dataset: p for p in cat.list_placements()}
    assert stored == planned
    assert cat.get_placement("ckpt/llama-70b") == planned["ckpt/llama-70b"]
    assert stored["ckpt/llama-70b"].transfer_bandwidth_bps == 500 * 1024**2
    assert stored["corpus/web"].rpo_s == 30.0


def test_rows_stored_before_whole_placements_get_their_terms_from_the_revision(
    cat: Catalog, sql: Any
) -> None:
    """A row written before placements carried their terms (no placement JSON, or the
    partial one of the first 0004 rows) reads as the same whole placement, and the
    plan against it shows no change."""
    from controlplane.catalog.models import Dataset

    policy = policy_of(EXAMPLE.replace("rpo: 30s", "rpo: 500ms"))
    apply_policy(cat, policy, source="a", publisher=None)
    cat.register_dataset("corpus/web")
    planned = policy.placements({"corpus/web": {}})
    partial = {k: v for k, v in planned["ckpt/llama-70b"].as_json().items() if k != "rpo_s"}
    with sql(cat.url) as s, s.begin():
        s.get(Dataset, "ckpt/llama-70b").placement = partial
        s.get(Dataset, "corpus/web").placement = None
    assert cat.get_placement("ckpt/llama-70b") == planned["ckpt/llama-70b"]
    assert cat.list_placements() == [planned["ckpt/llama-70b"], planned["corpus/web"]]
    assert planned["corpus/web"].rpo_s == 0.5
    assert planned["ckpt/llama-70b"].transfer_bandwidth_bps == 500 * 1024**2
    assert plan_changes(cat, policy) == []


def test_reformatted_files_are_no_change(cat: Catalog) -> None:
    apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=None)
    docs = EXAMPLE.split("---\n")
    reordered = "---\n".join([docs[2], docs[0], docs[3], docs[1]])  # comments kept, order moved
    assert plan_changes(cat, policy_of(reordered)) == []


def test_plan_names_changed_fields(cat: Catalog, sql: Any) -> None:
    apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=None)
    cat.register_version("corpus/web", "a", "v1", fake_digest("d"))
    changed = EXAMPLE.replace("rpo: 30s", "rpo: 60s").replace("count: 2", "count: 1")
    changes = {(c.action, c.kind, c.name): c.fields for c in plan_changes(cat, policy_of(changed))}
    assert changes[("change", "ReplicationPolicy", "web-corpus")] == {
        "replicas.count": (2, 1),
        "rpo": ("30s", "60s"),
    }
    assert changes[("change", "Placement", "corpus/web")] == {
        "failover_order": (["eu-west", "eu-central"], ["eu-west"]),
        "replicas": (["eu-west", "eu-central"], ["eu-west"]),
        "rpo_s": (30.0, 60.0),  # the placement carries its policy's terms
    }
    result = apply_policy(cat, policy_of(changed), source="b", publisher=None)
    assert result.revision == 2
    placement = cat.get_placement("corpus/web")
    assert placement is not None and placement.replicas == ("eu-west",)
    assert placement.rpo_s == 60.0 and placement.ack is None
    assert [r[1] for r in revisions(cat, sql)] == [0, 1]


def test_apply_refuses_to_strand_replicas_and_changes_nothing(cat: Catalog, sql: Any) -> None:
    apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=None)
    cat.register_version("corpus/web", "shard-1", "v1", fake_digest("d"))
    cat.set_replica_state(
        "corpus/web", "shard-1", "v1", "us-east", "completed", digest=fake_digest("d")
    )
    eu_only = (
        EXAMPLE.replace("residency: [EU, US]", "residency: [EU]")
        .replace("home: us-east", "home: eu-west")
        .replace("count: 2", "count: 1")
    )
    with pytest.raises(StrandedReplicasError, match=r"corpus/web/shard-1@v1 in us-east \(US\)"):
        apply_policy(cat, policy_of(eu_only), source="b", publisher=None)
    assert len(revisions(cat, sql)) == 1
    placement = cat.get_placement("corpus/web")
    assert placement is not None and placement.residency == ("EU", "US")
    # Once the replica is removed, the same change applies.
    cat.remove_replica("corpus/web", "shard-1", "v1", "us-east")
    assert apply_policy(cat, policy_of(eu_only), source="b", publisher=None).revision == 2


def test_removing_a_region_that_holds_replicas_is_refused(cat: Catalog, sql: Any) -> None:
    apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=None)
    cat.register_version("ckpt/llama-70b", "a", "v1", fake_digest("d"))
    cat.set_replica_state(
        "ckpt/llama-70b", "a", "v1", "eu-central", "completed", digest=fake_digest("d")
    )
    without = (
        EXAMPLE.replace("    - name: eu-central\n      jurisdiction: EU\n", "")
        .replace(
            "    - between: [eu-west, eu-central]\n      rtt: 12ms\n      bandwidth: 10Gbps\n", ""
        )
        .replace("regions: [eu-central]", "regions: [us-east]")
        .replace("residency: [EU]   ", "residency: [EU, US]")
        .replace("order: [eu-central]", "order: [us-east]")
        .replace("count: 2", "count: 1")
    )
    with pytest.raises(StrandedReplicasError, match=r"in eu-central \(no longer in the topology\)"):
        apply_policy(cat, policy_of(without), source="b", publisher=None)
    assert len(revisions(cat, sql)) == 1


def test_widening_residency_clears_violations(cat: Catalog, sql: Any) -> None:
    apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=None)
    cat.register_version("ckpt/llama-70b", "a", "v1", fake_digest("d"))
    cat.set_replica_state(
        "ckpt/llama-70b", "a", "v1", "us-east", "completed", digest=fake_digest("d")
    )  # a violation
    from controlplane.catalog.audit import residency_violations

    with sql(cat.url) as s:
        assert [v["region"] for v in residency_violations(s)] == ["us-east"]
    wider = EXAMPLE.replace("residency: [EU]   ", "residency: [EU, US]")
    assert wider != EXAMPLE
    apply_policy(cat, policy_of(wider), source="b", publisher=None)
    with sql(cat.url) as s:
        assert residency_violations(s) == []


def test_a_dataset_that_loses_its_placement_keeps_its_violations(cat: Catalog, sql: Any) -> None:
    apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=None)
    cat.register_version("ckpt/llama-70b", "a", "v1", fake_digest("d"))
    cat.set_replica_state(
        "ckpt/llama-70b", "a", "v1", "us-east", "completed", digest=fake_digest("d")
    )  # a violation
    from controlplane.catalog.audit import residency_violations

    unplaced = EXAMPLE.replace('datasets: ["ckpt/*"]', 'datasets: ["ckpt2/*"]').replace(
        "name: ckpt/llama-70b", "name: ckpt2/llama-70b"
    )
    assert unplaced != EXAMPLE
    apply_policy(cat, policy_of(unplaced), source="b", publisher=None)
    with sql(cat.url) as s:  # no policy places it now; the copy is still out of place
        assert [v["region"] for v in residency_violations(s)] == ["us-east"]


def test_concurrent_applies_never_interleave(cat: Catalog, sql: Any) -> None:
    """Two applies at once: each either commits on top of the other or is refused."""
    variants = [EXAMPLE.replace("rpo: 30s", f"rpo: {n}s") for n in (31, 32, 33, 34)]
    outcomes: list[object] = []

    def run(text: str) -> None:
        catalog = open_catalog(cat.url)
        try:
            outcomes.append(apply_policy(catalog, policy_of(text), source="t", publisher=None))
        except ConflictError as exc:
            outcomes.append(exc)
        finally:
            catalog.close()

    threads = [threading.Thread(target=run, args=(v,)) for v in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(outcomes) == 4
    revs = revisions(cat, sql)
    # Each revision's parent is the one before it: a chain, never two on one head.
    assert [parent for _, parent, _, _ in revs] == [0] + [rid for rid, *_ in revs[:-1]]
    applied = [o for o in outcomes if not isinstance(o, CatalogConflictError)]
    assert len(applied) == len(revs) >= 1
    # The catalog holds exactly what the last revision says.
    with sql(cat.url) as s:
        head = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
        assert head is not None
        last_rpo = head.document["policies"]["web-corpus"]["rpo"]
    assert plan_changes(cat, policy_of(EXAMPLE.replace("rpo: 30s", f"rpo: {last_rpo}"))) == []


@pytest.mark.integration
def test_apply_publishes_to_etcd(cat: Catalog, private_etcd: str) -> None:
    host, port = private_etcd.rsplit(":", 1)
    publisher = EtcdPolicyPublisher([(host, int(port))])
    result = apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=publisher)
    assert result.published

    async def read() -> dict[str, object]:
        client = Etcd3Client([private_etcd])
        await client.connect()
        try:
            assert client.kv is not None
            resp = await client.kv.get(POLICY_KEY)
            return json.loads(resp.kvs[0].value)  # type: ignore[no-any-return]
        finally:
            await client.close()

    value = asyncio.run(read())
    assert value["digest"] == result.digest
    assert value["revision"] == result.revision
    assert str(value["applied_at"]).endswith("Z")


def test_unreachable_etcd_keeps_revision_and_says_so(cat: Catalog, sql: Any) -> None:
    publisher = EtcdPolicyPublisher([("127.0.0.1", 1)], timeout_s=1.0)
    with pytest.raises(UnavailableError, match="re-run `meridian policy apply`"):
        apply_policy(cat, policy_of(EXAMPLE), source="a", publisher=publisher)
    assert len(revisions(cat, sql)) == 1


def test_spec_example_file_compiles() -> None:
    policy, problems = compile_files([DATA / "example.yaml"])
    assert problems == [] and policy is not None


def test_a_unique_parent_clash_is_reported_as_another_apply(cat: Catalog) -> None:
    """Two applies on one head: the loser's error says so (not a generic refused write)."""
    from sqlalchemy.exc import IntegrityError

    from controlplane.catalog.records import CatalogState, RevisionDraft

    def clash(_state: CatalogState) -> RevisionDraft:
        raise IntegrityError("INSERT INTO policy_revisions", {}, Exception("unique parent"))

    with pytest.raises(CatalogConflictError, match="another `policy apply` committed first"):
        cat.apply_revision(clash, source="t", applied_by="t")


def test_another_integrity_error_is_not_taken_for_a_racing_apply(cat: Catalog) -> None:
    from sqlalchemy.exc import IntegrityError

    from controlplane.catalog.records import CatalogState, RevisionDraft

    def broken(_state: CatalogState) -> RevisionDraft:
        raise IntegrityError("INSERT INTO placements", {}, Exception("NOT NULL: home"))

    with pytest.raises(Exception) as info:
        cat.apply_revision(broken, source="t", applied_by="t")
    assert "another `policy apply`" not in str(info.value)
    assert "NOT NULL: home" in str(info.value)
