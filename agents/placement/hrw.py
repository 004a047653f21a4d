"""The placement function: weighted rendezvous (highest random weight) hashing.

Each (object, agent) pair gets a draw `ln(u) / weight`, with `u` a uniform number in
(0, 1) derived from a 64-bit hash of the object's name and the agent's id; the `r`
agents with the highest draws own the object, best first. This is Ceph's straw2
bucket (CRUSH), chosen over a consistent-hash ring with virtual nodes (Dynamo,
Cassandra's vnodes) because:

- **minimal movement is exact, not statistical**: an object's draw against an agent
  depends on that pair alone, so when an agent leaves only the objects it held move
  (each to the agent that was next in its order), and when one joins only the objects
  whose draw it wins move to it; a weight change moves objects only to or from that
  agent. A ring moves the same expected amount but with vnode-count-dependent noise;
- **weights are honoured exactly in expectation**: P(agent i wins) = w_i / sum(w),
  because `ln(u)/w` is `-Exp(w)` and the largest of independent exponentials is
  drawn in proportion to their rates; a ring needs vnodes in proportion to weight
  (integers, rebuilt tables) and stays lumpy unless there are hundreds per node;
- **no state**: nothing to build, store, or agree on beyond the member list itself;
  every agent and any client computes the same owners from the registrations.

Its cost, O(agents) hashes per lookup, is nothing for a region of tens of agents
(16 agents: ~10 us per object in Python); for thousands, hash into a few hundred
straw2 buckets first (CRUSH's hierarchy) - not needed yet.

The hash: blake2b-64 of `dataset NUL key` (once per object) and of the agent id (once
per agent), combined by xor and finished with the splitmix64 mixer so every pair is
an independent-looking 64-bit number; its top 53 bits give `u`. The numbers are part
of the contract (every agent must compute the same owners): `tests/placement`
pins a few.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

_MASK = (1 << 64) - 1
_TWO_53 = float(1 << 53)


class Weighted(Protocol):
    @property
    def agent_id(self) -> str: ...

    @property
    def weight(self) -> int: ...


M = TypeVar("M", bound=Weighted)


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def placement_key(dataset: str, key: str) -> int:
    """The 64-bit name of an object for placement (`dataset NUL key`)."""
    return hash64(dataset.encode() + b"\0" + key.encode())


@functools.lru_cache(maxsize=4096)
def agent_seed(agent_id: str) -> int:
    return hash64(b"agent\0" + agent_id.encode())


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit numbers with full avalanche."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def draw(object_hash: int, seed: int, weight: int) -> float:
    """straw2's draw of one agent for one object: `ln(u) / weight` (higher wins)."""
    u = ((mix64(object_hash ^ seed) >> 11) + 0.5) / _TWO_53  # in (0, 1), never 0
    return math.log(u) / weight


def rank(object_hash: int, members: Sequence[M]) -> list[M]:
    """Every member with a positive weight, best first (ties, never seen in practice,
    broken by agent id so the order is total)."""
    scored = [
        (draw(object_hash, agent_seed(m.agent_id), m.weight), m.agent_id, m)
        for m in members
        if m.weight > 0
    ]
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [m for _, _, m in scored]


def owners(dataset: str, key: str, members: Sequence[M], r: int) -> list[M]:
    """The `r` owners of `dataset/key` among `members`, best (the primary) first; fewer
    when the region has fewer agents."""
    return rank(placement_key(dataset, key), members)[: max(r, 0)]
