"""Run a region controller as a daemon: connect, serve metrics, stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from pathlib import Path

from prometheus_client import start_http_server

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
from controlplane.errors import ConfigError
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
    """Run until SIGTERM or SIGINT; raise one clear error if a dependency is unreachable."""
    metrics = parse_metrics_addr(metrics_addr) if metrics_addr else None
    catalog = await asyncio.to_thread(CatalogBridge.open, settings.catalog)
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
        ctl = RegionController(coord, catalog, catalog, catalog, config)
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
