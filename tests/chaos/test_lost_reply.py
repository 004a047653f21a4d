"""Issue 14's open question: a committed move whose transaction reply was lost.

A controller's failover transaction commits in etcd but its reply never arrives
(a timeout: the WAN dropped it). The mover cannot know it won, so it writes no
journal row; its retry re-reads and finds nothing to move. What must still hold:
the move is journaled exactly once (the new owner's journal backfill rebuilds the
row from the owner record after `journal_grace_s`), the mover's controller knows
it owns the dataset, and no other region claims it. Real etcd (the chaos suite's
private stack); the lost reply is injected at the coordination port, the only
place a test can lose exactly one reply.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest
from coordination.helpers import REGIONS, critical, publish_world, wait_until
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements

from chaos.stack import PrivateStack
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import OperationTimeoutError
from controlplane.ports.coordination import Compare, Op, Put, TxnResult

pytestmark = pytest.mark.integration

DATASETS = [f"ckpt/m{i}" for i in range(3)]


class LostReplyCoord(EtcdCoordination):
    """Commits the first move transaction (an owner record with move facts), then
    raises the timeout a lost reply gives."""

    lost: list[str]

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        res = await super().txn(compares, success, failure)
        moves = [
            op.key
            for op in success
            if isinstance(op, Put) and op.key.startswith(keys.OWNERS) and b'"kind"' in op.value
        ]
        if res.succeeded and moves and not self.lost:
            self.lost.append(moves[0])
            raise OperationTimeoutError(f"the reply of the move of {moves[0]} was lost (test)")
        return res


@contextlib.asynccontextmanager
async def controller(
    endpoints: list[str],
    world: tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp],
    region: str,
    coord: EtcdCoordination,
) -> AsyncIterator[RegionController]:
    source, journal, probe = world
    await coord.connect()
    await publish_world(coord, source)
    config = ControllerConfig(
        region=region,
        controller_id=f"{region}-lost-reply",
        lease_ttl_s=2,
        journal_grace_s=1.0,
        journal_check_interval_s=0.5,
    )
    try:
        async with RegionController(coord, journal, probe, config) as ctl:
            yield ctl
    finally:
        await coord.close()


async def test_a_move_whose_reply_was_lost_is_journaled_once_and_owned(
    private_stack: PrivateStack,
) -> None:
    endpoints = private_stack.etcd_endpoints
    world = (
        MemoryPlacements(REGIONS, [critical(d) for d in DATASETS]),
        MemoryJournal(),
        MemoryCatchUp(),
    )
    _, journal, _ = world
    lossy = LostReplyCoord(endpoints, timeout_s=3)
    lossy.lost = []
    async with EtcdCoordination(endpoints, timeout_s=3) as admin:
        await admin.delete("/meridian/", prefix=True)
        own = Ownership(admin)

        async def all_in(region: str) -> bool:
            owners = await own.list()
            return all(d in owners and owners[d].region == region for d in DATASETS)

        async with controller(endpoints, world, "eu-central", lossy) as central:
            async with controller(
                endpoints, world, "eu-west", EtcdCoordination(endpoints, timeout_s=3)
            ):
                assert await wait_until(lambda: all_in("eu-west"), 15)
            # eu-west stopped (its lease revoked): eu-central fails every dataset over,
            # and the first move's reply is lost.
            assert await wait_until(lambda: all_in("eu-central"), 15)
            assert lossy.lost, "no move transaction went through the lossy port"
            lost_ds = lossy.lost[0].removeprefix(keys.OWNERS)

            async def journaled() -> bool:
                return {e.dataset for e in journal.since(None)} >= set(DATASETS)

            async def knows() -> bool:
                return set(central.owned) >= set(DATASETS)

            assert await wait_until(journaled, 15), (
                f"the move of {lost_ds} (reply lost) was never journaled: "
                f"{[e.id for e in journal.since(None)]}"
            )
            assert await wait_until(knows, 10), (
                f"eu-central owns {lost_ds} in etcd but its controller does not know: "
                f"{sorted(central.owned)}"
            )
            owners = await own.list()
        rows = journal.since(None)
        ids = [e.id for e in rows]
        assert len(ids) == len(set(ids)) == len(DATASETS), ids  # once per move
        for e in rows:
            assert (e.from_region, e.to_region, e.kind) == ("eu-west", "eu-central", "automatic")
            assert e.epoch == owners[e.dataset].epoch
        lost_row = next(e for e in rows if e.dataset == lost_ds)
        assert lost_row.details.get("backfilled") is True  # rebuilt: its mover never knew
        await admin.delete("/meridian/", prefix=True)
