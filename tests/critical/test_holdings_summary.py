"""What an agent publishes of a critical dataset (agents/daemon/holdings.py), on a real
store: the summary changes with every commit and only then (the publisher's cheap
change counter), equal listings give equal digests, and a write whose ack failed is
marked while it is the newest of its object."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes.admission import compiled
from fakes.coordination import MemoryCoordination
from placements import critical
from waiting import until

from agents.daemon import holdings
from agents.daemon.holdings import HoldingsPublisher, UnackedWrites, summarise
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.holdings import listing_digest
from controlplane.domain.hlc import HybridClock
from controlplane.errors import UnavailableError


def test_the_summary_follows_commits_and_tells_listings_apart(tmp_path: Path) -> None:
    with (
        ObjectStore(tmp_path / "a", clock=HybridClock("eu-west")) as a,
        ObjectStore(tmp_path / "b", clock=HybridClock("eu-central")) as b,
    ):
        assert a.change_seq() == 0 and a.dataset_names() == []
        put = a.put("ckpt/x", "k1", [b"one"])
        seq = a.change_seq()
        assert seq > 0 and a.dataset_names() == ["ckpt/x"]
        assert a.change_seq() == seq  # a read changes nothing
        objects, newest, digest, heads = summarise(a, "ckpt/x")
        assert (objects, newest, heads) == (1, put.hlc.text, {"k1": put.hlc.text})
        b.apply("ckpt/x", "k1", put, [b"one"])
        assert summarise(b, "ckpt/x")[2] == digest  # the same listing, the same digest
        a.delete("ckpt/x", "k1")
        assert a.change_seq() > seq
        after = summarise(a, "ckpt/x")
        assert after[0] == 1 and after[2] != digest  # a tombstone is listed too


class _Refusing:
    async def replicate(self, write: CommittedWrite) -> tuple[str, ...]:
        raise UnavailableError("not acked")


def test_a_write_whose_ack_failed_is_marked_while_it_is_the_newest(tmp_path: Path) -> None:
    with ObjectStore(tmp_path / "a", clock=HybridClock("eu-west")) as a:
        put = a.put("ckpt/x", "k", [b"unacked"])
        tracker = UnackedWrites(_Refusing())
        write = CommittedWrite(None, "ckpt/x", key="k", version=put)  # type: ignore[arg-type]
        with pytest.raises(UnavailableError):
            asyncio.run(tracker.replicate(write))
        heads = summarise(a, "ckpt/x")[3]
        assert tracker.still_newest("ckpt/x", heads) == [f"k@{put.hlc}"]
        a.put("ckpt/x", "k", [b"rewritten"])  # superseded: the mark is forgotten
        assert tracker.still_newest("ckpt/x", summarise(a, "ckpt/x")[3]) == []


def test_the_summary_pages_through_the_stored_text_as_the_listing_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(holdings, "_PAGE", 2)  # five objects: three pages
    with ObjectStore(tmp_path / "a", clock=HybridClock("eu-west")) as a:
        for key in ("k1", "k2", "k3", "k4", "k5"):
            a.put("ckpt/x", key, [key.encode()])
        a.put("ckpt/x", "k2", [b"newer"])  # two versions: the newest is listed
        a.delete("ckpt/x", "k4")  # a tombstone is listed too
        a.put("ckpt/y", "k1", [b"another dataset"])
        listed = a.list_objects("ckpt/x", include_deleted=True).items
        entries = [
            (s.key, s.version.hlc.text, "" if s.version.digest is None else s.version.digest.text)
            for s in listed
        ]
        objects, newest, digest, heads = summarise(a, "ckpt/x")
        assert objects == 5 and heads == {k: h for k, h, _ in entries}
        assert newest == max(h for _, h, _ in entries)
        assert digest == listing_digest(entries)


async def test_the_publisher_paces_its_summaries_by_their_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([10.0, 10.005, 20.0, 25.0])  # CPU clock: a summary of 5 ms, then 5 s
    monkeypatch.setattr(holdings.time, "thread_time", lambda: next(readings))
    placement = critical(
        "ckpt/x", replicas=("eu-central",), policy="checkpoints", failover_mode="automatic"
    )
    policy = compiled({"eu-west": "EU", "eu-central": "EU"}, [placement])
    with ObjectStore(tmp_path / "a", clock=HybridClock("eu-west")) as a:
        a.put("ckpt/x", "k", [b"one"])
        publisher = HoldingsPublisher(
            MemoryCoordination(),
            a,
            region="eu-west",
            agent_id="a1",
            endpoint="127.0.0.1:1",
            policy=lambda: policy,
            fence=FencedResource(),
            lease_ttl_s=5,
            interval_s=60.0,  # the loop's first pass, then only the passes made here
        )
        async with publisher:
            await until(lambda: publisher.writes == 1, 5.0, "the first record")
            assert publisher.pause_s == pytest.approx(holdings.PACE_FACTOR * 0.005)
            assert publisher.pause_s < holdings.PACE_MAX_S  # (not capped)
            a.put("ckpt/x", "k", [b"two"])  # a changed store: summarised again
            await publisher.publish_now()
            assert publisher.writes == 2
            assert publisher.pause_s == holdings.PACE_MAX_S  # 5 s of CPU: capped
