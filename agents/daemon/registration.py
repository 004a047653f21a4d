"""The agent's registration: `/meridian/agents/<region>/<id>` on a lease of its own.

The value is JSON: `{"id", "region", "endpoint", "weight", "capacity_bytes",
"objects", "bytes", "started_at"}` (`started_at` RFC 3339, UTC), with the daemon's
own fields beside (its rebalance and cache state, `records_behind_s`). It exists while
the agent lives: a SIGTERM revokes the lease (the key goes at once), a SIGKILL or
a lost host lets it expire within the TTL. Usage figures are rewritten every
`usage_interval_s` when they changed, under the same lease.

If the lease is lost while the agent runs (etcd unreachable for a whole TTL, or a
leader change that expired it), the agent registers again with a new lease as
soon as etcd answers: an agent that serves should be listed. Nothing here ends
the process; a failure is logged and retried with backoff.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agents.store.model import Usage
from controlplane.coordination.protocols import keys
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.errors import MeridianError, UnavailableError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination, KeepAlive

log = get_logger("meridian.agent")


@dataclass(frozen=True)
class RecordsBehind:
    """One agent's `records_behind_s`, as its registration publishes it: the age of the
    oldest journal record its recorder has not yet shipped to the catalog."""

    agent_id: str
    region: str
    seconds: float


def records_behind(values: list[bytes]) -> list[RecordsBehind]:
    """The figures of the registration values that publish one (unreadable values, and
    agents that do not publish the field, are skipped): read by `region show` per
    agent and by `audit` and `replication status` per region."""
    out: list[RecordsBehind] = []
    for value in values:
        try:
            doc = json.loads(value)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        agent_id, region, behind = doc.get("id"), doc.get("region"), doc.get("records_behind_s")
        if not isinstance(agent_id, str) or not isinstance(region, str):
            continue
        if isinstance(behind, int | float) and not isinstance(behind, bool) and behind >= 0:
            out.append(RecordsBehind(agent_id, region, float(behind)))
    return out


@dataclass(frozen=True)
class AgentRecord:
    agent_id: str
    region: str
    endpoint: str
    weight: int
    started_at: str

    def value(self, usage: Usage | None, extra: dict[str, object] | None = None) -> bytes:
        doc: dict[str, object] = {
            **(extra or {}),
            "id": self.agent_id,
            "region": self.region,
            "endpoint": self.endpoint,
            "weight": self.weight,
            "started_at": self.started_at,
            "objects": usage.objects if usage else 0,
            "bytes": usage.bytes if usage else 0,
            "capacity_bytes": (usage.bytes + usage.bytes_free) if usage else 0,
        }
        return json.dumps(doc, sort_keys=True).encode()


class Registration(Lifecycle):
    """Keeps `record` registered while running (see the module docstring).

    `usage` is called in a thread for the figures (the store's `usage`, which reads
    one row)."""

    def __init__(
        self,
        coord: Coordination,
        record: AgentRecord,
        usage: Callable[[], Usage],
        *,
        lease_ttl_s: int,
        usage_interval_s: float,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
        extra: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self.coord = coord
        # More fields for the value (issue 16: the agent's placement state and its
        # rebalance in progress, agents/rebalance/), read at every rewrite.
        self._extra = extra
        self.record = record
        self.key = keys.agent(record.region, record.agent_id)
        self._usage = usage
        self._ttl_s = lease_ttl_s
        self._interval_s = usage_interval_s
        self._retry = (retry_initial_s, retry_max_s)
        self._keepalive: KeepAlive | None = None
        self._written: bytes = b""
        self._task: asyncio.Task[None] | None = None
        self.registrations = 0  # how many leases it took (1 unless one was lost)
        # Run after each registration's put, before it counts as registered: a failure
        # revokes the lease and the registration is tried again (the roster entry's
        # rewrite, agents/placement/roster.py).
        self.on_registered: Callable[[], Awaitable[None]] | None = None

    @classmethod
    def started_now(cls) -> str:
        return rfc3339(utcnow()) or ""

    @property
    def lease_id(self) -> int:
        return self._keepalive.lease.id if self._keepalive is not None else 0

    async def _do_start(self) -> None:
        await self._register()  # at start an etcd failure is the caller's to report
        self._task = asyncio.create_task(self._run(), name="agent-registration")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is None:
            return
        await keepalive.stop()
        try:
            await self.coord.revoke(keepalive.lease.id)
            log.info("agent_deregistered", key=self.key)
        except MeridianError as exc:
            log.warning(
                "agent_deregister_failed",
                key=self.key,
                error=str(exc),
                action=f"the key expires with its lease within {self._ttl_s} s",
            )

    async def _register(self) -> None:
        lease = await self.coord.grant(self._ttl_s)
        try:
            value = await self._value()
            await self.coord.put(self.key, value, lease=lease.id)
            if self.on_registered is not None:
                await self._after_put()
        except BaseException:
            await _revoke_quietly(self.coord, lease.id)
            raise
        self._written = value
        self._keepalive = self.coord.keep_alive(lease)
        self.registrations += 1
        log.info(
            "agent_registered",
            key=self.key,
            endpoint=self.record.endpoint,
            lease=f"{lease.id:x}",
            ttl_s=lease.ttl_s,
        )

    async def _after_put(self) -> None:
        """The hook, within half the lease's TTL: the keepalive starts after it, so a
        slow hook must not outlive the new lease (the registration is retried)."""
        assert self.on_registered is not None  # noqa: S101 - the caller checked
        bound_s = self._ttl_s / 2
        try:
            async with asyncio.timeout(bound_s):
                await self.on_registered()
        except TimeoutError:
            raise UnavailableError(
                f"{self.key}: what follows the registration did not finish within {bound_s} s"
            ) from None

    async def _run(self) -> None:
        delay = self._retry[0]
        while True:
            try:
                if self._keepalive is None:
                    await self._register()
                await self._tick()
                delay = self._retry[0]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd away: keep serving, retry
                log.warning(
                    "agent_registration_retry", key=self.key, error=str(exc), retry_in_s=delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry[1])

    async def _tick(self) -> None:
        """Wait for the lease to be lost or the usage interval to pass, then act on it."""
        keepalive = self._keepalive
        assert keepalive is not None  # noqa: S101 - _run registered first
        try:
            async with asyncio.timeout(self._interval_s):
                await keepalive.lost.wait()
        except TimeoutError:
            await self.publish()
            return
        log.warning("agent_lease_lost", key=self.key, action="registering again")
        self._keepalive = None
        await keepalive.stop()

    async def _value(self) -> bytes:
        usage = await asyncio.to_thread(self._usage)
        return self.record.value(usage, self._extra() if self._extra is not None else None)

    async def publish(self) -> None:
        """Rewrite the value now if it changed (a state change peers must see at once)."""
        keepalive = self._keepalive
        if keepalive is None:
            return
        value = await self._value()
        if value != self._written:
            await self.coord.put(self.key, value, lease=keepalive.lease.id)
            self._written = value


async def _revoke_quietly(coord: Coordination, lease_id: int) -> None:
    try:
        await coord.revoke(lease_id)
    except MeridianError as exc:
        log.warning("lease_revoke_failed", lease=f"{lease_id:x}", error=str(exc))
