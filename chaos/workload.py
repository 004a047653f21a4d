"""The workload: single-threaded clients per region, each recording into one history.

Until `meridian agent serve` is on main, a client writes the way an owner
region's agent admits a critical write, against the controllers' fence (the
shared `--fence-dir`, which every controller keeps in step with etcd): it reads
the dataset's owner and epoch from etcd *through its region's proxies* (so a
region cut from etcd cannot learn it lost ownership: it keeps writing with the
epoch it last read, and the fence must refuse it), refuses when its region is not
the owner, and writes a unique id through `FencedResource.write` with that
epoch. The fence's `writes.log` is the accept log the split-brain checker reads
and, for the ids it accepted, the final state the lost-writes checker reads.

Outcomes: a refusal before anything was written is `fail`; a stale epoch or a
handover refused by the fence is `fail`; an accepted write is `ok`. A client
paused by the nemesis (scenario 3's SIGSTOP, which cannot stop a task in this
process) is held *between* reading its epoch and writing, the worst moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos.history import History
from chaos.records import AcceptRecord, ObjectState, OwnerSample, parse_accepts
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    DirectoryEpochs,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.protocols.ownership import Owner, Ownership
from controlplane.errors import MeridianError
from controlplane.logs import get_logger

log = get_logger("meridian.chaos")

FENCE_REGION = "fence"  # the final state's "region" for the shared fence stand-in
OP_TIMEOUT_S = 2.0


def version_of(epoch: int, region: str) -> str:
    """An HLC-shaped version for a fenced write (one key per write, so only equality matters)."""
    return f"{epoch:013d}.00000@{region}"


@dataclass
class RegionClients:
    """The clients of one region, sharing one etcd connection through its proxies."""

    region: str
    etcd: list[str]
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set: hold before writing
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    coord: EtcdCoordination | None = None
    # The owner record each dataset last had when this region could read it: a client
    # cut from etcd keeps writing with it, as a deposed owner's clients would, so the
    # fence (and the agents and replicas) are what refuse it, not the harness.
    known: dict[str, Owner] = field(default_factory=dict)

    async def ownership(self) -> Ownership:
        if self.coord is None:
            coord = EtcdCoordination(self.etcd, timeout_s=OP_TIMEOUT_S)
            await asyncio.wait_for(coord.connect(), OP_TIMEOUT_S * 2)
            self.coord = coord
        return Ownership(self.coord)

    async def close(self) -> None:
        if self.coord is not None:
            with contextlib.suppress(Exception):
                await self.coord.close()
            self.coord = None

    async def owner_here(self, dataset: str, timeout_s: float) -> Owner | str:
        """The dataset's owner record when this region owns it (or, cut from etcd, last
        owned it), or why a write must not be sent. A client the nemesis holds (SIGSTOP)
        waits here, after reading its epoch and before writing: the worst moment."""
        try:
            own = await self.ownership()
            owner = await asyncio.wait_for(own.get(dataset), timeout_s)
        except (MeridianError, TimeoutError, OSError) as exc:
            await self.close()  # a fresh channel next time (a cut may have wedged this one)
            owner = self.known.get(dataset)
            if owner is None or owner.region != self.region:
                return f"owner unknown: {exc!r}"[:200]
        else:
            if owner is None:
                self.known.pop(dataset, None)
            else:
                self.known[dataset] = owner
        if owner is None or owner.region != self.region:
            return f"not the owner (owner: {owner.region if owner else None})"
        if self.paused.is_set():
            await self.resume.wait()
        return owner

    def pause(self) -> None:
        self.resume.clear()
        self.paused.set()

    def unpause(self) -> None:
        self.paused.clear()
        self.resume.set()


class FencedWorkload:
    """`clients_per_region` clients per region writing to `datasets` until stopped."""

    def __init__(
        self,
        history: History,
        fence_dir: Path,
        regions: dict[str, list[str]],
        datasets: list[str],
        *,
        seed: int,
        clients_per_region: int = 2,
        interval_s: float = 0.05,
    ) -> None:
        self.history = history
        self.fence = FencedResource(DirectoryEpochs(fence_dir))
        self.fence_dir = fence_dir
        self.regions = {r: RegionClients(r, eps) for r, eps in regions.items()}
        self.datasets = datasets
        self.rng = random.Random(seed)  # noqa: S311 - replayable from the seed
        self.clients_per_region = clients_per_region
        self.interval_s = interval_s
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for rc in self.regions.values():
            for i in range(self.clients_per_region):
                rng = random.Random(self.rng.getrandbits(64))  # noqa: S311 - as above
                name = f"{rc.region}/{i}"
                self._tasks.append(asyncio.create_task(self._client(rc, name, rng), name=name))

    async def stop(self) -> None:
        self._stop.set()
        for rc in self.regions.values():
            rc.unpause()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=OP_TIMEOUT_S * 4)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for rc in self.regions.values():
            await rc.close()

    async def _client(self, rc: RegionClients, name: str, rng: random.Random) -> None:
        for _ in range(1_000_000):  # bounded; stopped long before
            if self._stop.is_set():
                return
            await self._write(rc, name, rng.choice(self.datasets))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    async def _write(self, rc: RegionClients, name: str, dataset: str) -> None:
        op_id = History.new_id("w")
        inv = self.history.invoke(name, "write", rc.region, dataset, op_id, op_id, digest=op_id)
        owner = await rc.owner_here(dataset, OP_TIMEOUT_S)
        if isinstance(owner, str):
            self.history.complete(inv, "fail", error=owner)
            return
        payload: dict[str, object] = {"id": op_id, "region": rc.region, "kind": "workload"}
        try:
            await asyncio.to_thread(
                self.fence.write, dataset, owner.epoch, payload, f"{rc.region}-client"
            )
        except (StaleEpochError, DatasetHandingOverError) as exc:
            self.history.complete(inv, "fail", error=str(exc)[:200], epoch=owner.epoch)
            return
        self.history.complete(
            inv, "ok", epoch=owner.epoch, version=version_of(owner.epoch, rc.region)
        )

    # -- what the checkers read --------------------------------------------------------------
    def accept_log(self) -> list[AcceptRecord]:
        return parse_accepts(DirectoryEpochs(self.fence_dir).read_log(), str(self.fence_dir))

    def final_state(self) -> list[ObjectState]:
        out = []
        for line in DirectoryEpochs(self.fence_dir).read_log():
            if line.get("accepted") and line.get("kind") == "workload":
                epoch, region = line["epoch"], str(line["region"])
                out.append(
                    ObjectState(
                        FENCE_REGION,
                        str(line["dataset"]),
                        str(line["id"]),
                        version_of(int(epoch), region),  # type: ignore[call-overload]
                        str(line["id"]),
                    )
                )
        return out


class OwnerSampler:
    """Reads every owner record (directly, not through a region) every `interval_s`."""

    def __init__(self, endpoints: list[str], interval_s: float = 0.1) -> None:
        self.endpoints = endpoints
        self.interval_s = interval_s
        self.samples: list[OwnerSample] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="owner-sampler")

    async def _run(self) -> None:
        coord = EtcdCoordination(self.endpoints, timeout_s=1.0)
        try:
            for _ in range(1_000_000):
                if self._stop.is_set():
                    return
                try:
                    await asyncio.wait_for(coord.connect(), 2)
                    owners = await asyncio.wait_for(Ownership(coord).list(), 2)
                except (MeridianError, TimeoutError, OSError):
                    owners = None  # quorum lost: no sample, which says nothing
                now = time.time()
                for ds, o in (owners or {}).items():
                    self.samples.append(OwnerSample(ds, o.region, o.epoch, now))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval_s)
        finally:
            with contextlib.suppress(Exception):
                await coord.close()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def latest(self) -> dict[str, OwnerSample]:
        out: dict[str, OwnerSample] = {}
        for s in self.samples:
            out[s.dataset] = s
        return out
