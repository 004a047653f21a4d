"""An automatic move is guarded by the policy it was decided under, against real etcd:
an apply that lands between the decision and the move's transaction voids the move."""

from __future__ import annotations

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.orchestration.decide import plan_moves
from controlplane.coordination.orchestration.failover import apply_move, automatic_guards
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.coordination.protocols.view import read_view

from .helpers import REGIONS, compiled_world, critical

pytestmark = pytest.mark.integration

JURISDICTIONS = {r.name: r.jurisdiction for r in REGIONS}


async def test_a_move_decided_before_an_apply_that_forbids_its_target_moves_nothing(
    coord: EtcdCoordination,
) -> None:
    from controlplane.policy.publisher import CoordinationPolicyPublisher

    publisher = CoordinationPolicyPublisher(coord)
    before = MemoryPlacements(REGIONS, [critical("ckpt/g")])
    await publisher.publish(compiled_world(before, revision=1))
    decided_under = await coord.get(keys.POLICY_CURRENT)
    assert decided_under is not None
    own = Ownership(coord)
    await own.claim("ckpt/g", "eu-west", expect_epoch=0, reason="first claim", actor="t")
    lease = await coord.grant(30)
    await coord.put(keys.alive("eu-central"), b"{}", lease=lease.id)  # eu-west: no lease
    view = await read_view(coord)
    plan = plan_moves(view, before.placements(), JURISDICTIONS, source="eu-west", automatic=True)
    [move] = plan.moves
    assert move.to_region == "eu-central"
    # The apply the controller's view has not seen yet: eu-central no longer holds it.
    after = MemoryPlacements(REGIONS, [critical("ckpt/g", order=("eu-north",))])
    await publisher.publish(compiled_world(after, revision=2))
    journal = MemoryJournal()

    async def move_under(policy_revision: int) -> object:
        return await apply_move(
            own,
            move,
            guards=automatic_guards(move, view, policy_revision),
            kind="automatic",
            reason="lease expired",
            actor="t",
            journal=journal,
            probe=MemoryCatchUp(),
            detected_at=None,
        )

    assert await move_under(decided_under.mod_revision) is None
    owner = await own.get("ckpt/g")
    assert owner is not None and owner.region == "eu-west"
    assert journal.since(None) == []
    # The guard is the policy's revision only: under the revision now published, the same
    # transaction goes through (the sweep would have planned again, to eu-north).
    now = await coord.get(keys.POLICY_CURRENT)
    assert now is not None
    assert await move_under(now.mod_revision) is not None
    owner = await own.get("ckpt/g")
    assert owner is not None and owner.region == "eu-central"
