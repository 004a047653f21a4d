"""The agent a replicator applies through follows its region's registrations when none
was named (`replicator run --region R` alone, spec/cli.md).

The agent read at start may stop for good (a host retired, a rebalance drained it):
its registration goes with its lease. Every `interval_s` the region's registrations
are read from etcd; when the agent in use is no longer among them, the first
registered one (by id) takes its place (`GrpcAgent.retarget`). Events whose copy
failed against the old agent meanwhile were retried by the applier, as for any
outage of an agent. An agent named with `--agent` is an operator's choice and is
never replaced. etcd out of reach changes nothing: the agent in use stays. A replaced
agent's channel is closed `RETIRED_CLOSE_S` later (`GrpcAgent.close_retired`), once
the calls still on it have ended.
"""

from __future__ import annotations

from agents.periodic import Periodic
from agents.replication.peers import registered_endpoint
from controlplane.coordination.protocols import keys
from controlplane.errors import MeridianError
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination
from replicator.agent_grpc import GrpcAgent

log = get_logger("meridian.replicator")


class AgentFollower(Periodic):
    task_name = "replicator-agent-follow"

    def __init__(
        self,
        agent: GrpcAgent,
        coord: Coordination,
        region: str,
        *,
        interval_s: float = 2.0,
    ) -> None:
        super().__init__(interval_s)
        self._agent = agent
        self._coord = coord
        self._region = region

    async def check(self) -> str | None:
        """Read the registrations once; the new address when the agent was replaced."""
        kvs, _ = await self._coord.get_prefix(keys.agents_of(self._region))
        registered = [
            self._agent.routed(self._region, endpoint)  # as it dials every agent
            for endpoint in (registered_endpoint(kv.value) for kv in kvs)
            # One that is not host:port is skipped: no client could dial it.
            if endpoint is not None and ":" in endpoint
        ]
        if not registered or self._agent.address in registered:
            return None  # none registered (one may come back): nothing better to dial
        before = self._agent.address
        self._agent.retarget(registered[0])
        log.warning(
            "replicator_agent_replaced",
            region=self._region,
            was=before,
            now=registered[0],
            reason="its registration is gone from etcd",
        )
        return registered[0]

    async def _pass(self) -> None:
        # Anything else fails the pass, which Periodic logs; the next one tries again.
        try:
            await self.check()
        except MeridianError as exc:
            log.info("replicator_agent_unchecked", region=self._region, error=str(exc))
        finally:
            await self._agent.close_retired()
