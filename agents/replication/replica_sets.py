"""The replica's side of `ReplicateSet`: version sets pushed by a critical dataset's
owner after their members (spec/dataplane.md, *Version sets*).

Fenced exactly like `Replicate`: the residency and the watched newest epoch first,
then etcd's owner record read now, just before anything is recorded, so a deposed
owner's set is never recorded (hence never acked) here. Each set is then applied by
the store (last set wins per set id, by HLC): it is recorded at once and becomes
visible only once every member is stored here, so a reader of this region sees the
previous set until then. The answer says, per set, whether it is complete here and
which members are still missing, so the owner can push those before it counts this
region toward the set's ack.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from agents.admission import Admission
from agents.replication.answers import OUTCOMES
from agents.store import ObjectStore
from agents.to_the_end import run_to_the_end
from controlplane.domain.version import Verdict
from controlplane.domain.version_set import VersionSet
from controlplane.errors import InvalidInputError, NotFoundError
from controlplane.logs import get_logger
from meridian.convert import version_set_from_wire
from meridian.v1 import agent_pb2

log = get_logger("meridian.agent.replication")

MAX_SETS = 1000  # one request; the owner's catch-up pages its sets by this


class ReplicaSets:
    """The agent servicer's `sets` hook (agents/service): one per agent."""

    def __init__(self, store: ObjectStore, admission: Admission, region: str) -> None:
        self.store = store
        self.admission = admission
        self.region = region
        # Awaited before the sets are applied (the servicer's `holding_sets`).
        self.holding_sets: Callable[[], Awaitable[None]] | None = None

    async def receive_sets(
        self, request: agent_pb2.ReplicateSetRequest
    ) -> agent_pb2.ReplicateSetResponse:
        if self.holding_sets is not None:
            await self.holding_sets()
        return await receive_sets(self.store, self.admission, self.region, request)


async def receive_sets(
    store: ObjectStore, admission: Admission, region: str, request: agent_pb2.ReplicateSetRequest
) -> agent_pb2.ReplicateSetResponse:
    """Apply the pushed sets (see the module docstring); raises the fencing or
    residency refusal, or InvalidInputError naming the bad field."""
    sets = _parse(request)
    dataset = sets[0].dataset
    origin = request.origin_region
    if not origin:
        raise InvalidInputError("ReplicateSetRequest.origin_region: the pusher must name it")
    placement = admission.admit_replica(dataset, request.epoch, origin, fresh_read_next=True)
    critical = placement.dataset_class == "critical"
    if not critical and request.epoch:
        raise InvalidInputError(
            f"ReplicateSetRequest.epoch: {dataset} is a standard dataset, which takes "
            f"epoch 0, not {request.epoch}"
        )
    # Between the owner read and the commit, a new owner's listing waits for it.
    with admission.receiving([dataset] if critical else []):
        if critical:
            await admission.admit_replica_current(dataset, request.epoch, origin)
        # Held to its end when the call is cancelled, so the registration outlives it.
        out = await run_to_the_end(functools.partial(_apply_all, store, sets))
    log.info(
        "sets_replicated",
        dataset=dataset,
        origin=origin,
        sets=len(sets),
        complete=sum(1 for s in out if s.complete),
    )
    return agent_pb2.ReplicateSetResponse(sets=out, region=region)


def _parse(request: agent_pb2.ReplicateSetRequest) -> list[VersionSet]:
    if not request.sets:
        raise InvalidInputError("ReplicateSetRequest.sets: push at least one set")
    if len(request.sets) > MAX_SETS:
        raise InvalidInputError(
            f"ReplicateSetRequest.sets: at most {MAX_SETS} sets per request, got "
            f"{len(request.sets)}"
        )
    sets = [
        version_set_from_wire(s, f"ReplicateSetRequest.sets[{n}]", stamped=True)
        for n, s in enumerate(request.sets)
    ]
    datasets = {s.dataset for s in sets}
    if len(datasets) > 1:
        raise InvalidInputError(
            f"ReplicateSetRequest.sets: the sets of one request belong to one dataset, "
            f"got {', '.join(sorted(datasets))}"
        )
    return sets


def _apply_all(store: ObjectStore, sets: list[VersionSet]) -> list[agent_pb2.ReplicatedSet]:
    out: list[agent_pb2.ReplicatedSet] = []
    for vs in sets:
        assert vs.hlc is not None  # noqa: S101 - parsed with stamped=True
        members = {m.key: m.version for m in vs.members}
        verdict = store.apply_set(vs.dataset, vs.id, vs.hlc, members)
        if verdict in (Verdict.APPLY, Verdict.SAME):
            try:
                missing = store.missing_members(vs.dataset, vs.id)
            except NotFoundError:
                # Forgotten since (a newer set completed meanwhile and this one can
                # never be): superseded, as if it had come after that one.
                out.append(agent_pb2.ReplicatedSet(id=vs.id, outcome=OUTCOMES[Verdict.OLDER]))
                continue
            out.append(
                agent_pb2.ReplicatedSet(
                    id=vs.id, outcome=OUTCOMES[verdict], complete=not missing, missing=missing
                )
            )
        else:
            # A newer set of this id is held (or another with the same HLC): the pushed
            # one is not what this region shows, so it is not complete here.
            out.append(agent_pb2.ReplicatedSet(id=vs.id, outcome=OUTCOMES[verdict]))
    return out
