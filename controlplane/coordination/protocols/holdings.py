"""What each agent holds of each critical dataset, as published in etcd for failover.

Key: `/meridian/holdings/<dataset>/<region>/<agent id>`, on the agent's lease (so a
dead agent's record goes with it, and only live holders are ever compared). Value
(JSON):

    {"dataset", "region", "agent", "endpoint",
     "objects":  objects listed (tombstones included),
     "newest":   the highest HLC among their newest versions (text), or null,
     "digest":   "blake2b:<hex>" of the listing (each object's key, newest HLC and
                 content digest, in key order): two agents with the same digest
                 hold the same newest versions, so they need not be listed,
     "epoch":    the newest epoch of the dataset this agent has seen (its fence),
     "at":       when it was computed (RFC 3339),
     "unacked":  ["key@hlc", ...] versions it committed as the owner whose ack
                 failed (their clients were told to retry) and that are still the
                 newest of their object here: never acked, so never "lost"}

The agent rewrites it after commits (agents/daemon/holdings.py: polled, batched,
written only when it changed). The failover controller reads the records of the
candidate regions to prefer the one that holds every acked version
(controlplane/controller/holdings_choice.py). A record is a summary: it says
*whether* two holders differ; which versions one lacks comes from the agents'
listings, read only when the summaries differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.coordination.protocols.keys import ROOT
from controlplane.ports.coordination import Coordination

HOLDINGS = ROOT + "holdings/"
EMPTY_DIGEST = "blake2b:" + hashlib.blake2b(b"", digest_size=16).hexdigest()


def holding_key(dataset: str, region: str, agent_id: str) -> str:
    return f"{HOLDINGS}{dataset}/{region}/{agent_id}"


def holdings_of(dataset: str) -> str:
    """The prefix of a dataset's records. A longer dataset name can share it (names
    hold `/`), so readers keep only the records whose value names `dataset`."""
    return f"{HOLDINGS}{dataset}/"


@dataclass(frozen=True, slots=True)
class HoldingRecord:
    dataset: str
    region: str
    agent: str
    endpoint: str
    objects: int
    newest: str | None
    digest: str
    epoch: int
    at: str
    unacked: tuple[str, ...] = ()

    def value(self) -> bytes:
        return json.dumps(
            {
                "dataset": self.dataset,
                "region": self.region,
                "agent": self.agent,
                "endpoint": self.endpoint,
                "objects": self.objects,
                "newest": self.newest,
                "digest": self.digest,
                "epoch": self.epoch,
                "at": self.at,
                "unacked": list(self.unacked),
            },
            sort_keys=True,
        ).encode()

    def same_holding(self, other: HoldingRecord) -> bool:
        """The same listing (what `at` and the agent's identity do not change)."""
        return (self.objects, self.newest, self.digest, self.epoch, self.unacked) == (
            other.objects,
            other.newest,
            other.digest,
            other.epoch,
            other.unacked,
        )


def decode(raw: bytes) -> HoldingRecord | None:
    """The record, or None for a value this release cannot read (ignored, not fatal:
    the chooser then lists that region's agent instead)."""
    try:
        doc = json.loads(raw)
        newest = doc["newest"]
        return HoldingRecord(
            dataset=str(doc["dataset"]),
            region=str(doc["region"]),
            agent=str(doc["agent"]),
            endpoint=str(doc["endpoint"]),
            objects=int(doc["objects"]),
            newest=None if newest is None else str(newest),
            digest=str(doc["digest"]),
            epoch=int(doc["epoch"]),
            at=str(doc["at"]),
            unacked=tuple(str(u) for u in doc.get("unacked", ())),
        )
    except (ValueError, KeyError, TypeError):
        return None


def listing_digest(entries: Iterable[tuple[str, str, str]]) -> str:
    """The digest of a listing of `(key, newest HLC text, content digest or "")`, given
    in key order (the store lists in key order)."""
    h = hashlib.blake2b(digest_size=16)
    for key, hlc, digest in entries:
        h.update(f"{len(key)}:{key}\0{hlc}\0{digest}\n".encode())
    return "blake2b:" + h.hexdigest()


async def read_holdings(coord: Coordination, dataset: str) -> dict[str, list[HoldingRecord]]:
    """The live records of `dataset`, by region (a region may have several agents)."""
    kvs, _ = await coord.get_prefix(holdings_of(dataset))
    out: dict[str, list[HoldingRecord]] = {}
    for kv in kvs:
        rec = decode(kv.value)
        if rec is not None and rec.dataset == dataset:
            out.setdefault(rec.region, []).append(rec)
    return out
