"""A replica's side of `ReplicatePushes` (issue 13): several small versions of critical
datasets pushed by their owner in one call, committed in one store transaction.

The owner batches only what was already queued behind a push still running to this
agent (sync.py, `_lanes`), so a lone write still goes alone as a `Replicate`. Every
guarantee of a lone push holds per item:

* each item is fenced as a `Replicate` (residency, the watched newest epoch, the
  owner at that epoch); a refused item is answered with its error and recorded
  refused, and does not fail the others;
* then, before the commit, etcd's owner record read now must name the pusher at
  the item's epoch (`admit_replica_current`): asked once per (dataset, epoch, origin)
  of the call rather than once per item, which is the point of the batch. When the
  call has one such group (nearly always), the read begins as the call arrives and
  the store stages the bytes meanwhile, waiting for it at `apply_many`'s gate before
  any lock or row: a round trip to etcd off the write's latency, and a refusal still
  stores nothing (at most `GATED_MOST` calls wait so, each holding a thread);
* the admitted items are applied by LWW in ONE `apply_many` (one transaction, one
  syncfs), each with its own transfer record; the answer of each item is the newest
  version held after the call, as a `Replicate` answers.

A malformed item (a bad version, a delta, a set member, a standard dataset's item,
a key named twice) fails the whole call and stores nothing: the owner never sends
one, so it is a bug to be seen, not a refusal to count.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence

from agents.admission import Admission
from agents.metrics import AgentMetrics
from agents.replication.answers import OUTCOMES, journal, refusal
from agents.store import ObjectStore
from agents.store.model import ApplyResult, JsonValue
from agents.to_the_end import run_to_the_end
from agents.transfer.ports import PolicySource
from agents.transfer.records import Outcome, TransferTally, count_many, new_transfer_id
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version
from controlplane.errors import InvalidInputError, MeridianError, UnavailableError
from controlplane.logs import get_logger
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2

log = get_logger("meridian.agent.replication")

Group = tuple[str, int, str]  # dataset, epoch, origin region
# How long the store's thread waits for the owner read at its gate. The read has its
# own etcd deadline, far shorter; this only keeps a thread from hanging for ever.
READ_WAIT_S = 60.0
# Calls whose store thread may wait at the gate at once: each holds one of the agent's
# threads while etcd answers, so a slow etcd under many pushes could otherwise starve
# the store's other callers. Past it, a call reads first, then stages, as it did.
GATED_MOST = 8


class _RefusedError(Exception):
    """The owner read refused a call's items (raised at the store's gate: nothing stored)."""

    def __init__(self, why: MeridianError) -> None:
        super().__init__(str(why))
        self.why = why


def _passed(read: concurrent.futures.Future[Placement], group: Group) -> None:
    """The store's gate (in its thread): the owner read of `group` has admitted the copy."""
    try:
        read.result(timeout=READ_WAIT_S)
    except MeridianError as exc:
        raise _RefusedError(exc) from exc
    except (TimeoutError, concurrent.futures.CancelledError) as exc:
        # Not answered in time, or cancelled (the call was, or the agent stops).
        read.cancel()
        dataset, epoch, origin = group
        log.warning("replica_owner_read_abandoned", dataset=dataset, epoch=epoch, origin=origin)
        raise _RefusedError(
            UnavailableError(
                f"the owner of {dataset} could not be read from etcd for a copy at epoch "
                f"{epoch} from {origin} ({type(exc).__name__}); refused, nothing stored"
            )
        ) from exc


class ReplicaPushes:
    """See the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        admission: Admission,
        region: str,
        metrics: AgentMetrics,
        policy: PolicySource,
        *,
        alone: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self._alone = alone
        self.admission = admission
        self.region = region
        self.metrics = metrics
        self.policy = policy
        self._gated = 0  # calls waiting at (or past) the store's gate; loop thread only

    def serves(self) -> bool:
        """Only an agent alone in its region takes a batch (see PushReceiver)."""
        return self._alone()

    async def receive(
        self, request: agent_pb2.ReplicatePushesRequest
    ) -> agent_pb2.ReplicatePushesResponse:
        results = [agent_pb2.ReplicateItemResult() for _ in request.items]
        admitted: list[tuple[int, Version, TransferTally, Group]] = []
        refused: list[tuple[TransferTally, Version, MeridianError]] = []
        names: set[tuple[str, str]] = set()
        for n, item in enumerate(request.items):
            header = item.header
            where = f"ReplicatePushesRequest.items[{n}]"
            version = version_from_wire(header.version, f"{where}.header.version")
            if (header.dataset, header.key) in names:
                raise InvalidInputError(f"{where}: {header.dataset}/{header.key} is named twice")
            names.add((header.dataset, header.key))
            if header.HasField("basis") or header.HasField("set"):
                raise InvalidInputError(
                    f"{where}: a delta or a set member is pushed alone with Replicate"
                )
            if version.is_tombstone and item.data:
                raise InvalidInputError(f"{where}: the delete of {header.key} carries bytes")
            origin = header.origin_region or version.hlc.region
            tally = TransferTally(
                new_transfer_id(),
                header.dataset,
                header.key,
                origin,
                self.region,
                "in",
                method="push",
                logical_bytes=version.size,
                wire_bytes=len(item.data),
                policy_revision=header.policy_revision or None,
            )
            try:
                placement = self.admission.admit_store(header.dataset)
                if placement.dataset_class != "critical":
                    raise InvalidInputError(
                        f"{where}: {header.dataset} is a standard dataset; its copies go "
                        "with ReplicateMany"
                    )
                self.admission.admit_replica(
                    header.dataset, header.epoch, origin, fresh_read_next=True
                )
            except InvalidInputError:
                raise
            except MeridianError as exc:
                results[n] = refusal(exc)
                refused.append((tally, version, exc))
                continue
            admitted.append((n, version, tally, (header.dataset, header.epoch, origin)))
        # The owner record read now, once per (dataset, epoch, origin) of the call; a new
        # owner's listing waits for the commit that follows it.
        groups = list(dict.fromkeys(g for _, _, _, g in admitted))
        with self.admission.receiving(g[0] for g in groups):
            return await self._receive_admitted(request, results, admitted, refused, groups)

    async def _receive_admitted(
        self,
        request: agent_pb2.ReplicatePushesRequest,
        results: list[agent_pb2.ReplicateItemResult],
        admitted: list[tuple[int, Version, TransferTally, Group]],
        refused: list[tuple[TransferTally, Version, MeridianError]],
        groups: list[Group],
    ) -> agent_pb2.ReplicatePushesResponse:
        read: concurrent.futures.Future[Placement] | None = None
        verdicts: dict[Group, MeridianError | None] = {}
        if len(groups) == 1 and self._gated < GATED_MOST:
            # The usual call (a lone push, or a batch of one dataset): the read begins
            # now and the store's thread waits for it once the bytes are staged, so it
            # overlaps the staging; no row is written before it passed.
            read = asyncio.run_coroutine_threadsafe(
                self.admission.admit_replica_current(*groups[0]), asyncio.get_running_loop()
            )
            verdicts[groups[0]] = None
        else:
            for group in groups:
                try:
                    await self.admission.admit_replica_current(*group)
                    verdicts[group] = None
                except MeridianError as exc:
                    verdicts[group] = exc
        committing: list[tuple[int, Version, TransferTally]] = []
        for n, version, tally, group in admitted:
            verdict = verdicts[group]
            if verdict is None:
                committing.append((n, version, tally))
            else:
                results[n] = refusal(verdict)
                refused.append((tally, version, verdict))
        ended: list[tuple[TransferTally, Outcome]] = []
        if committing:
            items = [
                (
                    request.items[n].header.dataset,
                    request.items[n].header.key,
                    version,
                    None if version.is_tombstone else [request.items[n].data],
                )
                for n, version, _ in committing
            ]
            transfers = [tally.record("completed", self.policy) for _, _, tally in committing]
            try:
                applied = await self._apply(items, transfers, read, groups)
            except _RefusedError as exc:
                applied = []
                for n, version, tally in committing:
                    results[n] = refusal(exc.why)
                    refused.append((tally, version, exc.why))
                committing = []
            for (n, version, tally), got in zip(committing, applied, strict=True):
                results[n] = agent_pb2.ReplicateItemResult(
                    outcome=OUTCOMES[got.verdict], held=version_to_wire(got.newest)
                )
                if got.verdict.applies or got.restored:
                    ended.append((tally, "completed"))
                else:
                    # Journalled as a lone Replicate's no-op is (a critical push is rare
                    # to skip: an owner's retry, a catch-up racing a new write).
                    await journal(
                        self.store, self.policy, tally, "skipped", version, got.verdict.value
                    )
                    ended.append((tally, "skipped"))
        for tally, version, why in refused:
            await journal(self.store, self.policy, tally, "refused", version, str(why))
            ended.append((tally, "refused"))
        count_many(self.metrics, ended)
        return agent_pb2.ReplicatePushesResponse(results=results, region=self.region)

    async def _apply(
        self,
        items: Sequence[tuple[str, str, Version, list[bytes] | None]],
        transfers: Sequence[Mapping[str, JsonValue] | None],
        read: concurrent.futures.Future[Placement] | None,
        groups: list[Group],
    ) -> list[ApplyResult]:
        """`apply_many` of the admitted items, behind the gate of `read` when there is
        one. Raises `_RefusedError` when the read refused them (nothing stored)."""
        # A cancelled call (its deadline, the server stopping) waits for the thread to
        # end, so the registration a new owner's listing waits on outlives the commit.
        if read is None:
            return await run_to_the_end(
                functools.partial(self.store.apply_many, items, transfers=transfers)
            )
        self._gated += 1
        try:
            return await run_to_the_end(
                functools.partial(
                    self.store.apply_many,
                    items,
                    transfers=transfers,
                    gate=functools.partial(_passed, read, groups[0]),
                ),
                # A thread still before the gate then stores nothing; one past it
                # commits, as a push whose answer was lost does.
                on_cancel=read.cancel,
            )
        except MeridianError:
            # Failed before the gate (a skewed clock, a bad digest, a closed store): the
            # read's refusal, when it refuses, is still the answer, as when it came first.
            if not read.cancelled():
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(read)
            why = None if read.cancelled() else read.exception()
            if isinstance(why, MeridianError):
                raise _RefusedError(why) from None
            raise
        finally:
            self._gated -= 1
