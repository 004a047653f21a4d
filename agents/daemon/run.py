"""Run a node agent as a daemon: check the root, connect, serve, stop cleanly on SIGTERM.

`run_agent` returns normally after SIGTERM or SIGINT (exit 0), and raises one clear
`MeridianError` when the agent cannot start: the root not writable (or belonging
to another region), etcd unreachable, the region not in the applied topology, the
root open in another process, an address already in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from concurrent.futures import ThreadPoolExecutor

from agents.daemon.agent import NodeAgent
from agents.daemon.config import AgentConfig
from agents.daemon.identity import check_writable, load_or_create
from agents.daemon.runtime import settle_gc
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.logs import get_logger
from controlplane.settings import Settings

log = get_logger("meridian.agent")

# Threads of the loop's default executor, which runs every blocking store call
# (`asyncio.to_thread`). asyncio's default (cores + 4: six on two cores) would cap the
# writes in flight, hence the store's commit groups, at a handful; a writer waiting
# for its group's commit holds a thread but no CPU.
AGENT_THREADS = 64


async def run_agent(settings: Settings, config: AgentConfig) -> None:
    """Run until SIGTERM or SIGINT (see the module docstring)."""
    await asyncio.to_thread(check_writable, config.root)
    identity = await asyncio.to_thread(load_or_create, config.root, config.region)
    coord = EtcdCoordination(
        [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(AGENT_THREADS, thread_name_prefix="agent"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await coord.connect()
        async with NodeAgent(config, settings, coord, identity):
            settle_gc()
            await stop.wait()
            log.info("agent_signal", region=config.region, action="stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await coord.close()
