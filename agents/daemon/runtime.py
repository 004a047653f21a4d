"""How the agent's process runs Python: its event loop and its garbage collector.

Both are measured choices (issue 13, `benchmarks/critical_bench.py`, 32 writers): an
agent's time per acked write is mostly Python's own, the loop's callbacks and the
objects each call makes, so the interpreter's defaults show.

* The loop is uvloop's (libuv) unless the setting `agent_loop` says `asyncio`: the
  owner's CPU per acked write fell from 1.2 to 1.05 ms and the rate rose about 8 %.
  grpc's aio API runs on any asyncio loop; `asyncio` stays for a platform without
  uvloop or an operator who wants the reference loop.
* Once the agent has started, what startup built (settings, the policy, the
  generated protobuf classes, the store's caches) is frozen out of the collector's
  scans (`gc.freeze`), and a young collection runs every GC_GEN0 allocations instead
  of 700: a write allocates hundreds of short-lived objects (protobufs, futures,
  rows), nearly all freed by reference counting, so the default threshold ran a young
  collection every few writes and an old one often, each rescanning everything held.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, Literal

from controlplane.logs import get_logger

log = get_logger("meridian.agent")

Loop = Literal["uvloop", "asyncio"]

# Young-generation threshold once started (Python's default is 700); the older
# generations keep the default ratios (10, 10) to it, so garbage in reference cycles
# still goes within a few million allocations (the store's group commit makes none
# of a failed group's items, agents/store/group.py).
GC_GEN0 = 50_000
GC_GEN1, GC_GEN2 = 10, 10


def run(main: Coroutine[Any, Any, None], loop: Loop) -> None:
    """Run `main` to its end on the loop named (uvloop falls back to asyncio, logged,
    where it is not installed)."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("agent_loop", wanted="uvloop", used="asyncio", reason="not installed")
        else:
            log.info("agent_loop", used="uvloop")
            uvloop.run(main)
            return
    log.info("agent_loop", used="asyncio")
    asyncio.run(main)


def settle_gc() -> None:
    """After startup: freeze what it built and collect the young less often (module)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0, GC_GEN1, GC_GEN2)
