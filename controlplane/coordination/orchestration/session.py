"""Open what a runbook or daemon needs (etcd and the catalog) from settings, and who acts."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
from controlplane.coordination.orchestration.runbooks import Runbooks
from controlplane.settings import Settings


def os_actor() -> str:
    """The operating-system user and host, as journaled with every runbook move."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass
class Session:
    coord: EtcdCoordination
    catalog: CatalogBridge
    runbooks: Runbooks


@contextlib.asynccontextmanager
async def open_coordination(settings: Settings) -> AsyncIterator[EtcdCoordination]:
    """etcd alone (proving it answers), for what needs nothing else: `pause` and `resume`
    must work while the catalog is away (it may live in the region being lost)."""
    coord = EtcdCoordination(
        [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
    )
    await coord.connect()
    try:
        yield coord
    finally:
        await coord.close()


@contextlib.asynccontextmanager
async def open_session(settings: Settings, *, actor: str | None = None) -> AsyncIterator[Session]:
    """Connect to etcd (proving it answers) and open the catalog; close both on exit."""
    catalog = await asyncio.to_thread(CatalogBridge.open, settings.catalog)
    try:
        coord = EtcdCoordination(
            [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
        )
        await coord.connect()
        # Imported here: they dial agents (agents.client), which only runbooks need.
        from controlplane.controller.agent_probe import AgentCatchUpProbe
        from controlplane.controller.holdings_choice import HoldingsChooser

        # A switchover's catch-up wait asks the agents, as the controller's does: the
        # catalog alone also lists the owner's unacked newest versions (a write admitted
        # just before the handover mark, its pushes refused by the mark), which need not
        # ever reach the target, so it would wait out the timeout and abort.
        probe = AgentCatchUpProbe(
            [f"{h}:{p}" for h, p in settings.etcd_endpoints],
            settings.agent_address,
            fallback=catalog,
            etcd_timeout_s=settings.etcd_timeout_s,
        )
        runbooks = Runbooks(
            coord,
            catalog,
            catalog,
            probe,
            actor=actor or os_actor(),
            lease_ttl_s=settings.lease_ttl_s,
            holdings=HoldingsChooser(
                coord, settings.agent_address, timeout_s=settings.etcd_timeout_s
            ),
        )
        try:
            yield Session(coord, catalog, runbooks)
        finally:
            # An interrupted runbook still journals the moves whose transaction it sent.
            await runbooks.moves.finish(timeout_s=settings.etcd_timeout_s + 5)
            await runbooks.close()
            await coord.close()
    finally:
        await asyncio.to_thread(catalog.close)
