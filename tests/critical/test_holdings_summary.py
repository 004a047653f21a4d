"""What an agent publishes of a critical dataset (agents/daemon/holdings.py), on a real
store: the summary changes with every commit and only then (the publisher's cheap
change counter), equal listings give equal digests, and a write whose ack failed is
marked while it is the newest of its object."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.daemon.holdings import UnackedWrites, summarise
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore
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
