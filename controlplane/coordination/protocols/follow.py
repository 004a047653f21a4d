"""Keep a `FencedResource` in step with etcd: epochs and handover marks as they change.

Agents and the replicator run `follow_ownership` beside their resource. It reads
every owner once, then watches `/meridian/owners/` and `/meridian/handover/` from
the revision of that read, so nothing between the read and the watch is missed:

* an owner write raises the dataset's epoch (a stale writer is then refused);
* a handover mark freezes the dataset at its epoch (writes refused, retriable);
* the mark's removal (move completed or aborted) unfreezes it at the epoch then
  current, re-read from etcd.
"""

from __future__ import annotations

import asyncio

from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.ownership import Ownership, decode_handover
from controlplane.ports.coordination import Coordination, EventType, Get


async def sync_once(coord: Coordination, resource: FencedResource) -> int:
    """Observe every current owner and handover mark; returns the revision read at."""
    res = await coord.txn([], [Get(keys.OWNERS, prefix=True), Get(keys.HANDOVER, prefix=True)])
    owners, marks = res.reads
    frozen = {kv.key.removeprefix(keys.HANDOVER) for kv in marks}
    for kv in owners:
        ds = kv.key.removeprefix(keys.OWNERS)
        resource.observe(ds, kv.mod_revision, handing_over=ds in frozen, revision=res.revision)
    return res.revision


async def follow_ownership(
    coord: Coordination, resource: FencedResource, ready: asyncio.Event | None = None
) -> None:
    """Run until cancelled (see the module docstring); sets `ready` after the first read."""
    start = await sync_once(coord, resource) + 1
    if ready is not None:
        ready.set()
    own = Ownership(coord)

    async def owners() -> None:
        async for ev in coord.watch(keys.OWNERS, prefix=True, start_revision=start):
            if ev.type is EventType.PUT:
                resource.observe(ev.kv.key.removeprefix(keys.OWNERS), ev.kv.mod_revision)

    async def marks() -> None:
        async for ev in coord.watch(keys.HANDOVER, prefix=True, start_revision=start):
            ds = ev.kv.key.removeprefix(keys.HANDOVER)
            if ev.type is EventType.PUT:
                resource.observe(
                    ds, decode_handover(ev.kv).epoch, handing_over=True, revision=ev.revision
                )
            else:
                owner, revision = await own.get_as_of(ds)
                if owner is not None:
                    # Read after the deletion, as of a revision at least as new.
                    resource.observe(
                        ds,
                        owner.epoch,
                        handing_over=owner.handing_over_to is not None,
                        revision=revision,
                    )

    async with asyncio.TaskGroup() as tg:
        tg.create_task(owners())
        tg.create_task(marks())
