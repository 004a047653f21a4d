"""One change event, from its Kafka record to its durable effect in this region.

The pipeline of dataplane.md, *The replicator*, for one record:

1. decode; bytes that are no valid `ChangeEvent` → dead letter `undecodable`;
2. an event this region wrote itself → nothing to do;
3. residency guard (guard.py) on the current policy snapshot: not governed, or not
   for this region → no copy; a region the placement names but whose jurisdiction is
   outside the residency → refused: recorded as a refused transfer, dead-lettered
   (`residency`), counted; no byte moves;
4. clock-skew quarantine: an HLC more than `max_clock_skew_ms` ahead of our clock →
   dead letter `clock skew`, counted;
5. `deletes: retain` → the tombstone is recorded, the copy stays;
6. LWW and the copy, in the agent (ports.AgentPort): inline bytes or a delete via
   `apply_inline`/`delete`, otherwise `fetch` from the holders nearest first. The
   agent decides by `lww()` and commits durably before it answers, so a replay of
   the event (redelivery, rebalance, a crash before the offset commit) is a no-op;
7. record: a failed attempt journals the replica `pending` with its error and is
   retried with exponential backoff and jitter; after `max_attempts` it is `failed`
   (re-driven by `meridian replication resync`); a held version is `completed`
   (unless the agent applied it in a batch call: its own journal says so, see
   journal.py).

`handle_many` runs the same pipeline over a run of records (each partition's in log
order): steps 1-5 record by record, then the inline puts and deletes that reach step 6 go
to the agent in one `apply_many` call (one store transaction and one syncfs there),
at most one event per object per call (a second event of an object waits for the
next call, so each object's events still apply in log order); fetches run beside it.
An item the agent refuses takes the one-by-one path (its retries, its records).

A version set's event (`SetEvent`, schema 2) takes steps 1-4 the same way (the
residency guard on its dataset, the skew check on the set's HLC), then goes to the
agent's `apply_set` (ReplicateSet, epoch 0): LWW per set id on the set's HLC, the
set recorded at once and visible only once every member is stored here. Its members
are events of their own, applied as any, before or after it. A replay is `same`. It
journals nothing when applied (the agent's journal records the set in the same
transaction, and the catalog keeps no sets); a refusal journals a refused transfer
of `/set/<id>`. A retriable failure (the agent away, a handover) is retried with
backoff without end, as the agent being away is: a set has no replica state in the
catalog to mark `failed` and re-drive by resync, and a set dropped here would never
show in this region. A final one is dead-lettered (`rejected`) with its reason.

`handle` returns only once the effect is durable (the agent's commit, the journal
row, the dead letter acknowledged), so the caller may then commit the offset; it
never raises except when cancelled (then nothing is committed and the event is
replayed).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from agents.errors import ResidencyError
from controlplane.domain.errors import ClockSkewError, MessageError
from controlplane.domain.events import ChangeEvent, LogEvent, SetEvent
from controlplane.domain.hlc import HybridClock
from controlplane.errors import FencedError, MeridianError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.changelog import Record
from meridian.convert import decode_log_event
from replicator import dlq
from replicator.coalesce import CoalescedCalls
from replicator.config import ReplicatorConfig
from replicator.guard import Admission, Decision, admit, sources_for
from replicator.journal import RecordJournal, ReplicaRecord
from replicator.metrics import ReplicatorMetrics
from replicator.ports import AgentPort, ApplyOutcome, ApplyResult, SetApplyResult, SetPort, Source

log = get_logger("meridian.replicator")

# How long the catalog may take to name an object's other holders, and how long it is
# not asked again once it did not answer (see Applier._call).
HOLDERS_WAIT_S = 1.0
HOLDERS_SKIP_S = 30.0
# How long an event written under a revision the policy view has not reached waits
# for it before it is decided on the view's snapshot (see Applier._decided).
POLICY_BEHIND_MAX_S = 10.0  # a view follows etcd within a second; the backfill covers the rest

# Events of a batch the agent could not take at once go one by one, this many at a time.
_SINGLES_AT_ONCE = 4
_R = TypeVar("_R")


class HolderLookup(Protocol):
    async def holders(self, event: ChangeEvent) -> list[Source]:
        """Agents of other regions known to hold the event's version (best effort)."""
        ...


def utcnow() -> datetime:
    return datetime.now(UTC)


class Applier:
    def __init__(
        self,
        config: ReplicatorConfig,
        *,
        agent: AgentPort,
        journal: RecordJournal,
        dead_letters: dlq.DeadLetters,
        policy: Callable[[], CompiledPolicy],
        metrics: ReplicatorMetrics,
        clock: HybridClock | None = None,
        holders: HolderLookup | None = None,
        sets: SetPort | None = None,
        on_record: Callable[[], None] = lambda: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        published_revision: Callable[[], Awaitable[int | None]] | None = None,
    ) -> None:
        self.config = config
        self.region = config.region
        self._agent = agent
        self._journal = journal
        self._dlq = dead_letters
        self._policy = policy
        self._metrics = metrics
        self._clock = clock or HybridClock(
            config.region, max_clock_skew_ms=config.max_clock_skew_ms
        )
        self._holders = holders
        self._sets = sets
        self._on_record = on_record
        self._sleep = sleep
        # Told the dataset of each event not copied here (skipped or refused), before
        # the event is reported done: the backfill's `forget` (backfill.py).
        self.on_not_copied: Callable[[str], Awaitable[None]] | None = None
        self._refused_told: set[tuple[str, int]] = set()  # (dataset, revision) told once
        self._decided_under: CompiledPolicy | None = None
        # Runs waiting for a free call merge into it (coalesce.py): one call per run
        # queued 64 small runs behind 2 calls under a trickle of events.
        self._batch_calls = CoalescedCalls(
            agent.apply_many,
            max_calls=config.max_batch_calls,
            max_events=config.batch_max_events,
            max_bytes=config.batch_max_bytes,
        )
        self._decisions: dict[str, Decision] = {}
        # Revisions of events the policy view has not reached, since when (monotonic);
        # and those etcd was seen not to hold, with the view's revision then: the verdict
        # holds only while the view stays there (a view that moved on means etcd did too,
        # and it may hold that revision now).
        self._behind_since: dict[int, float] = {}
        self._behind_decided: set[int] = set()  # their bound passed (said once each)
        self._published_asked: dict[int, float] = {}  # when etcd was last asked (monotonic)
        self._unpublished: dict[int, int] = {}
        self._holders_after = 0.0  # monotonic: holders are not asked before then
        self._published_revision = published_revision

    # -- the pipeline --------------------------------------------------------------------
    async def handle(self, record: Record) -> str:
        """Apply one record; return what became of it (a label, also counted)."""
        try:
            decoded = decode_log_event(record.value)
        except MessageError as exc:
            await self._dead_letter(record, dlq.UNDECODABLE, str(exc))
            result = "dead-lettered"
        else:
            if isinstance(decoded, SetEvent):
                result = await self._handle_set(record, decoded)
                self._metrics.events.labels(result).inc()
                return result
            event = decoded
            result = await self._handle(record, event)
            # One line per event, whatever became of it: the chaos suite's change-log
            # checker reads these (exactly once per region, per-object order).
            log.info(
                "event_applied",
                region=self.region,
                event_id=event.event_id,
                dataset=event.dataset,
                key=event.key,
                version=str(event.version.hlc),
                outcome=result,
                t=time.time(),
            )
        self._metrics.events.labels(result).inc()
        return result

    async def handle_many(
        self,
        records: Sequence[Record],
        on_done: Callable[[Sequence[int]], None] = lambda _: None,
    ) -> list[str]:
        """`handle` for a run of records (each partition's in log order), batched (module
        docstring); what became of each, in order. Returns once every effect is durable.
        `on_done` is told the indices of records whose effect is durable (and logged)
        as soon as it is, before the rest of the run has finished: a slow fetch then
        holds back only its own partition's offsets, not every partition of the run."""
        if len(records) == 1:
            result = await self.handle(records[0])
            on_done([0])
            return [result]
        results: list[str] = [""] * len(records)
        reported: set[int] = set()

        def finish(indices: Sequence[int]) -> None:
            """Log and count these records' results (each once), then report them."""
            fresh = [n for n in indices if n not in reported]
            if not fresh:
                return
            # The module's logger is a lazy proxy that builds a bound logger at every
            # call (half of each line's cost): resolved once for this run's lines here.
            applied = log.bind()
            counts: dict[str, int] = {}
            for n in fresh:
                reported.add(n)
                result = results[n]
                counts[result] = counts.get(result, 0) + 1
                change = events.get(n)
                if change is not None:
                    applied.info(
                        "event_applied",
                        region=self.region,
                        event_id=change.event_id,
                        dataset=change.dataset,
                        key=change.key,
                        version=str(change.version.hlc),
                        outcome=result,
                        t=time.time(),
                    )
            for result, count in counts.items():
                self._metrics.events.labels(result).inc(count)
            on_done(fresh)

        events: dict[int, ChangeEvent] = {}
        rounds: list[list[tuple[int, CompiledPolicy]]] = []
        depth: dict[tuple[str, str], int] = {}
        sets: list[tuple[int, SetEvent]] = []
        for n, record in enumerate(records):
            try:
                decoded = decode_log_event(record.value)
            except MessageError as exc:
                await self._dead_letter(record, dlq.UNDECODABLE, str(exc))
                results[n] = "dead-lettered"
                continue
            if isinstance(decoded, SetEvent):
                sets.append((n, decoded))  # after the rounds, in log order (see below)
                continue
            event = events[n] = decoded
            got = await self._admit(record, event)
            if isinstance(got, str):
                results[n] = got
                continue
            # The k-th event of an object goes in round k: rounds run one after another.
            name = (event.dataset, event.key)
            k = depth[name] = depth.get(name, -1) + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append((n, got))
        for round_ in rounds:
            await self._apply_round(records, events, round_, results, finish)
        # One by one, in log order (one set id's events keep theirs); after the batch's
        # member events, which is only quicker: a set applies in any order to them.
        for n, set_event in sets:
            results[n] = await self._handle_set(records[n], set_event)
        finish(range(len(records)))  # the rest: decided without a copy, sets
        return results

    async def _apply_round(
        self,
        records: Sequence[Record],
        events: dict[int, ChangeEvent],
        round_: list[tuple[int, CompiledPolicy]],
        results: list[str],
        finish: Callable[[Sequence[int]], None],
    ) -> None:
        """Events of distinct objects: the batchable ones in `apply_many` calls (bounded
        by count and bytes), the others (fetches, set members) one by one, at once; each
        `finish`ed once its effect and its record are in (the journal is flushed before
        any offset is committed)."""
        batches: list[list[tuple[int, CompiledPolicy]]] = [[]]
        size = 0
        singles: list[tuple[int, CompiledPolicy]] = []
        for n, policy in round_:
            event = events[n]
            if event.set is not None or not (event.version.is_tombstone or event.inline):
                singles.append((n, policy))
                continue
            weight = len(event.inline or b"")
            if batches[-1] and (
                len(batches[-1]) >= self.config.batch_max_events
                or size + weight > self.config.batch_max_bytes
            ):
                batches.append([])
                size = 0
            batches[-1].append((n, policy))
            size += weight

        async def one(n: int, policy: CompiledPolicy) -> None:
            results[n] = await self._apply(records[n], events[n], policy)
            finish([n])

        async def one_by_one(items: list[tuple[int, CompiledPolicy]]) -> None:
            gate = asyncio.Semaphore(_SINGLES_AT_ONCE)  # not a burst of calls at the agent

            async def bounded(n: int, policy: CompiledPolicy) -> None:
                async with gate:
                    await one(n, policy)

            await asyncio.gather(*(bounded(n, policy) for n, policy in items))

        async def many(batch: list[tuple[int, CompiledPolicy]]) -> None:
            if len(batch) == 1:
                await one(*batch[0])
                return
            answers = await self._call_batch([events[n] for n, _ in batch])
            if answers is None:
                await one_by_one(batch)
                return
            retry: list[tuple[int, CompiledPolicy]] = []
            done: list[ReplicaRecord] = []
            settled: list[int] = []
            for (n, policy), answer in zip(batch, answers, strict=True):
                event = events[n]
                if isinstance(answer, ApplyResult):
                    # APPLIED in a batch: the agent committed this version with its
                    # journal rows (the version held here, its transfer), which its
                    # recorder ships to the catalog; a `completed` row of ours would
                    # only repeat them (journal.py), at a journal row and a catalog
                    # write per event.
                    journalled = answer.outcome is ApplyOutcome.APPLIED
                    results[n] = self._settle(event, answer, done, journalled=journalled)
                elif isinstance(answer, ResidencyError):
                    await self._refuse(records[n], event, str(answer), policy.revision)
                    results[n] = "refused"
                else:
                    retry.append((n, policy))
                    continue
                settled.append(n)
            if done:
                self._journal.append_many(done)
                self._on_record()
            finish(settled)
            await one_by_one(retry)

        await asyncio.gather(
            *(many(b) for b in batches if b), *(one(n, policy) for n, policy in singles)
        )

    async def _call_batch(self, events: list[ChangeEvent]) -> list[ApplyResult | Exception] | None:
        """The agent's answers to one batch, at most `max_batch_calls` calls at the agent
        at once (a busy agent gets a queue here, not a pile of calls that time out; the
        batches in that queue go out merged). A
        retriable failure of the whole call (the agent busy or away) retries the whole
        batch with backoff; after `max_attempts`, or a failure the call itself cannot
        get past (a malformed item, an agent without the call), None: one by one, on
        the single path's retries and records."""
        attempt = 0
        while True:
            try:
                return await self._batch_calls.submit(events)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the events go one by one then
                attempt += 1
                retriable = isinstance(exc, MeridianError) and exc.retriable
                if not retriable or attempt >= self.config.max_attempts:
                    log.info(
                        "batch_apply_failed",
                        events=len(events),
                        error=_describe(exc),
                        action="applying them one by one",
                    )
                    return None
                delay = self._backoff(attempt)
                log.info(
                    "batch_apply_retry",
                    events=len(events),
                    attempt=attempt,
                    error=_describe(exc),
                    retry_in_s=round(delay, 3),
                )
                await self._sleep(delay)

    async def _handle(self, record: Record, event: ChangeEvent) -> str:
        got = await self._admit(record, event)
        if isinstance(got, str):
            return got
        return await self._apply(record, event, got)

    async def _admit(self, record: Record, event: ChangeEvent) -> str | CompiledPolicy:
        """Steps 2-5: what became of the event when it needs no copy (a label), else the
        policy snapshot its copy is made under."""
        if event.origin_region == self.region:
            return "own"
        policy, decision = await self._decided(event)
        if decision.admission is Admission.REFUSED:
            await self._refuse(record, event, decision.reason, policy.revision)
            return "refused"
        if decision.admission is not Admission.ADMIT or decision.placement is None:
            log.debug(
                "event_skipped",
                event_id=event.event_id,
                dataset=event.dataset,
                key=event.key,
                reason=decision.reason,
            )
            await self._not_copied(event.dataset)
            return "skipped"
        try:
            self._clock.check_skew(event.version.hlc)
        except ClockSkewError as exc:
            await self._dead_letter(record, dlq.CLOCK_SKEW, str(exc), event)
            return "dead-lettered"
        if event.version.is_tombstone and decision.placement.deletes == "retain":
            # The delete is recorded (its tombstone version, processed here by policy);
            # the copy stays. See the report: this counts as the region's completed state.
            self._append(self._record(event, "completed"))
            log.info(
                "delete_retained",
                dataset=event.dataset,
                key=event.key,
                version=str(event.version.hlc),
                reason="the dataset's policy says deletes: retain",
            )
            return "retained"
        return policy

    async def _apply(self, record: Record, event: ChangeEvent, policy: CompiledPolicy) -> str:
        async def failed(exc: Exception, attempt: int) -> _Retry | str:
            error = _describe(exc)
            retriable = isinstance(exc, MeridianError) and exc.retriable
            if retriable and not await self._agent_answers(event):
                # Our own agent is away: no copy can succeed, and it is not this copy's
                # fault. Wait for it without spending an attempt (nothing is failed,
                # no offset moves) rather than mark every event failed.
                delay = self._backoff(4)
                log.warning("agent_unreachable", error=error, retry_in_s=round(delay, 3))
                return _Retry(delay, counts=False)
            # Anything but a Meridian error is retried too (an unknown failure may pass).
            final = isinstance(exc, MeridianError) and not exc.retriable
            if final or attempt == self.config.max_attempts:
                self._append(self._record(event, "failed", error=error, attempted=True))
                self._metrics.failed.labels(event.dataset, self.region).inc()
                log.warning(
                    "replica_failed",
                    event_id=event.event_id,
                    dataset=event.dataset,
                    key=event.key,
                    version=str(event.version.hlc),
                    attempts=attempt,
                    error=error,
                    action="marked failed; `meridian replication resync` re-drives it",
                )
                return "failed"
            self._append(self._record(event, "pending", error=error, attempted=True))
            self._metrics.retries.labels(event.dataset).inc()
            delay = self._backoff(attempt)
            log.info(
                "replica_retry",
                event_id=event.event_id,
                dataset=event.dataset,
                key=event.key,
                attempt=attempt,
                error=error,
                retry_in_s=round(delay, 3),
            )
            return _Retry(delay)

        result = await self._attempts(
            record, event, policy, lambda: self._call(event, policy), failed
        )
        return result if isinstance(result, str) else self._settle(event, result)

    async def _attempts(
        self,
        record: Record,
        event: LogEvent,
        policy: CompiledPolicy,
        call: Callable[[], Awaitable[_R]],
        failed: Callable[[Exception, int], Awaitable[_Retry | str]],
    ) -> _R | str:
        """The retry shape of an event's agent call (an object's version or a set): its
        answer, or the label the event ends with. A refused residency is recorded and
        dead-lettered; a stale epoch or a clock the agent refuses is dead-lettered. Any
        other failure of attempt N (from 1) goes to `failed`, which says how long to
        wait before the next attempt (and whether this one counted), or the label."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except ResidencyError as exc:
                await self._refuse(record, event, str(exc), policy.revision)
                return "refused"
            except FencedError as exc:  # a stale epoch (StaleEpochError) among them
                self._metrics.stale_epoch_refused.labels(event.dataset).inc()
                await self._dead_letter(record, dlq.STALE_EPOCH, str(exc), event)
                return "dead-lettered"
            except ClockSkewError as exc:  # the agent's clock refused it
                await self._dead_letter(record, dlq.CLOCK_SKEW, str(exc), event)
                return "dead-lettered"
            except Exception as exc:  # noqa: BLE001 - every failure is handled, none ends the loop
                decided = await failed(exc, attempt)
                if isinstance(decided, str):
                    return decided
                if not decided.counts:
                    attempt -= 1
                await self._sleep(decided.delay_s)

    async def _agent_answers(self, event: ChangeEvent) -> bool:
        """Whether this region's agent itself answers (a cheap `head`)."""
        try:
            await self._agent.head(event.dataset, event.key)
        except MeridianError as exc:
            return not exc.retriable
        except Exception:  # noqa: BLE001 - anything else: treat the agent as answering
            return True
        return True

    async def _call(self, event: ChangeEvent, policy: CompiledPolicy) -> ApplyResult:
        if event.version.is_tombstone:
            return await self._agent.delete(event)
        if event.inline is not None:
            return await self._agent.apply_inline(event)
        holders: Sequence[Source] = ()
        if self._holders is not None and time.monotonic() >= self._holders_after:
            # Other holders are an optimisation, asked of the catalog: bounded, and not
            # asked again for a while once it failed, so a catalog away (each call then
            # waits out a connect timeout, in a thread) never slows the fetches (the
            # data path does not need the catalog: dataplane.md).
            try:
                holders = await asyncio.wait_for(self._holders.holders(event), HOLDERS_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - the origin is asked anyway
                self._holders_after = time.monotonic() + HOLDERS_SKIP_S
                log.info(
                    "holders_unknown",
                    dataset=event.dataset,
                    error=_describe(exc),
                    skipped_for_s=HOLDERS_SKIP_S,
                )
        sources = sources_for(event, policy, self.region, holders)
        return await self._agent.fetch(event, sources)

    # -- version sets ------------------------------------------------------------------
    async def _handle_set(self, record: Record, event: SetEvent) -> str:
        """Steps 2-4 and the agent's `apply_set` for a version set's event (module
        docstring); what became of it, logged as `set_event_applied`."""
        result = await self._admit_set(record, event)
        if not isinstance(result, str):
            result = await self._apply_set(record, event, result)
        log.info(
            "set_event_applied",
            region=self.region,
            event_id=event.event_id,
            dataset=event.dataset,
            set=event.set_id,
            version=str(event.version_set.hlc),
            outcome=result,
            t=time.time(),
        )
        return result

    async def _admit_set(self, record: Record, event: SetEvent) -> str | CompiledPolicy:
        if event.origin_region == self.region:
            return "own"
        policy, decision = await self._decided(event)
        if decision.admission is Admission.REFUSED:
            await self._refuse(record, event, decision.reason, policy.revision)
            return "refused"
        if decision.admission is not Admission.ADMIT:
            log.debug(
                "event_skipped",
                event_id=event.event_id,
                dataset=event.dataset,
                set=event.set_id,
                reason=decision.reason,
            )
            await self._not_copied(event.dataset)
            return "skipped"
        hlc = event.version_set.hlc
        assert hlc is not None  # noqa: S101 - a SetEvent is stamped
        try:
            self._clock.check_skew(hlc)
        except ClockSkewError as exc:
            await self._dead_letter(record, dlq.CLOCK_SKEW, str(exc), event)
            return "dead-lettered"
        return policy

    async def _apply_set(self, record: Record, event: SetEvent, policy: CompiledPolicy) -> str:
        sets = self._sets
        if sets is None:
            await self._dead_letter(
                record, dlq.REJECTED, "this replicator has no agent call for version sets", event
            )
            return "dead-lettered"

        async def failed(exc: Exception, attempt: int) -> _Retry | str:
            error = _describe(exc)
            if isinstance(exc, MeridianError) and exc.retriable:
                delay = self._backoff(attempt)
                log.info(
                    "set_retry",
                    event_id=event.event_id,
                    dataset=event.dataset,
                    set=event.set_id,
                    attempt=attempt,
                    error=error,
                    retry_in_s=round(delay, 3),
                )
                return _Retry(delay)
            await self._dead_letter(record, dlq.REJECTED, error, event)
            return "dead-lettered"

        result = await self._attempts(record, event, policy, lambda: sets.apply_set(event), failed)
        return result if isinstance(result, str) else self._settle_set(event, result)

    def _settle_set(self, event: SetEvent, result: SetApplyResult) -> str:
        hlc = event.version_set.hlc
        assert hlc is not None  # noqa: S101 - a SetEvent is stamped
        with contextlib.suppress(ClockSkewError):
            self._clock.observe(hlc)
        if result.outcome is ApplyOutcome.COLLISION:
            log.warning(
                "set_collision",
                dataset=event.dataset,
                set=event.set_id,
                version=str(hlc),
                action="kept the set held (equal HLC is a no-op)",
            )
        elif result.outcome is ApplyOutcome.APPLIED and not result.complete:
            log.info(
                "set_waits_for_members",
                dataset=event.dataset,
                set=event.set_id,
                version=str(hlc),
                missing=len(result.missing),
                action="recorded; visible here once every member has arrived",
            )
        return result.outcome.value

    def _settle(
        self,
        event: ChangeEvent,
        result: ApplyResult,
        into: list[ReplicaRecord] | None = None,
        *,
        journalled: bool = False,
    ) -> str:
        """The label of `result`; a held version journals its replica `completed` (into
        `into`, else at once) unless `journalled` (the agent's own rows say so)."""
        # Checked before the apply, so it cannot refuse here; suppressed all the same.
        with contextlib.suppress(ClockSkewError):
            self._clock.observe(event.version.hlc)
        if result.outcome.holds_version and not journalled:
            done = self._record(event, "completed")
            if into is None:
                self._append(done)
            else:
                into.append(done)
        elif result.outcome is ApplyOutcome.COLLISION:
            log.warning(
                "hlc_collision",
                dataset=event.dataset,
                key=event.key,
                version=str(event.version.hlc),
                incoming=str(event.version.digest),
                held=str(result.held.digest if result.held else None),
                action="kept the version held (equal HLC is a no-op)",
            )
        return result.outcome.value

    # -- helpers ---------------------------------------------------------------------------
    def _decide(self, event: LogEvent, policy: CompiledPolicy) -> Decision:
        """`admit`, remembered per dataset for one policy snapshot (a placement lookup
        was the costliest step per event): another region's event is decided by its
        dataset alone; a new snapshot starts afresh."""
        if policy is not self._decided_under:
            self._decided_under, self._decisions = policy, {}
        decision = self._decisions.get(event.dataset)
        if decision is None:
            decision = self._decisions[event.dataset] = admit(event, policy, self.region)
        return decision

    async def _decided(self, event: LogEvent) -> tuple[CompiledPolicy, Decision]:
        """The decision on `event` under the current snapshot. A snapshot that cannot
        decide (its published rules do not rebuild, for a dataset first seen after the
        apply) fails closed as no snapshot does: the event waits, its offset is not
        committed, and a readable policy applied later decides it. Raised instead, it
        would end the whole batch undone, and its offsets would never be committed. A
        snapshot older than the revision the write was admitted under admits, or waits
        for that revision: it does not skip or refuse."""
        delay = self.config.retry_initial_s
        while True:
            policy = await self._current_policy()
            try:
                decision = self._decide(event, policy)
            except MeridianError as exc:
                log.warning(
                    "policy_cannot_decide",
                    dataset=event.dataset,
                    revision=policy.revision,
                    error=str(exc),
                    action="apply a readable policy (meridian policy apply)",
                    retry_in_s=delay,
                )
                await self._sleep(delay)
                delay = min(self.config.retry_max_s, delay * 2)
                continue
            if (
                decision.admission is Admission.ADMIT
                or event.policy_revision <= policy.revision
                or self._unpublished.get(event.policy_revision) == policy.revision
            ):
                if self._behind_since:  # revisions reached since: forgotten
                    for revision in [r for r in self._behind_since if r <= policy.revision]:
                        del self._behind_since[revision]
                        self._behind_decided.discard(revision)
                        self._published_asked.pop(revision, None)
                return policy, decision
            # Written under a revision this snapshot has not reached (the policy view lags
            # etcd, or etcd is away): a skip or a refusal now would be final, yet the
            # revision that admitted the write may well place its copy here. Wait for it,
            # for a bounded time (a revision that never comes, from a catalog rebuilt
            # since, must not hold the log for ever): past it, decided on this snapshot,
            # and a copy it placed here after all comes with the backfill of that
            # revision once the view has it. One bound per revision, not per event: a
            # run of them waits it once, and later ones are decided at once (checked
            # before etcd is asked: with etcd away, each ask waits out its timeout).
            now = time.monotonic()
            if event.policy_revision in self._unpublished:
                # Judged unpublished by an older view: etcd has moved on since, and may
                # hold it now. Asked afresh, with a fresh bound.
                del self._unpublished[event.policy_revision]
                self._behind_since.pop(event.policy_revision, None)
                self._behind_decided.discard(event.policy_revision)
                self._published_asked.pop(event.policy_revision, None)
            behind_since = self._behind_since.setdefault(event.policy_revision, now)
            if now - behind_since >= POLICY_BEHIND_MAX_S:
                if event.policy_revision not in self._behind_decided:
                    self._behind_decided.add(event.policy_revision)
                    log.warning(
                        "policy_behind_event_decided",
                        dataset=event.dataset,
                        event_revision=event.policy_revision,
                        revision=policy.revision,
                        decision=decision.admission.value,
                        waited_s=round(now - behind_since, 1),
                    )
                return policy, decision
            if await self._never_published(event, policy):
                return policy, decision
            log.info(
                "policy_behind_event",
                dataset=event.dataset,
                event_revision=event.policy_revision,
                revision=policy.revision,
                decision=decision.admission.value,
                retry_in_s=delay,
            )
            await self._sleep(delay)
            delay = min(self.config.retry_max_s, delay * 2)

    async def _never_published(self, event: LogEvent, policy: CompiledPolicy) -> bool:
        """Whether etcd, read directly, holds an older revision than the event's: its
        revision was never published here (an event of a catalog rebuilt since, or of
        another deployment sharing the log), and waiting for it would be waiting for
        nothing. False when etcd does not answer: the view may be the one behind."""
        if self._published_revision is None:
            return False
        # Asked at most once a second per revision (a run of its events shares the answer).
        now = time.monotonic()
        if now - self._published_asked.get(event.policy_revision, -math.inf) < 1.0:
            return False
        self._published_asked[event.policy_revision] = now
        published = await self._published_revision()
        if published is None or published >= event.policy_revision:
            return False
        # Verdicts of an older view are stale (and would otherwise pile up).
        self._unpublished = {
            r: seen for r, seen in self._unpublished.items() if seen == policy.revision
        }
        self._unpublished[event.policy_revision] = policy.revision
        log.warning(
            "policy_revision_unpublished",
            dataset=event.dataset,
            event_revision=event.policy_revision,
            published=published,
            revision=policy.revision,
        )
        return True

    async def _current_policy(self) -> CompiledPolicy:
        """The policy snapshot; while none is published, wait (fail closed: no copy is
        decided on nothing, and the offset is not committed)."""
        delay = self.config.retry_initial_s
        while True:
            try:
                return self._policy()
            except MeridianError as exc:
                if not exc.retriable:
                    raise
                log.warning("no_policy", error=str(exc), retry_in_s=delay)
                await self._sleep(delay)
                delay = min(self.config.retry_max_s, delay * 2)

    def _backoff(self, attempt: int) -> float:
        top = min(self.config.retry_max_s, self.config.retry_initial_s * 2.0 ** (attempt - 1))
        jitter: float = random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not secrecy
        return top * jitter

    async def _not_copied(self, dataset: str) -> None:
        if self.on_not_copied is not None:
            await self.on_not_copied(dataset)

    async def _refuse(self, record: Record, event: LogEvent, reason: str, revision: int) -> None:
        self._metrics.residency_refused.labels(event.dataset, "receive").inc()
        if (event.dataset, revision) not in self._refused_told:
            # The agent's refusal (its view lags a revision that places the dataset
            # here, say): backfilled once more under this revision, not at every event.
            if len(self._refused_told) >= 10_000:
                self._refused_told.clear()  # bounded: at worst, one more backfill each
            self._refused_told.add((event.dataset, revision))
            await self._not_copied(event.dataset)
        if isinstance(event, SetEvent):
            self._append(self._set_refused(event, revision))
        else:
            self._append(self._record(event, "refused", kind="refused", revision=revision))
        await self._dead_letter(
            dlq.without_inline_bytes(record, event), dlq.RESIDENCY, reason, event
        )

    async def _dead_letter(
        self, record: Record, reason: str, detail: str, event: LogEvent | None = None
    ) -> None:
        delay = self.config.retry_initial_s
        while True:
            try:
                await self._dlq.send(record, reason, detail)
                break
            except MeridianError as exc:
                # Kafka is the log we read from: wait for it rather than drop the letter.
                log.warning("dlq_unavailable", error=str(exc), retry_in_s=delay)
                await self._sleep(delay)
                delay = min(self.config.retry_max_s, delay * 2)
        self._metrics.dlq.labels(reason).inc()
        log.warning(
            "dead_lettered",
            reason=reason,
            detail=detail,
            event_id=event.event_id if event else None,
            source=f"{record.topic}/{record.partition}/{record.offset}",
        )

    def _record(
        self,
        event: ChangeEvent,
        state: str,
        *,
        kind: str = "replica",
        error: str | None = None,
        attempted: bool = False,
        revision: int | None = None,
    ) -> ReplicaRecord:
        version = event.version
        return ReplicaRecord(
            kind="refused" if kind == "refused" else "replica",
            event_id=event.event_id,
            dataset=event.dataset,
            key=event.key,
            hlc=str(version.hlc),
            op=version.op,
            size=version.size,
            digest=str(version.digest) if version.digest is not None else "",
            origin_region=event.origin_region,
            set_id=event.set,
            region=self.region,
            state=state,
            at=utcnow(),
            attempted=attempted,
            error=error,
            policy_revision=revision or event.policy_revision,
        )

    def _set_refused(self, event: SetEvent, revision: int) -> ReplicaRecord:
        """A refused set's journal row: op `set`, no key (the shipper records the refused
        transfer of `/set/<id>`, which no object name can be)."""
        return ReplicaRecord(
            kind="refused",
            event_id=event.event_id,
            dataset=event.dataset,
            key="",
            hlc=str(event.version_set.hlc),
            op="set",
            size=0,
            digest="",
            origin_region=event.origin_region,
            set_id=event.set_id,
            region=self.region,
            state="refused",
            at=utcnow(),
            policy_revision=revision or event.policy_revision,
        )

    def _append(self, rec: ReplicaRecord) -> None:
        self._journal.append(rec)
        self._on_record()


@dataclass(frozen=True)
class _Retry:
    """What `Applier._attempts` does after a failed attempt: wait, then try again;
    `counts=False`: the attempt is not counted against `max_attempts`."""

    delay_s: float
    counts: bool = True


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
