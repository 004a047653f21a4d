"""`MembershipWatch`: the live agents of one region, from their registrations in etcd.

It reads `/meridian/agents/<region>/` once, then watches the prefix from that
revision, so a registration that comes (a join), changes (usage, weight, `leaving`)
or goes (SIGTERM revokes the lease; SIGKILL lets it lapse within the TTL) gives a
new immutable `Members` snapshot. Readers take `current` (never half an update);
`changed()` waits for the next snapshot. When etcd goes away the last snapshot is
kept (agents keep serving what they own) and the prefix is read again once it
answers, so nothing missed during the gap is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agents.placement.members import Member, Members
from controlplane.coordination.protocols import keys
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination, EventType

log = get_logger("meridian.agent.placement")


class MembershipWatch(Lifecycle):
    """See the module docstring. `configured_r` is the region's copy count setting
    (None: the default, 2 where the region has two or more agents)."""

    def __init__(
        self,
        coord: Coordination,
        region: str,
        *,
        configured_r: int | None = None,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
    ) -> None:
        self.coord = coord
        self.region = region
        self.prefix = keys.agents_of(region)
        self._r = configured_r
        self._retry = (retry_initial_s, retry_max_s)
        self.current = Members(region, {}, 0, configured_r)
        # Whole reads of the prefix (the first, then one after each broken watch): the
        # states between two of them are not seen one by one (agents/rebalance).
        self.reads = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[Members], None]] = []

    def on_change(self, listener: Callable[[Members], None]) -> None:
        """Call `listener` (on the loop, must not block) with each new snapshot."""
        self._listeners.append(listener)

    async def changed(self) -> Members:
        """The next snapshot after the current one."""
        event = self._changed
        await event.wait()
        return self.current

    async def _do_start(self) -> None:
        await self._read()
        self._task = asyncio.create_task(self._follow(), name=f"membership-{self.region}")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _read(self) -> None:
        kvs, revision = await self.coord.get_prefix(self.prefix)
        found: dict[str, Member] = {}
        for kv in kvs:
            member = Member.from_registration(kv.value, kv.lease)
            if member is not None:
                found[member.agent_id] = member
        self.reads += 1
        self._publish(found, revision)

    async def _follow(self) -> None:
        delay = self._retry[0]
        while True:
            try:
                await self._watch(self.current.revision + 1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd away or compacted: read again
                log.warning("membership_watch_retry", region=self.region, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry[1])
                try:
                    await self._read()
                    delay = self._retry[0]
                except Exception as again:  # noqa: BLE001 - the next round retries
                    log.warning("membership_read_failed", region=self.region, error=str(again))

    async def _watch(self, start: int) -> None:
        async for ev in self.coord.watch(self.prefix, prefix=True, start_revision=start):
            agent_id = ev.kv.key.removeprefix(self.prefix)
            found = dict(self.current.all)
            if ev.type is EventType.DELETE:
                found.pop(agent_id, None)
            else:
                member = Member.from_registration(ev.kv.value, ev.kv.lease)
                if member is None:
                    continue
                found[member.agent_id] = member
            self._publish(found, ev.revision)

    def _publish(self, found: dict[str, Member], revision: int) -> None:
        before = self.current
        self.current = after = Members(self.region, found, revision, self._r)
        if [m.agent_id for m in before.serving] != [m.agent_id for m in after.serving] or {
            m.agent_id: m.weight for m in before.serving
        } != {m.agent_id: m.weight for m in after.serving}:
            log.info(
                "region_members",
                region=self.region,
                serving=[m.agent_id for m in after.serving],
                leaving=[m.agent_id for m in after.all.values() if m not in after.serving],
                r=after.r,
                revision=revision,
            )
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        for listener in self._listeners:
            listener(after)
