"""An agent of a region, for commands that apply through one (`replicator run`,
`replication resync`) when none is named: spec/cli.md gives them as
`--region REGION` alone, so the region's own registrations in etcd say where one
listens (routed as MERIDIAN_AGENT_ROUTES says, as every other dialler does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.errors import ConfigError

if TYPE_CHECKING:
    from controlplane.ports.coordination import Coordination
    from controlplane.settings import Settings


async def registered_agent(settings: Settings, region: str, coord: Coordination) -> str:
    """The address of an agent `region` has registered (the first by id); ConfigError
    naming --agent when it has none, UnavailableError when etcd cannot say."""
    from agents.replication.peers import EtcdPeers, NoAgentError

    try:
        return await EtcdPeers(coord, settings.agent_address).address(region)
    except NoAgentError as exc:
        raise ConfigError(
            f"{exc}: start one, or name one with --agent HOST:PORT (or MERIDIAN_AGENT)"
        ) from None


async def find_agent(settings: Settings, region: str) -> str:
    """`registered_agent` over a connection of its own."""
    from controlplane.adapters.etcd import EtcdCoordination

    coord = EtcdCoordination(
        [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
    )
    try:
        await coord.connect()
        return await registered_agent(settings, region, coord)
    finally:
        await coord.close()
