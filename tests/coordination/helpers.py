"""Shared topology and placements of the coordination tests."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

from controlplane.coordination.catalog_glue.sources import RegionInfo
from controlplane.domain.placement import Placement

REGIONS = [
    RegionInfo("eu-west", "EU"),
    RegionInfo("eu-central", "EU"),
    RegionInfo("eu-north", "EU"),
    RegionInfo("us-east", "US"),
]


def critical(
    name: str,
    home: str = "eu-west",
    order: tuple[str, ...] = ("eu-central", "eu-north"),
    mode: str = "automatic",
) -> Placement:
    return Placement(
        dataset=name,
        policy="checkpoints",
        dataset_class="critical",
        home=home,
        replicas=order,
        residency=("EU",),
        rpo_s=0,
        failover_mode=mode,  # type: ignore[arg-type]
        failover_order=order,
    )


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout_s: float, step_s: float = 0.05
) -> bool:
    """Poll `pred` until true or `timeout_s` passes (bounded in time and count)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / step_s) + 2):
        if await pred():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(step_s)
    return False


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
