"""Issue 14's open question: can a watch resumed after a reconnect skip events?

A watch through a Toxiproxy proxy of its own (one etcd member behind it) while
writes go on directly; the link is black-holed, then reset (connections
closed), then healed. The adapter reopens the stream itself after the last event
it delivered (etcd3aio's own resume could skip), so every change must arrive
once, in revision order, with no gap, and the watch must not end.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from chaos.stack import PrivateStack
from chaos.toxiproxy import AsyncToxiproxy
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import MeridianError
from controlplane.loopback import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_a_watch_across_cut_and_reset_links_skips_nothing(
    private_stack: PrivateStack,
) -> None:
    prefix = f"/chaos-test/{uuid.uuid4().hex[:8]}/"
    name = f"chaos-test-watch-{uuid.uuid4().hex[:6]}"
    listen = f"127.0.0.1:{free_port()}"
    member = private_stack.etcd_endpoints[0]
    seen: list[int] = []
    ended: list[BaseException] = []
    target = [0]  # the revision of the last write, once made
    done = asyncio.Event()  # set when the watch saw the last write, or ended
    async with (
        AsyncToxiproxy(private_stack.toxiproxy_url) as toxi,
        EtcdCoordination(private_stack.etcd_endpoints, timeout_s=5) as direct,
    ):
        await toxi.create_proxy(name, listen, member)
        try:  # from the proxy's creation on: whatever fails, the proxy is deleted
            watcher = EtcdCoordination([listen], timeout_s=3)
            await watcher.connect()
            start = await direct.put(prefix + "start", b"0")

            async def follow() -> None:
                try:
                    async for ev in watcher.watch(prefix, prefix=True, start_revision=start + 1):
                        seen.append(ev.revision)
                        if target[0] and ev.revision >= target[0]:
                            done.set()
                except (MeridianError, OSError) as exc:
                    ended.append(exc)
                done.set()

            task = asyncio.create_task(follow())
            written: list[int] = []
            try:
                for phase in ("before", "cut", "reset", "after"):
                    if phase == "cut":
                        await toxi.cut(name)
                    elif phase == "reset":
                        await toxi.clear(name)
                        await toxi.set_enabled(name, False)  # closes every connection
                    elif phase == "after":
                        await toxi.clear(name)
                    for i in range(5):
                        written.append(await direct.put(f"{prefix}{phase}-{i}", b"x"))
                        await asyncio.sleep(0.3)
                target[0] = written[-1]
                if seen and seen[-1] >= target[0]:
                    done.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 20)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await watcher.close()
                await direct.delete(prefix, prefix=True)
        finally:
            await toxi.delete_proxy(name)
    assert not ended, f"the watch ended instead of resuming: {ended}"
    assert seen == written, f"the watch skipped, repeated or stalled: wrote {written}, saw {seen}"
