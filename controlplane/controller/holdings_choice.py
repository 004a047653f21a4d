"""`HoldingsChooser`: which live candidate holds every acked version, from the agents.

Reads the records the agents publish in etcd (coordination/protocols/holdings.py).
When every live holder of the dataset has the same listing digest, nothing is
listed: every candidate with a record lacks nothing. Otherwise one agent per
distinct digest is listed (`AgentClient.list`, tombstones included, routed through
`Settings.agent_address`), and each candidate's standing is what it lacks of the
union (orchestration/prefer.py). The records of regions that are not candidates
(a replica outside `failover.order`, the old owner's agent still alive behind a
dead controller) count in the union too: what they hold was acked or may have been.

`assess` returns None when no agent published a record of the dataset (no data
plane: a control-plane-only deployment); callers then keep their order and the
catalog's measure of the exposure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agents.client import AgentClient
from controlplane.coordination.orchestration.prefer import (
    Assessment,
    Listing,
    Standing,
    forgotten_deletes,
    missing_from,
    union_newest,
)
from controlplane.coordination.protocols.holdings import HoldingRecord, read_holdings
from controlplane.errors import MeridianError
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination

log = get_logger("meridian.controller.holdings")

Route = Callable[[str, str], str]


def _direct(_region: str, address: str) -> str:
    return address


class HoldingsChooser:
    def __init__(
        self, coord: Coordination, route: Route = _direct, *, timeout_s: float = 5.0
    ) -> None:
        self._coord = coord
        self._route = route
        self._timeout_s = timeout_s

    async def assess(self, dataset: str, candidates: Sequence[str]) -> Assessment | None:
        records = await read_holdings(self._coord, dataset)
        if not records:
            return None
        holders = tuple(sorted(records))
        digests = {r.digest for recs in records.values() for r in recs}
        if len(digests) == 1:
            return Assessment(
                {c: Standing(c, () if c in records else None) for c in candidates},
                "records",
                holders,
            )
        listings = await self._listings(records)
        # A version its owner marked unacked (its client was told to retry) is not lost
        # when the new owner lacks it: leave it out of what must be held.
        unacked = {u for recs in records.values() for r in recs for u in r.unacked}
        union = union_newest(
            {k: ver for k, ver in listing.items() if f"{k}@{ver.hlc}" not in unacked}
            for listing in listings.values()
        )
        # A delete is lacking only where an older version of its key may still show:
        # unless every holder was listed, anywhere.
        listed = all(r.digest in listings for recs in records.values() for r in recs)
        forgotten = forgotten_deletes(union, listings.values()) if listed else set()
        standings: dict[str, Standing] = {}
        for c in candidates:
            best: tuple[str, ...] | None = None
            for rec in records.get(c, []):
                listing = listings.get(rec.digest)
                if listing is None:
                    continue
                missing = missing_from(union, listing, forgotten)
                if best is None or len(missing) < len(best):
                    best = missing
            standings[c] = Standing(c, best)
        return Assessment(standings, "listings", holders)

    async def _listings(self, records: dict[str, list[HoldingRecord]]) -> dict[str, Listing]:
        """One listing per distinct digest (agents with equal digests list the same)."""
        one: dict[str, HoldingRecord] = {}
        for recs in records.values():
            for rec in recs:
                one.setdefault(rec.digest, rec)

        async def fetch(rec: HoldingRecord) -> tuple[str, Listing | None]:
            address = self._route(rec.region, rec.endpoint)
            try:
                async with asyncio.timeout(self._timeout_s), AgentClient(address) as client:
                    objs = await client.list(rec.dataset, include_deleted=True)
            except (MeridianError, TimeoutError, OSError) as exc:
                log.warning(
                    "holdings_listing_failed",
                    dataset=rec.dataset,
                    region=rec.region,
                    agent=rec.agent,
                    error=str(exc) or type(exc).__name__,
                )
                return rec.digest, None
            return rec.digest, {o.key: o.version for o in objs}

        found = await asyncio.gather(*(fetch(r) for r in one.values()))
        return {d: listing for d, listing in found if listing is not None}
