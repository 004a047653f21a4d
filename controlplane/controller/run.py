"""Run a region controller as a daemon: connect, serve metrics, stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from pathlib import Path

from prometheus_client import start_http_server

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.controller.agent_probe import AgentCatchUpProbe
from controlplane.controller.catalog_link import CatalogLink
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.controller.holdings_choice import HoldingsChooser
from controlplane.errors import ConfigError, MeridianError
from controlplane.logs import get_logger
from controlplane.settings import Settings, parse_endpoints

log = get_logger("meridian.controller")


def parse_metrics_addr(addr: str) -> tuple[str, int]:
    host, port = parse_endpoints(addr, setting="--metrics")[0]
    return host, port


async def run_controller(
    settings: Settings,
    region: str,
    *,
    controller_id: str | None,
    metrics_addr: str | None,
    fence_dir: Path | None,
) -> None:
    """Run until SIGTERM or SIGINT.

    Raises one clear error if etcd is unreachable at start, or if the catalog is
    unusable in a way that will not clear by itself (a bad URL, not migrated). A
    catalog that is merely down does not stop the start (see `catalog_link`)."""
    metrics = parse_metrics_addr(metrics_addr) if metrics_addr else None
    catalog = CatalogLink(settings.catalog)
    try:
        await asyncio.to_thread(catalog.open)
    except MeridianError as exc:
        if not exc.retriable:
            raise
        # Decisions come from etcd: start anyway, journal rows wait for the catalog.
        log.warning(
            "catalog_unreachable_at_start",
            region=region,
            error=str(exc),
            action="starting without it; journal rows are written once it answers",
        )
    coord = EtcdCoordination(
        [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
    )
    try:
        await coord.connect()
        config = ControllerConfig(
            region=region, lease_ttl_s=settings.lease_ttl_s, fence_dir=fence_dir
        )
        if controller_id:
            config = dataclasses.replace(config, controller_id=controller_id)
        # The catch-up wait asks the owner's and the target's agents (by digest), and
        # the catalog (issue 13).
        probe = AgentCatchUpProbe(
            [f"{h}:{p}" for h, p in settings.etcd_endpoints],
            settings.agent_address,
            fallback=catalog,
            etcd_timeout_s=settings.etcd_timeout_s,
        )
        # The failover prefers the candidate holding every acked version (issue 13).
        holdings = HoldingsChooser(coord, settings.agent_address, timeout_s=settings.etcd_timeout_s)
        ctl = RegionController(coord, catalog, probe, config, holdings=holdings)
        server = None
        if metrics is not None:
            try:
                server, _thread = start_http_server(
                    metrics[1], metrics[0], registry=ctl.metrics.registry
                )
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {metrics_addr}: {exc.strerror}"
                ) from exc
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with ctl:
                waiter = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait(
                    [waiter, asyncio.create_task(ctl.wait())], return_when=asyncio.FIRST_COMPLETED
                )
                for t in done:
                    if t is not waiter:
                        t.result()
                waiter.cancel()
                log.info("controller_signal", region=region, action="stopping")
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if server is not None:
                server.shutdown()
                server.server_close()
    finally:
        with contextlib.suppress(Exception):
            await coord.close()
        await asyncio.to_thread(catalog.close)
