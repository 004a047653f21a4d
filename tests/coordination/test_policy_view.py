"""The compiled policy in etcd: what `policy apply` publishes and what `PolicyView` reads."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from fakes.coordination import ManualClock, MemoryCoordination
from harness.controllers import policy_yaml, run_cli
from harness.ports import free_port

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.coordination.protocols import keys
from controlplane.coordination.timeutil import utcnow
from controlplane.domain.placement import Placement
from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError
from controlplane.policy.compiler import PolicySet, compile_files
from controlplane.policy.current import CompiledPolicy, NoPolicyError, PolicyView
from controlplane.policy.publisher import CoordinationPolicyPublisher
from controlplane.ports.coordination import WatchEvent
from controlplane.stack.etcd import EtcdCluster

from .helpers import wait_until

EXAMPLE = Path(__file__).parents[1] / "policy" / "data" / "example.yaml"


def example() -> PolicySet:
    policy, problems = compile_files([EXAMPLE])
    assert policy is not None, problems
    return policy


def compiled(revision: int = 1, *, deletes: str = "replicate", lineage: str = "") -> CompiledPolicy:
    policy = example()
    placements = {
        name: dataclasses.replace(p, deletes=deletes) for name, p in policy.placements({}).items()
    }
    return CompiledPolicy.build(
        policy,
        placements,
        digest=f"{policy.digest[:8]}-{revision}",
        revision=revision,
        applied_at=utcnow(),
        lineage=lineage,
    )


# -- the value -------------------------------------------------------------------------------
def test_the_published_value_round_trips_whole() -> None:
    before = compiled(7)
    after = CompiledPolicy.from_json(before.to_json(), etcd_revision=42)
    assert after == before
    assert after.etcd_revision == 42
    doc = json.loads(before.to_json())
    assert set(doc) == {
        "schema",
        "digest",
        "revision",
        "lineage",
        "applied_at",
        "policy",
        "placements",
    }
    assert doc["policy"]["regions"]["us-east"] == {"jurisdiction": "US"}
    assert doc["placements"]["ckpt/llama-70b"]["labels"] == {"team": "pretrain"}


def test_typed_questions_are_answered_from_the_snapshot() -> None:
    policy = CompiledPolicy.from_json(compiled().to_json())
    assert policy.jurisdiction("us-east") == "US"
    with pytest.raises(NotFoundError, match="'mars-1' is not in the applied topology"):
        policy.jurisdiction("mars-1")
    assert policy.rtt_s("eu-west", "eu-central") == pytest.approx(0.012)
    assert policy.rtt_s("eu-central", "us-east") is None
    assert policy.rtt_s("us-east", "us-east") == 0.0
    assert policy.nearest("eu-west", ["us-east", "eu-central"]) == ["eu-central", "us-east"]
    assert [p.dataset for p in policy.critical_homed_in("eu-west")] == ["ckpt/llama-70b"]
    assert policy.critical_homed_in("us-east") == []


def test_a_dataset_first_seen_after_the_apply_is_placed_by_the_published_rules() -> None:
    policy = CompiledPolicy.from_json(compiled().to_json())
    new = policy.placement("ckpt/gpt-9", {"team": "pretrain"})
    assert new is not None
    assert (new.policy, new.dataset_class, new.home, new.replicas, new.residency) == (
        "checkpoints",
        "critical",
        "eu-west",
        ("eu-central",),
        ("EU",),
    )
    assert policy.placement("ckpt/gpt-9") is None  # the selector wants team=pretrain
    shard = policy.placement("corpus/shard-1")
    assert shard is not None
    # replicas.count: 2, the nearest allowed regions to us-east by RTT (unknown last).
    assert (shard.dataset_class, shard.home, shard.replicas) == (
        "standard",
        "us-east",
        ("eu-west", "eu-central"),
    )
    assert policy.placement("logs/x") is None
    # A known dataset keeps its published placement, whatever labels are asked with.
    known = policy.placement("ckpt/llama-70b", {"team": "other"})
    assert known is not None and known.home == "eu-west"


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda d: b"{not json", "is not JSON"),
        (lambda d: [1, 2], "the value is not an object"),
        (lambda d: {**d, "schema": 2}, "schema 2 is not 1"),
        (lambda d: {k: v for k, v in d.items() if k != "digest"}, "digest is missing"),
        (lambda d: {**d, "revision": -1}, "revision is not a non-negative integer"),
        (lambda d: {**d, "applied_at": "yesterday"}, "applied_at 'yesterday' is not"),
        (
            lambda d: {**d, "placements": {"a": {**_any_placement(d), "class": "gold"}}},
            "placements.a: .*field 'class' must be one of critical, standard, got 'gold'",
        ),
        (
            lambda d: {**d, "placements": {"a": {**_any_placement(d), "replicas": "eu-west"}}},
            "placements.a: .*field 'replicas' must be a list of names",
        ),
        (
            lambda d: {**d, "policy": {**d["policy"], "links": {"a<->a": {}}}},
            "malformed link 'a<->a'",
        ),
    ],
)
def test_a_malformed_value_is_refused_naming_the_field(mangle: object, message: str) -> None:
    doc = json.loads(compiled().to_json())
    assert callable(mangle)
    out = mangle(doc)
    raw = out if isinstance(out, bytes) else json.dumps(out).encode()
    with pytest.raises(InvalidInputError, match=message) as info:
        CompiledPolicy.from_json(raw)
    assert str(info.value).startswith(keys.POLICY_CURRENT)


def _any_placement(doc: dict[str, object]) -> dict[str, object]:
    placements = doc["placements"]
    assert isinstance(placements, dict)
    first = next(iter(placements.values()))
    assert isinstance(first, dict)
    return first


def test_a_policy_too_large_for_etcd_is_refused_before_publishing() -> None:
    base = compiled()
    one = next(iter(base.placements.values()))
    many = {f"ckpt/{i:06d}": dataclasses.replace(one, dataset=f"ckpt/{i:06d}") for i in range(9000)}
    with pytest.raises(InvalidInputError, match="more than etcd accepts"):
        dataclasses.replace(base, placements=many).to_json()


# -- the view, against real etcd -------------------------------------------------------------------
@pytest.fixture
async def view(coord: EtcdCoordination) -> AsyncIterator[PolicyView]:
    async with PolicyView(coord) as v:
        yield v


def _at(revision: int) -> Callable[[CompiledPolicy | None], bool]:
    return lambda p: p is not None and p.revision == revision


@pytest.mark.integration
async def test_the_view_follows_each_publish_and_fails_closed_without_one(
    coord: EtcdCoordination, view: PolicyView
) -> None:
    assert view.current is None
    with pytest.raises(NoPolicyError, match="no policy has been applied") as info:
        view.require()
    assert info.value.retriable
    publisher = CoordinationPolicyPublisher(coord)
    await publisher.publish(compiled(1))
    first = await view.wait_for(_at(1), 5)
    assert first is not None and first.etcd_revision > 0
    await publisher.publish(compiled(2, deletes="retain"))
    second = await view.wait_for(_at(2), 5)
    assert second is not None and second is view.require()
    assert second.placements["ckpt/llama-70b"].deletes == "retain"
    # The old snapshot is untouched: a reader holding it never sees a mix.
    assert first.revision == 1 and first.placements["ckpt/llama-70b"].deletes == "replicate"

    await coord.put(keys.POLICY_CURRENT, b"{not json")
    await view.wait_for(lambda p: p is None, 5)
    with pytest.raises(NoPolicyError, match="the published policy cannot be read"):
        view.require()
    await publisher.publish(compiled(3))
    await view.wait_for(_at(3), 5)
    await coord.delete(keys.POLICY_CURRENT)
    await view.wait_for(lambda p: p is None, 5)
    with pytest.raises(NoPolicyError, match="no policy has been applied"):
        view.require()


@pytest.mark.integration
async def test_publishing_the_value_etcd_holds_writes_nothing(coord: EtcdCoordination) -> None:
    """A repeated apply with no change must not bump the key's revision: that would void
    every automatic failover decided on it meanwhile (failover.automatic_guards)."""
    publisher = CoordinationPolicyPublisher(coord)
    head = compiled(4)  # a repeated apply publishes the catalog's head as it was
    await publisher.publish(head)
    first = await coord.get(keys.POLICY_CURRENT)
    await publisher.publish(head)
    again = await coord.get(keys.POLICY_CURRENT)
    assert first is not None and again is not None
    assert again.mod_revision == first.mod_revision
    await publisher.publish(compiled(5))  # a change is still written
    changed = await coord.get(keys.POLICY_CURRENT)
    assert changed is not None and changed.mod_revision > first.mod_revision


@pytest.mark.integration
async def test_an_older_revision_published_late_replaces_nothing(
    coord: EtcdCoordination, view: PolicyView
) -> None:
    """Two applies race: revision 6 is published, then 5's late write arrives. The
    publisher leaves 6 in etcd, and a view that sees 5 written anyway (an older
    Meridian, a hand edit) keeps 6; another catalog's lineage is not ordered against."""
    publisher = CoordinationPolicyPublisher(coord)
    await publisher.publish(compiled(6, lineage="cat-a"))
    await view.wait_for(_at(6), 5)
    await publisher.publish(compiled(5, lineage="cat-a"))
    held = await coord.get(keys.POLICY_CURRENT)
    assert held is not None and CompiledPolicy.from_json(held.value).revision == 6
    written = await coord.put(keys.POLICY_CURRENT, compiled(5, lineage="cat-a").to_json())

    async def read_by_view() -> bool:
        return view.decided()[1] == written

    # The view keeps 6 yet knows the key it read: a move guarded by it is not refused
    # forever for an apply the view chose to ignore (failover.automatic_guards).
    assert await wait_until(read_by_view, 5)
    kept, _ = view.decided()
    assert kept is not None and kept.revision == 6
    await publisher.publish(compiled(7, lineage="cat-a"))  # a later write, to wait on
    assert (await view.wait_for(_at(7), 5)) is not None  # 5 never showed in between
    await publisher.publish(compiled(1, lineage="cat-b"))  # a fresh catalog
    assert (await view.wait_for(_at(1), 5)) is not None


@pytest.mark.integration
async def test_the_view_keeps_its_snapshot_while_etcd_is_unreachable_and_catches_up(
    coord: EtcdCoordination, etcd3: EtcdCluster, toxiproxy_url: str
) -> None:
    toxi = ToxiproxyClient(toxiproxy_url, timeout_s=5)
    port = free_port()
    listen, proxy = f"127.0.0.1:{port}", f"policy-view-{port}"
    await asyncio.to_thread(toxi.create_proxy, proxy, listen, etcd3.endpoints[0])
    publisher = CoordinationPolicyPublisher(coord)
    cut = EtcdCoordination([listen], timeout_s=1)
    try:  # from the proxy's creation on: whatever fails, the proxy is deleted
        await publisher.publish(compiled(1))
        await cut.connect()
        async with PolicyView(cut, retry_max_s=0.5) as view:
            assert view.require().revision == 1
            await asyncio.to_thread(toxi.disable, proxy)
            await publisher.publish(compiled(2))
            with pytest.raises(Exception, match="did not reach"):
                await view.wait_for(_at(2), 3)
            assert view.require().revision == 1  # still the last policy it read
            await asyncio.to_thread(toxi.enable, proxy)
            await view.wait_for(_at(2), 15)
    finally:
        await cut.close()
        await asyncio.to_thread(toxi.delete_proxy, proxy)


@pytest.mark.integration
async def test_policy_apply_publishes_the_compiled_policy_the_view_reads(
    coord: EtcdCoordination, etcd3: EtcdCluster, tmp_path: Path
) -> None:
    env = {
        "MERIDIAN_CATALOG": f"sqlite:///{tmp_path / 'catalog.db'}",
        "MERIDIAN_ETCD": ",".join(etcd3.endpoints),
        "MERIDIAN_HOME": str(tmp_path / "home"),
    }
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(3), encoding="utf-8")
    assert run_cli(["db", "upgrade"], env).returncode == 0
    done = run_cli(["policy", "apply", str(policy), "--yes", "-o", "json"], env)
    assert done.returncode == 0, done.stderr
    applied = json.loads(done.stdout)
    assert applied["published"] is True
    async with PolicyView(coord) as view:
        current = view.require()
    assert (current.digest, current.revision) == (applied["digest"], applied["revision"])
    assert sorted(current.placements) == ["ckpt/d000", "ckpt/d001", "ckpt/d002", "pinned/p0"]
    assert current.placements["pinned/p0"] == Placement(
        dataset="pinned/p0",
        policy="pinned",
        dataset_class="critical",
        home="eu-west",
        replicas=("eu-central", "eu-north"),
        residency=("EU",),
        rpo_s=0.0,
        ack="quorum",
        failover_mode="manual",
        failover_order=("eu-central", "eu-north"),
        labels={},
    )
    assert current.jurisdiction("us-east") == "US"
    later = current.placement("ckpt/d999")  # not declared: placed by the rules
    assert later is not None and later.policy == "checkpoints"


class FlakyWatch:
    """The real adapter, except that its first `failures` watches fail at once, as a
    watch does when etcd drops the stream (the port's UnavailableError)."""

    def __init__(self, coord: EtcdCoordination, failures: int) -> None:
        self._coord = coord
        self.failures = failures
        self.watches = 0
        self.failed = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._coord, name)

    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        if self.watches <= self.failures:
            self.failed.set()
            raise UnavailableError("the etcd watch on the policy failed: UNAVAILABLE (test)")
        async for ev in self._coord.watch(key, prefix=prefix, start_revision=start_revision):
            yield ev


@pytest.mark.integration
async def test_a_failed_watch_is_retried_from_a_fresh_read_keeping_the_snapshot(
    coord: EtcdCoordination,
) -> None:
    publisher = CoordinationPolicyPublisher(coord)
    await publisher.publish(compiled(1))
    flaky = FlakyWatch(coord, failures=3)
    async with PolicyView(flaky, retry_initial_s=0.05, retry_max_s=0.2) as view:  # type: ignore[arg-type]
        await asyncio.wait_for(flaky.failed.wait(), 5)
        assert view.require().revision == 1  # the failure did not drop the snapshot
        await publisher.publish(compiled(2))  # while the watch is failing
        await view.wait_for(_at(2), 10)
        assert view.require().revision == 2

        async def watching() -> bool:
            return flaky.watches > flaky.failures

        assert await wait_until(watching, 10)  # three failures, then a watch that works
        await publisher.publish(compiled(3))
        await view.wait_for(_at(3), 5)


async def test_the_published_revision_is_read_from_etcd_itself() -> None:
    coord = MemoryCoordination(ManualClock())
    view = PolicyView(coord)
    assert await view.published_revision() == 0  # nothing published
    await CoordinationPolicyPublisher(coord).publish(compiled(4))
    assert await view.published_revision() == 4  # read directly: the view never started
    coord.set_unavailable(True)
    assert await view.published_revision() is None
