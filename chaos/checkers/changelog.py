"""Change log: each event applied exactly once in each region, per-object order kept.

From the published events (read back from `meridian.changes`) and the
replicators' apply records:
* every event has exactly one record in every destination region (its origin
  region excepted) — none is a lost event, two or more a duplicated effect
  (at most one record may be `applied`; a replayed event must be `superseded`);
* in each region, the versions `applied` to one object strictly increase in
  record order (a region never applies an older version over a newer one);
* each region applied one object's events in published (offset) order (a replay
  after a crash re-reads older offsets; it must have no effect, so only `applied`
  records count for the order). An event may be in the log more than once: an
  agent killed between publishing and marking it sent publishes it again after
  its restart, with the same `event_id` (dataplane.md allows it). Its record does
  not say which copy it came from, so an applied event is in order when one of its
  offsets can be (the earliest one not before the object's previous effect).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from chaos.checkers.verdict import Verdict
from chaos.records import ApplyRecord, PublishedEvent

NAME = "change-log-exactly-once"


def check(
    published: Iterable[PublishedEvent],
    applies: Iterable[ApplyRecord],
    destinations: Mapping[str, Sequence[str]],
) -> Verdict:
    """`destinations`: dataset -> the regions whose replicators must process it."""
    events: dict[str, PublishedEvent] = {}
    offsets: dict[str, list[int]] = {}
    for e in published:
        events.setdefault(e.event_id, e)
        offsets.setdefault(e.event_id, []).append(e.offset)
    records = sorted(applies, key=lambda a: a.t)
    problems: list[str] = []
    by_region_event: dict[tuple[str, str], list[ApplyRecord]] = {}
    for a in records:
        by_region_event.setdefault((a.region, a.event_id), []).append(a)
        if a.event_id not in events:
            problems.append(f"{a.region} recorded event {a.event_id}, which was never published")
    for e in events.values():
        for region in destinations.get(e.dataset, ()):
            if region == e.origin:
                continue
            got = by_region_event.get((region, e.event_id), [])
            applied = [a for a in got if a.outcome == "applied"]
            if not got:
                problems.append(f"{region} never processed {e.event_id} ({e.dataset}/{e.key})")
            elif len(applied) > 1:
                problems.append(
                    f"{region} applied {e.event_id} ({e.dataset}/{e.key}) {len(applied)} times"
                )
    newest: dict[tuple[str, str, str], str] = {}
    last_offset: dict[tuple[str, str, str], int] = {}
    for a in records:
        obj = (a.region, a.dataset, a.key)
        if a.outcome == "applied":
            prev = newest.get(obj)
            if prev is not None and a.version <= prev:
                problems.append(f"{a.region} applied {a.dataset}/{a.key} {a.version} after {prev}")
            newest[obj] = max(prev or a.version, a.version)
        # Only effects must follow the log's order: a replicator restarted after a crash
        # re-reads from its committed offset, and those replays are no-ops (superseded).
        if a.outcome == "applied" and a.event_id in offsets:
            before = last_offset.get(obj, -1)
            fits = [o for o in offsets[a.event_id] if o >= before]
            if fits:
                last_offset[obj] = min(fits)
            else:
                problems.append(
                    f"{a.region} processed {a.dataset}/{a.key} offset "
                    f"{max(offsets[a.event_id])} after {before}"
                )
    return Verdict.of(NAME, problems, f"{len(events)} events, each applied once per region")
