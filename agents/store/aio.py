"""Async front of the store for the daemon: each blocking step runs in a thread
(`asyncio.to_thread`), so the event loop never waits on a disk."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable

from agents.store.staging import StagedWrite
from agents.store.store import ObjectStore
from agents.to_the_end import run_to_the_end
from controlplane.domain.version import Digest, Version


async def put_stream(
    store: ObjectStore,
    dataset: str,
    key: str,
    chunks: AsyncIterable[bytes | bytearray | memoryview],
    *,
    expected_size: int | None = None,
    max_size: int | None = None,
    expected_digest: Digest | str | None = None,
    set_id: str | None = None,
    outbox: bool = False,
    epoch: int = 0,
    policy_revision: int | None = None,
) -> Version:
    """`ObjectStore.put` for bytes arriving as an async stream (a gRPC client stream).
    A cancelled or failed stream leaves nothing stored: the temporary file goes."""
    staged = await run_to_the_end(
        functools.partial(
            store.stage,
            dataset,
            key,
            expected_size=expected_size,
            max_size=max_size,
            expected_digest=expected_digest,
        ),
        release=StagedWrite.abort,  # cancelled while staging: the file goes too
    )
    try:
        async for chunk in chunks:
            await asyncio.to_thread(staged.write, chunk)
        return await asyncio.to_thread(
            store.commit_put,
            staged,
            set_id=set_id,
            outbox=outbox,
            epoch=epoch,
            policy_revision=policy_revision,
        )
    finally:
        # After a commit this removes nothing. On cancellation the thread may still be
        # writing; abort waits for that chunk (the write lock, held through an fsync at
        # the commit), in a thread of its own, and then removes the file.
        await run_to_the_end(staged.abort)
