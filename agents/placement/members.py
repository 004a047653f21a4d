"""A region's live agents as one immutable snapshot, and its copy count `r`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.placement import hrw

# Registration states (agents/daemon/registration.py's `state` field): a `leaving`
# agent (SIGTERM, draining) still serves reads but owns nothing.
SERVING = "serving"
LEAVING = "leaving"


@dataclass(frozen=True, slots=True)
class Member:
    """One agent's registration (`/meridian/agents/<region>/<id>`)."""

    agent_id: str
    endpoint: str
    weight: int = 1
    objects: int = 0
    bytes_stored: int = 0
    state: str = SERVING
    rebalance_bytes: int = 0
    rebalance_objects: int = 0
    # The etcd lease the registration is on (0: not known). It names this one
    # registration: a restarted agent registers on a new lease under the same key, so
    # marking the agent down by revoking this lease never removes its successor
    # (agents/placement/fastfail.py).
    lease: int = 0
    # The serving agent ids its last settled rebalance pass ran under (the `settled`
    # field): a roster clear waits until every agent settled under the current ones
    # (agents/placement/departures.py).
    settled: tuple[str, ...] = ()

    @classmethod
    def from_registration(cls, value: bytes, lease: int = 0) -> Member | None:
        """The member a registration names (on `lease`); None for a value that is not one
        (a foreign or half-written key is skipped rather than trusted)."""
        doc = json_object(value)
        if doc is None:
            return None
        agent_id, endpoint = doc.get("id"), doc.get("endpoint")
        if not isinstance(agent_id, str) or not agent_id or not isinstance(endpoint, str):
            return None
        found = doc.get("rebalance")
        rebalance: dict[str, object] = found if isinstance(found, dict) else {}
        return cls(
            agent_id=agent_id,
            endpoint=endpoint,
            weight=_int(doc.get("weight"), 1),
            objects=_int(doc.get("objects"), 0),
            bytes_stored=_int(doc.get("bytes"), 0),
            state=str(doc.get("state") or SERVING),
            rebalance_bytes=_int(rebalance.get("remaining_bytes"), 0),
            rebalance_objects=_int(rebalance.get("remaining_objects"), 0),
            lease=lease,
            settled=_ids(doc.get("settled")),
        )


def json_object(value: bytes) -> dict[str, object] | None:
    """The JSON object an etcd value holds; None for anything else (not JSON, or not an
    object), which the callers treat as a value that names nothing."""
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _ids(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(sorted(v for v in value if isinstance(v, str)))


def _int(value: object, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )


def copies_for(serving: int, configured: int | None) -> int:
    """`r` of a region: the configured count (default 2 where the region has two or
    more agents), never more than the agents that serve, and 1 for a lone agent."""
    wanted = configured if configured is not None else 2
    return max(1, min(wanted, serving))


@dataclass(frozen=True)
class Members:
    """The agents of `region` at etcd `revision`: `all` registered (by id), of which the
    `serving` ones own objects. `configured_r` is the region's setting (None: default)."""

    region: str
    all: Mapping[str, Member] = field(default_factory=dict)
    revision: int = 0
    configured_r: int | None = None

    @property
    def serving(self) -> list[Member]:
        return [m for _, m in sorted(self.all.items()) if m.state != LEAVING]

    @property
    def r(self) -> int:
        return copies_for(len(self.serving), self.configured_r)

    def owners(self, dataset: str, key: str) -> list[Member]:
        """The object's owners, primary first (empty when no agent serves)."""
        return hrw.owners(dataset, key, self.serving, self.r)

    def owner_ids(self, dataset: str, key: str) -> tuple[str, ...]:
        return tuple(m.agent_id for m in self.owners(dataset, key))

    def get(self, agent_id: str) -> Member | None:
        return self.all.get(agent_id)
