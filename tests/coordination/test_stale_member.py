"""A transaction of compares alone is judged on current values, never on a lagging
member's (etcd answers a transaction of no operation serializably, from the member
asked: the adapter adds one linearizable read so that it goes through the leader).

The lagging member is made by hand: paused while the others commit a write, then left
alone (the two others paused) so that it holds the old value and cannot reach a leader.
A serializable answer from it would judge the compare on the old value; a linearizable
one cannot be had, so the adapter must fail rather than answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from waiting import until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import OperationTimeoutError, UnavailableError
from controlplane.ports.coordination import Cmp, Compare, Target
from controlplane.stack.etcd import EtcdCluster, EtcdMember

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY = "/meridian/test/stale-compare"


async def test_compare_only_txn_is_never_judged_by_a_lagging_member(
    coord: EtcdCoordination, etcd3: EtcdCluster
) -> None:
    # An earlier test may have left an election running: wait for a leader (as 1 + its
    # index, since until() waits for a true value).
    leader = await until(lambda: _leader(etcd3), 30, "a leader of the cluster") - 1
    lagging = etcd3.members[(leader + 1) % 3]
    others = [m for m in etcd3.members if m is not lagging]
    await coord.put(KEY, b"old")
    alone = EtcdCoordination([lagging.endpoint], timeout_s=2)
    quorum = EtcdCoordination([m.endpoint for m in others], timeout_s=5)
    await alone.connect()
    await quorum.connect()
    try:
        # It holds "old": a compare on it is judged true while it is in step.
        assert (await alone.txn([Compare(KEY, Target.VALUE, Cmp.EQUAL, b"old")], [])).succeeded
        with _paused([lagging]):
            await quorum.put(KEY, b"new")  # the two others commit it without the lagging one
            with _paused(others):
                lagging.resume()
                # Served serializably, the lagging member would answer "old still
                # stands" (succeeded); it has no leader to confirm anything with.
                with pytest.raises((OperationTimeoutError, UnavailableError)):
                    await alone.txn([Compare(KEY, Target.VALUE, Cmp.EQUAL, b"old")], [])
        await asyncio.to_thread(etcd3.wait_healthy, 30)
        # In step again (once a leader answers it): the compare is judged on the new value.
        assert await until(lambda: _judged(alone, b"new"), 20, "the member in step again")
    finally:
        for member in etcd3.members:
            member.resume()
        await alone.close()
        await quorum.close()
        await asyncio.to_thread(etcd3.wait_healthy, 30)


async def _leader(cluster: EtcdCluster) -> int | None:
    index = await asyncio.to_thread(cluster.leader_index)
    return None if index is None else index + 1


async def _judged(coord: EtcdCoordination, value: bytes) -> bool:
    try:
        return (await coord.txn([Compare(KEY, Target.VALUE, Cmp.EQUAL, value)], [])).succeeded
    except (OperationTimeoutError, UnavailableError):  # an election after the pauses
        return False


@contextmanager
def _paused(members: list[EtcdMember]) -> Iterator[None]:
    for member in members:
        member.pause()
    try:
        yield
    finally:
        for member in members:
            member.resume()
