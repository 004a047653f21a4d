"""Which Kafka offsets may be committed, when events finish out of order.

Events of different objects run concurrently, so a later offset of a partition may
finish before an earlier one. An offset is committable only when it and every
earlier offset taken from that partition are done: `committable()` gives, per
partition, the highest such offset (the consumer commits the one after it). A
partition revoked by a rebalance is forgotten: its new owner replays from the
last commit, and the replay is a no-op (LWW in the agent).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _Partition:
    taken: list[int] = field(default_factory=list)  # heap of offsets taken, not yet done
    pending: set[int] = field(default_factory=set)  # the same, not yet said done
    done: set[int] = field(default_factory=set)
    last_done: int | None = None  # the highest offset with everything up to it done
    committed: int | None = None  # the last offset handed out by `committable`


class OffsetTracker:
    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition] = {}

    def take(self, tp: TopicPartition, offset: int) -> None:
        """An event at `offset` was taken for processing (in offset order per partition)."""
        part = self._parts.setdefault(tp, _Partition())
        heapq.heappush(part.taken, offset)
        part.pending.add(offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        """The event at `offset` has its durable effect; ignored for a revoked partition."""
        part = self._parts.get(tp)
        if part is None:
            return
        if offset not in part.pending:
            return  # said done already (a run applied again): kept, it would never go
        part.pending.discard(offset)
        part.done.add(offset)
        while part.taken and part.taken[0] in part.done:
            first = heapq.heappop(part.taken)
            part.done.discard(first)
            part.last_done = first

    def committable(self) -> dict[TopicPartition, int]:
        """Per partition, the highest offset safe to commit that was not handed out yet."""
        out: dict[TopicPartition, int] = {}
        for tp, part in self._parts.items():
            if part.last_done is not None and part.last_done != part.committed:
                out[tp] = part.last_done
        return out

    def committed(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.get(tp)
        if part is not None:
            part.committed = offset

    def in_flight(self, tps: set[TopicPartition] | None = None) -> int:
        return sum(len(p.taken) for tp, p in self._parts.items() if tps is None or tp in tps)

    def forget(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            self._parts.pop(tp, None)
