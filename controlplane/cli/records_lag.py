"""How far behind each region's records in the catalog are (spec/dataplane.md,
*Records*: `audit` and `replication status` say it).

Every agent publishes, in its etcd registration, the age of the oldest journal
record its recorder has not yet shipped to the catalog (`records_behind_s`,
rewritten every usage interval). A region's figure is the largest of its agents'.
What the catalog answers about a region is complete up to about that many seconds
ago. An agent that is down has no registration: what it journaled and did not ship
is unknown here until it is back (its recorder then ships it).

etcd is read once, with a short bound, and a command that reads the catalog still
answers when etcd cannot: the figures are then unknown (None), and said so.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from agents.daemon.registration import records_behind
from controlplane.coordination.protocols import keys
from controlplane.errors import MeridianError

if TYPE_CHECKING:
    from controlplane.settings import Settings

READ_BOUND_S = 2.0  # an audit against a catalog, with etcd out of reach, is not held up


class RecordsLag:
    """Per region, seconds behind (None: etcd could not say)."""

    def __init__(self, behind: dict[str, float] | None, why: str = "") -> None:
        self.behind = behind
        self.why = why

    def of(self, region: str) -> float | None:
        return None if self.behind is None else self.behind.get(region)

    def say(self) -> None:
        """One line on stderr per region whose records lag, or why it is unknown (stdout
        keeps its one document)."""
        if self.behind is None:
            sys.stderr.write(f"records lag unknown: {self.why}\n")
            return
        for region, seconds in sorted(self.behind.items()):
            if seconds > 0:
                sys.stderr.write(
                    f"note: {region}'s records in the catalog are {seconds:g} s behind; "
                    "what happened there since may not show yet\n"
                )


def lag_from(values: list[bytes]) -> dict[str, float]:
    """The regions' figures from their agents' registration values: each region's
    largest."""
    out: dict[str, float] = {}
    for published in records_behind(values):
        out[published.region] = max(out.get(published.region, 0.0), published.seconds)
    return out


async def records_lag(settings: Settings) -> RecordsLag:
    """Read the registrations of every region's agents from etcd, bounded."""
    from controlplane.adapters.etcd import EtcdCoordination

    endpoints = [f"{h}:{p}" for h, p in settings.etcd_endpoints]
    coord = EtcdCoordination(endpoints, timeout_s=min(settings.etcd_timeout_s, READ_BOUND_S))
    try:
        async with asyncio.timeout(READ_BOUND_S):  # the client retries a refused call
            await coord.connect()
            kvs, _ = await coord.get_prefix(keys.AGENTS)
    except MeridianError as exc:
        return RecordsLag(None, f"etcd at {', '.join(endpoints)} did not answer ({exc})")
    except TimeoutError:
        return RecordsLag(
            None, f"etcd at {', '.join(endpoints)} did not answer within {READ_BOUND_S:g} s"
        )
    finally:
        await coord.close()
    return RecordsLag(lag_from([kv.value for kv in kvs]))
