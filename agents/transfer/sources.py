"""Source choice: the holders of a version, nearest first by the link RTT the
applied policy declares (CompiledPolicy.nearest), in the caller's order where the
RTTs tie or are unknown, so a Fetch falls back to the next nearest on failure."""

from __future__ import annotations

from collections.abc import Sequence

from agents.transfer.ports import PolicySource
from agents.transfer.pull import Source


def order_sources(region: str, sources: Sequence[Source], policy: PolicySource) -> list[Source]:
    current = policy()
    if current is None:
        return list(sources)
    rank = {name: n for n, name in enumerate(current.nearest(region, {s.region for s in sources}))}
    # Stable: several agents of one region keep the order they were given in.
    return sorted(sources, key=lambda s: rank[s.region])
