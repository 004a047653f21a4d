"""The client library of the node agent's API (`meridian.v1.Agent`), asyncio.

`AgentClient(address)` is what the CLI (`meridian object`), the replicator's agent
adapter, the demo and the chaos workload talk to an agent with. It speaks domain
types (`Version`, `HLC`, `VersionSet`), never protobuf, and raises Meridian errors:
a call the agent refused comes back as the very class it raised (`from_rpc_error`:
a stale epoch is a `StaleEpochError`, a residency refusal a `ResidencyError`); an
agent that cannot be reached is a retriable `UnavailableError` naming it.

Every call carries a deadline. Unary calls get `timeout_s`; a bulk transfer gets
`timeout_s` plus its size at `min_rate_bytes_per_s`, so a 4 GiB put is not cut by
a deadline sized for a stat, and a stalled one still ends.

Bulk bytes move in 1 MiB chunks (the API's limit per message). Files are read and
written in threads (`asyncio.to_thread`), so the loop never waits on a disk.
`get` writes its output atomically: a temporary file beside it, size and content
digest checked, fsync, rename, fsync of the folder; on any error the temporary
file is removed and the output is untouched.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

import grpc
import grpc.aio

from agents.rpc.status import error_from_parts, from_rpc_error
from agents.store.errors import DigestMismatchError, ShortStreamError
from controlplane.domain.errors import MessageError
from controlplane.domain.hlc import HLC
from controlplane.domain.version import ContentHasher, Verdict, Version
from controlplane.domain.version_set import VersionSet
from controlplane.errors import InvalidInputError, MeridianError, UnavailableError
from meridian import convert
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

CHUNK_BYTES = 1024 * 1024
SMALL_BYTES = 64 * 1024  # the most a PutSmall carries (the agent's INLINE_BYTES)
# After an agent answers PutSmall with UNIMPLEMENTED (an older agent), small objects
# go as Put streams for this long, then PutSmall is tried again: behind one address a
# rolling upgrade replaces old agents with new ones, and a client lives through it.
SMALL_RETRY_S = 60.0
# A message is one chunk plus its framing; allow headroom for the header messages.
MAX_MESSAGE_BYTES = 4 * CHUNK_BYTES
DEFAULT_TIMEOUT_S = 30.0
# The slowest transfer rate a bulk call is given time for before its deadline ends it.
DEFAULT_MIN_RATE_BYTES_PER_S = 4 * 1024 * 1024
LIST_PAGE = 1000
# What grpc aio says instead of a server's early status (grpc/grpc#36066), and how many
# times a Put asks again for the real one (see AgentClient._put_verdict).
CORE_INTERNAL = "Internal error from Core"
VERDICT_ATTEMPTS = 3
_ZEROS = bytes(CHUNK_BYTES)

Progress = Callable[[int, int | None], None]
"""Called with (bytes done, bytes in total or None) as a transfer advances."""

_OUTCOMES: dict[int, Verdict] = {
    agent_pb2.APPLY_OUTCOME_APPLIED: Verdict.APPLY,
    agent_pb2.APPLY_OUTCOME_SAME: Verdict.SAME,
    agent_pb2.APPLY_OUTCOME_OLDER: Verdict.OLDER,
    agent_pb2.APPLY_OUTCOME_COLLISION: Verdict.COLLISION,
}


@dataclass(frozen=True)
class ObjectInfo:
    """One object as the agent describes it: its newest (or asked) version."""

    dataset: str
    key: str
    version: Version
    set_id: str | None = None
    # Its bytes were found gone or damaged here (startup repair): not a readable copy.
    missing: bool = False


@dataclass(frozen=True)
class Health:
    live: bool
    region: str
    agent_id: str
    objects: int
    bytes_stored: int
    bytes_free: int
    # None from an agent that predates them (HealthResponse).
    tombstone_retention_ms: int | None = None
    now_ms: int | None = None


@dataclass(frozen=True)
class FetchSource:
    region: str
    address: str


@dataclass(frozen=True)
class FetchResult:
    """What `fetch` did: the LWW verdict, the newest version held after it, and the
    source that served the bytes (empty when nothing was fetched)."""

    outcome: Verdict
    held: Version | None
    source_region: str
    logical_bytes: int
    wire_bytes: int


@dataclass(frozen=True)
class ReplicateItem:
    """One standard version made elsewhere for `replicate_many`: a put with all its
    bytes (`data`), or a delete (`data` None)."""

    dataset: str
    key: str
    version: Version
    data: bytes | None
    origin_region: str
    policy_revision: int = 0


@dataclass(frozen=True)
class ReplicateOutcome:
    """What the agent did with one item: the LWW verdict and the newest version held."""

    outcome: Verdict
    held: Version


class AgentClient:
    """An asyncio client of one agent (see the module docstring). Use `async with`,
    or `close()` it: the channel is opened on first use."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        min_rate_bytes_per_s: float = DEFAULT_MIN_RATE_BYTES_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not address or ":" not in address:
            raise InvalidInputError(
                f"agent address {address!r} is not host:port; give e.g. 127.0.0.1:7400"
            )
        if timeout_s <= 0 or min_rate_bytes_per_s <= 0:
            raise InvalidInputError("an agent client's timeout and minimum rate must be positive")
        self.address = address
        self.timeout_s = timeout_s
        self.min_rate_bytes_per_s = min_rate_bytes_per_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: agent_pb2_grpc.AgentAsyncStub | None = None
        self._clock = clock
        # PutSmall is not tried before this time (of `clock`; see SMALL_RETRY_S).
        self._small_after = 0.0

    # -- lifecycle -------------------------------------------------------------------
    @property
    def stub(self) -> agent_pb2_grpc.AgentAsyncStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                self.address,
                options=[
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._stub = agent_pb2_grpc.AgentStub(self._channel)
        assert self._stub is not None  # noqa: S101 - set just above; narrows for mypy
        return self._stub

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _bulk_timeout(self, size: int | None) -> float:
        return self.timeout_s + (size or 0) / self.min_rate_bytes_per_s

    def _error(self, err: grpc.aio.AioRpcError) -> Exception:
        return from_rpc_error(err, self.address)

    # -- writes ----------------------------------------------------------------------
    async def put(
        self,
        dataset: str,
        key: str,
        source: Path | str | bytes | AsyncIterable[bytes],
        *,
        epoch: int | None = None,
        set_id: str | None = None,
        size: int | None = None,
        progress: Progress | None = None,
    ) -> Version:
        """Store `source` (a file path, bytes, or an async iterable of chunks of at most
        1 MiB) as a new version of `dataset/key`; returns the version the agent
        assigned. `size`, when known, sizes the deadline (a file's size is read from
        it). An object of at most `SMALL_BYTES` whose bytes are at hand goes in one
        PutSmall call, a larger one (or one to an agent without PutSmall) in a Put
        stream."""
        header = agent_pb2.PutHeader(dataset=dataset, key=key)
        if epoch is not None:
            header.epoch = epoch
        if set_id is not None:
            header.set = set_id
        chunks: AsyncIterable[bytes]
        if isinstance(source, str | Path):
            path = Path(source)
            try:
                info = await asyncio.to_thread(path.stat)
                size = info.st_size
                # A regular file only: a pipe or a device says 0 bytes and may be endless.
                if stat.S_ISREG(info.st_mode) and size <= SMALL_BYTES and self._small():
                    source = await asyncio.to_thread(path.read_bytes)
            except OSError as err:
                raise InvalidInputError(f"cannot read {path}: {err.strerror or err}") from None
        if isinstance(source, bytes) and len(source) <= SMALL_BYTES and self._small():
            version = await self._put_small(header, source)
            if version is not None:
                if progress is not None:
                    progress(len(source), len(source))
                return version
        if isinstance(source, bytes):
            size = len(source)
            chunks = _chunks_of(source)
        elif isinstance(source, str | Path):
            chunks = _file_chunks(Path(source))
        else:
            chunks = source

        # grpc aio swallows what a request iterator raises and cancels the call, which
        # then raises a bare CancelledError: the error is kept to be raised instead.
        failed: list[Exception] = []

        async def requests() -> AsyncIterator[agent_pb2.PutRequest]:
            try:
                yield agent_pb2.PutRequest(header=header)
                done = 0
                async for chunk in chunks:
                    if len(chunk) > CHUNK_BYTES:
                        raise InvalidInputError(
                            f"a put chunk holds at most {CHUNK_BYTES} bytes, got {len(chunk)}"
                        )
                    yield agent_pb2.PutRequest(chunk=bytes(chunk))
                    done += len(chunk)
                    if progress is not None:
                        progress(done, size)
                # Without it the agent cannot tell the end from a writer killed mid-stream.
                yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())
            except Exception as exc:
                failed.append(exc)
                raise

        try:
            resp = await self.stub.Put(requests(), timeout=self._bulk_timeout(size))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            # Ours to raise only when nothing else cancelled this task meanwhile.
            if failed and (task is None or not task.cancelling()):
                raise failed[0] from None
            raise
        except grpc.aio.AioRpcError as err:
            if not _core_internal(err):
                raise self._error(err) from None
            raise await self._put_verdict(header, size) from None
        return _version(resp.version, "PutResponse.version")

    def _small(self) -> bool:
        """Whether to send a small object as PutSmall now (see SMALL_RETRY_S)."""
        return self._clock() >= self._small_after

    async def _put_small(self, header: agent_pb2.PutHeader, data: bytes) -> Version | None:
        """The object in one PutSmall call; None when the agent serves no PutSmall (an
        older agent: it is sent as a Put, and so is every small one for SMALL_RETRY_S)."""
        try:
            resp = await self.stub.PutSmall(
                agent_pb2.PutSmallRequest(header=header, data=data), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:  # no agent answers it otherwise
                self._small_after = self._clock() + SMALL_RETRY_S
                return None
            raise self._error(err) from None
        return _version(resp.version, "PutResponse.version")

    async def _put_verdict(self, header: agent_pb2.PutHeader, size: int | None) -> Exception:
        """The typed error of a Put the agent ended early while we were still sending.

        grpc aio (grpc/grpc#36066) sometimes reports a server's early status on a
        client stream that is still sending as INTERNAL "Internal error from Core"
        instead of the status the agent set (a refusal at the header: residency, not
        the owner, a stale epoch, a handover; or a size over the cap). The agent
        committed nothing: without our end frame it never commits. So ask again with
        the header alone, stating the size when there is one, and end the stream at
        once: the agent decides the same refusals at the header, and with nothing left
        to send the status arrives intact. A header alone is never stored (no end
        frame, and a stated size the stream does not reach). If the agent admits it
        now, the write is retriable: `UnavailableError`, nothing stored."""
        probe = agent_pb2.PutHeader()
        probe.CopyFrom(header)
        if size:  # never a stated 0: a header alone would then be a whole empty object
            probe.size = size

        async def alone() -> AsyncIterator[agent_pb2.PutRequest]:
            yield agent_pb2.PutRequest(header=probe)

        for _ in range(VERDICT_ATTEMPTS):
            try:
                await self.stub.Put(alone(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as err:
                if _core_internal(err):
                    continue  # the same bug again; ask once more
                found = self._error(err)
                if not isinstance(found, ShortStreamError):
                    return found  # the refusal the first attempt lost
            break  # admitted at the header now (it refused the header alone as short)
        return UnavailableError(
            f"the agent at {self.address} ended the put of {header.dataset}/{header.key} "
            "early and its reason was lost (grpc/grpc#36066); asked again it gives none; "
            "nothing was stored, try again"
        )

    async def delete(
        self, dataset: str, key: str, *, epoch: int | None = None, set_id: str | None = None
    ) -> Version:
        """Write a tombstone; returns its version."""
        req = agent_pb2.DeleteRequest(dataset=dataset, key=key)
        if epoch is not None:
            req.epoch = epoch
        if set_id is not None:
            req.set = set_id
        try:
            resp = await self.stub.Delete(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return _version(resp.version, "DeleteResponse.version")

    async def evict(
        self,
        dataset: str,
        keys: Sequence[tuple[str, HLC]],
        sets: Sequence[tuple[str, str]] = (),
        *,
        placement_digest: str = "",
    ) -> agent_pb2.EvictResponse:
        """Have this agent alone forget its copies of `keys` (key, the newest HLC listed in
        its region and proven held elsewhere) of a dataset its region no longer places,
        `sets` being the version sets (id, HLC) proven complete elsewhere, under the
        placement of `placement_digest` (`meridian dataset evict`)."""
        req = agent_pb2.EvictRequest(
            dataset=dataset,
            keys=[agent_pb2.EvictKey(key=k, version=str(v)) for k, v in keys],
            sets=[agent_pb2.EvictSet(id=i, hlc=h) for i, h in sets],
            placement_digest=placement_digest,
        )
        try:
            resp: agent_pb2.EvictResponse = await self.stub.Evict(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return resp

    async def commit_set(
        self,
        dataset: str,
        set_id: str,
        members: Mapping[str, HLC | str],
        *,
        epoch: int | None = None,
    ) -> VersionSet:
        """Commit a version set of objects already stored (key → version); the agent
        stamps its HLC."""
        wire = types_pb2.VersionSet(
            dataset=dataset,
            id=set_id,
            members=[types_pb2.SetMember(key=k, version=str(v)) for k, v in members.items()],
        )
        req = agent_pb2.CommitSetRequest(set=wire)
        if epoch is not None:
            req.epoch = epoch
        try:
            resp = await self.stub.CommitSet(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        try:
            return convert.version_set_from_wire(resp.set, "CommitSetResponse.set")
        except MessageError as exc:
            raise UnavailableError(f"the agent at {self.address} answered badly: {exc}") from None

    async def replicate(
        self,
        dataset: str,
        key: str,
        version: Version,
        data: bytes | None,
        *,
        epoch: int,
        origin_region: str,
        set_id: str | None = None,
        policy_revision: int = 0,
    ) -> Version:
        """Push a version made elsewhere, with its bytes (None for a delete); the agent
        acks once committed (by LWW; epoch 0 for a standard dataset)."""
        header = agent_pb2.ReplicateHeader(
            dataset=dataset,
            key=key,
            version=convert.version_to_wire(version),
            epoch=epoch,
            origin_region=origin_region,
            policy_revision=policy_revision,
        )
        if set_id is not None:
            header.set = set_id

        async def requests() -> AsyncIterator[agent_pb2.ReplicateRequest]:
            yield agent_pb2.ReplicateRequest(header=header)
            view = memoryview(data or b"")
            for at in range(0, len(view), CHUNK_BYTES):
                yield agent_pb2.ReplicateRequest(chunk=bytes(view[at : at + CHUNK_BYTES]))

        try:
            resp = await self.stub.Replicate(
                requests(), timeout=self._bulk_timeout(len(data or b""))
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return _version(resp.version, "ReplicateResponse.version")

    async def replicate_many(
        self, items: Sequence[ReplicateItem]
    ) -> list[ReplicateOutcome | MeridianError]:
        """Push many standard inline puts and deletes (epoch 0) in one call; the agent
        commits them together by LWW and answers one result per item, in order: what it
        did, or the error refusing that item (e.g. `ResidencyError`). The request must fit
        in one message (about 1 MiB); each (dataset, key) at most once."""
        req = agent_pb2.ReplicateManyRequest(
            items=[
                agent_pb2.ReplicateItem(
                    dataset=i.dataset,
                    key=i.key,
                    version=convert.version_to_wire(i.version),
                    data=i.data or b"",
                    origin_region=i.origin_region,
                    policy_revision=i.policy_revision,
                )
                for i in items
            ]
        )
        size = sum(len(i.data or b"") for i in items)
        try:
            resp = await self.stub.ReplicateMany(req, timeout=self._bulk_timeout(size))
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        if len(resp.results) != len(items):
            raise UnavailableError(
                f"the agent at {self.address} answered {len(resp.results)} results for "
                f"{len(items)} items of ReplicateMany"
            )
        out: list[ReplicateOutcome | MeridianError] = []
        for n, r in enumerate(resp.results):
            if r.error_code or r.error_class:
                out.append(error_from_parts(r.error_class, r.error_code, r.error))
                continue
            outcome = _OUTCOMES.get(r.outcome)
            if outcome is None or not r.HasField("held"):
                raise UnavailableError(
                    f"the agent at {self.address} answered ReplicateMany item {n} with "
                    f"outcome {r.outcome} and no error"
                )
            # Mostly the very version sent (applied, or a replay): compared on the wire
            # (in C), it need not be parsed back.
            held = (
                items[n].version
                if r.held == req.items[n].version
                else _version(r.held, "ReplicateItemResult.held")
            )
            out.append(ReplicateOutcome(outcome, held))
        return out

    async def fetch(
        self,
        dataset: str,
        key: str,
        version: Version,
        sources: Sequence[FetchSource],
        *,
        origin_region: str,
        set_id: str | None = None,
        policy_revision: int = 0,
        timeout_s: float | None = None,
    ) -> FetchResult:
        """Ask the agent to pull `version` from `sources` (nearest first) and apply it."""
        req = agent_pb2.FetchRequest(
            dataset=dataset,
            key=key,
            version=convert.version_to_wire(version),
            sources=[agent_pb2.FetchSource(region=s.region, address=s.address) for s in sources],
            origin_region=origin_region,
            policy_revision=policy_revision,
        )
        if set_id is not None:
            req.set = set_id
        timeout = timeout_s if timeout_s is not None else self._bulk_timeout(version.size)
        try:
            resp = await self.stub.Fetch(req, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        outcome = _OUTCOMES.get(resp.outcome)
        if outcome is None:
            raise UnavailableError(
                f"the agent at {self.address} answered Fetch with outcome {resp.outcome}"
            )
        held = _version(resp.held, "FetchResponse.held") if resp.HasField("held") else None
        return FetchResult(
            outcome, held, resp.source_region, int(resp.logical_bytes), int(resp.wire_bytes)
        )

    # -- reads -----------------------------------------------------------------------
    async def stat(self, dataset: str, key: str, *, version: HLC | str | None = None) -> ObjectInfo:
        req = agent_pb2.StatRequest(dataset=dataset, key=key)
        if version is not None:
            req.version = str(version)
        try:
            resp = await self.stub.Stat(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        return _info(resp.object, "StatResponse.object")

    async def list(
        self,
        dataset: str,
        *,
        prefix: str = "",
        include_deleted: bool = False,
        complete: bool = False,
        lowest: bool = False,
    ) -> list[ObjectInfo]:
        """Every object under `prefix` (all pages), by key. In a region of several
        agents: `complete` fails rather than skip one that does not answer; `lowest`
        gives of each object the lowest of the agents' newest versions (ListRequest)."""
        out: list[ObjectInfo] = []
        token = ""
        for _page in range(1_000_000):  # bounded: a token that never ends is a bug
            req = agent_pb2.ListRequest(
                dataset=dataset,
                prefix=prefix,
                page_size=LIST_PAGE,
                page_token=token,
                include_deleted=include_deleted,
                complete=complete,
                lowest=lowest,
            )
            try:
                resp = await self.stub.List(req, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as err:
                raise self._error(err) from None
            if lowest and not resp.lowest:
                raise UnavailableError(
                    f"the agent at {self.address} did not list the lowest versions (it "
                    "predates ListRequest.lowest)"
                )
            out.extend(_info(o, "ListResponse.objects") for o in resp.objects)
            if not resp.next_page_token:
                return out
            if resp.next_page_token == token:
                raise UnavailableError(
                    f"the agent at {self.address} repeated list page token {token!r}"
                )
            token = resp.next_page_token
        raise UnavailableError(
            f"the agent at {self.address} listed more pages than any store holds"
        )

    async def get_set(self, dataset: str, set_id: str = "latest") -> VersionSet:
        """The newest complete set ("latest") or the named one, with its members'
        versions (UnavailableError while a named set still misses members here)."""
        try:
            resp = await self.stub.GetSet(
                agent_pb2.GetSetRequest(dataset=dataset, set=set_id), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        try:
            return convert.version_set_from_wire(resp.set, "GetSetResponse.set")
        except MessageError as exc:
            raise UnavailableError(f"the agent at {self.address} answered badly: {exc}") from None

    async def get(
        self,
        dataset: str,
        key: str,
        out: Path | str,
        *,
        version: HLC | str | None = None,
        set_id: str | None = None,
        progress: Progress | None = None,
    ) -> Version:
        """Write the newest (or the given, or the set's) version of `dataset/key` to `out`,
        atomically; its size and digest are checked before it replaces `out`. Runs of
        zeros are left as holes, as the store keeps them."""
        out = Path(out)
        info = await self.stat(dataset, key, version=version) if set_id is None else None
        req = agent_pb2.GetRequest(dataset=dataset, key=key)
        if version is not None:
            req.version = str(version)
        if set_id is not None:
            req.set = set_id
        size = info.version.size if info is not None else None
        call = self.stub.Get(req, timeout=self._bulk_timeout(size))
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            fh = await asyncio.to_thread(_open_new, tmp)
        except OSError as err:
            call.cancel()
            raise InvalidInputError(
                f"cannot write {out}: {err.strerror or err} (in {out.parent})"
            ) from None
        try:
            got = await self._receive(call, fh, progress, f"{dataset}/{key}")
            await asyncio.to_thread(_finish, fh)
            await asyncio.to_thread(os.replace, tmp, out)
            await asyncio.to_thread(_fsync_dir, out.parent)
        except BaseException:
            call.cancel()
            await asyncio.to_thread(_discard, fh, tmp)
            raise
        return got

    async def get_bytes(
        self,
        dataset: str,
        key: str,
        *,
        version: HLC | str | None = None,
        set_id: str | None = None,
    ) -> tuple[Version, bytes]:
        """The content of a (small) object in memory, checked like `get`'s."""
        req = agent_pb2.GetRequest(dataset=dataset, key=key)
        if version is not None:
            req.version = str(version)
        if set_id is not None:
            req.set = set_id
        call = self.stub.Get(req, timeout=self.timeout_s)
        parts: list[bytes] = []
        hasher = ContentHasher()
        header: Version | None = None
        try:
            async for msg in call:
                if msg.WhichOneof("frame") == "header":
                    header = _version(msg.header, "GetResponse.header")
                else:
                    hasher.update(msg.chunk)
                    parts.append(msg.chunk)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        data = b"".join(parts)
        _check(self.address, f"{dataset}/{key}", header, len(data), hasher)
        assert header is not None  # noqa: S101 - _check raised otherwise
        return header, data

    async def _receive(
        self,
        call: AsyncIterable[agent_pb2.GetResponse],
        fh: BinaryIO,
        progress: Progress | None,
        name: str,
    ) -> Version:
        header: Version | None = None
        hasher = ContentHasher()
        done = 0
        try:
            async for msg in call:
                if msg.WhichOneof("frame") == "header":
                    header = _version(msg.header, "GetResponse.header")
                    continue
                if header is None:
                    raise UnavailableError(
                        f"the agent at {self.address} sent bytes before the version header"
                    )
                chunk = msg.chunk
                done += len(chunk)
                if done > header.size:
                    break  # _check reports it, with the sizes
                await asyncio.to_thread(_write_chunk, fh, hasher, chunk)
                if progress is not None:
                    progress(done, header.size)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        _check(self.address, name, header, done, hasher)
        assert header is not None  # noqa: S101 - _check raised otherwise
        return header

    # -- health ----------------------------------------------------------------------
    async def health(self, *, timeout_s: float | None = None) -> Health:
        try:
            resp = await self.stub.Health(
                agent_pb2.HealthRequest(), timeout=timeout_s or self.timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from None
        retention = resp.tombstone_retention_ms if resp.HasField("tombstone_retention_ms") else None
        return Health(
            live=resp.live,
            region=resp.region,
            agent_id=resp.agent_id,
            objects=int(resp.store.objects),
            bytes_stored=int(resp.store.bytes_stored),
            bytes_free=int(resp.store.bytes_free),
            tombstone_retention_ms=None if retention is None else int(retention),
            now_ms=int(resp.now_ms) if resp.HasField("now_ms") else None,
        )


# -- conversions ---------------------------------------------------------------------------
def _core_internal(err: grpc.aio.AioRpcError) -> bool:
    """grpc aio's INTERNAL in place of a server's early status (grpc/grpc#36066). The
    agent's own INTERNAL (a StorageError) never says this."""
    return err.code() == grpc.StatusCode.INTERNAL and CORE_INTERNAL in (err.details() or "")


def _version(msg: types_pb2.Version, path: str) -> Version:
    try:
        return convert.version_from_wire(msg, path)
    except MessageError as exc:
        raise UnavailableError(f"an agent answered with a malformed version: {exc}") from None


def _info(msg: agent_pb2.ObjectInfo, path: str) -> ObjectInfo:
    return ObjectInfo(
        dataset=msg.dataset,
        key=msg.key,
        version=_version(msg.version, f"{path}.version"),
        set_id=msg.set if msg.HasField("set") else None,
        missing=msg.missing,
    )


def _check(
    address: str, name: str, header: Version | None, received: int, hasher: ContentHasher
) -> None:
    if header is None:
        raise UnavailableError(f"the agent at {address} ended the read of {name} without a header")
    if header.is_tombstone:
        raise UnavailableError(f"the agent at {address} answered the read of {name} with a delete")
    if received != header.size:
        raise ShortStreamError(
            f"the agent at {address} sent {received} bytes of {name}, whose version "
            f"{header.hlc} has {header.size}; nothing was written"
        )
    digest = hasher.digest()
    if digest != header.digest:
        raise DigestMismatchError(
            f"the bytes of {name} at {header.hlc} read from {address} have digest {digest}, "
            f"not {header.digest}; nothing was written"
        )


async def _chunks_of(data: bytes) -> AsyncIterator[bytes]:
    for at in range(0, len(data), CHUNK_BYTES):
        yield data[at : at + CHUNK_BYTES]


# -- files (run in threads) -------------------------------------------------------------------
async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    try:
        fh = await asyncio.to_thread(open, path, "rb")
    except OSError as err:
        raise InvalidInputError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        while True:
            try:
                chunk = await asyncio.to_thread(fh.read, CHUNK_BYTES)
            except OSError as err:  # a disk error, or a file that went away over NFS
                raise InvalidInputError(f"cannot read {path}: {err.strerror or err}") from None
            if not chunk:
                break
            yield chunk
    finally:
        await asyncio.to_thread(fh.close)


def _open_new(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    return os.fdopen(fd, "wb")


def _write_chunk(fh: BinaryIO, hasher: ContentHasher, chunk: bytes) -> None:
    hasher.update(chunk)
    if len(chunk) == CHUNK_BYTES and chunk == _ZEROS:
        fh.seek(len(chunk), os.SEEK_CUR)  # a hole: the store keeps zeros as holes too
    else:
        fh.write(chunk)


def _finish(fh: BinaryIO) -> None:
    fh.truncate()  # a trailing hole needs the file's length set
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


def _discard(fh: BinaryIO, path: Path) -> None:
    try:
        fh.close()
    finally:
        path.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
