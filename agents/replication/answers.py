"""What a replica answers and journals for one pushed copy, in one place for every
receiver of pushes: `ReplicatePushes` (replica_pushes.py), `ReplicateSet`
(replica_sets.py) and the transfer service's `Replicate` / `ReplicateMany`
(agents/transfer/service.py) each carried a copy of these."""

from __future__ import annotations

import asyncio
import contextlib

from agents.rpc.status import code_of
from agents.store import ObjectStore
from agents.transfer.ports import PolicySource
from agents.transfer.records import Outcome, TransferTally
from controlplane.domain.version import Verdict, Version
from controlplane.errors import MeridianError
from meridian.v1 import agent_pb2

# The store's LWW verdict as the wire's apply outcome.
OUTCOMES = {
    Verdict.APPLY: agent_pb2.APPLY_OUTCOME_APPLIED,
    Verdict.SAME: agent_pb2.APPLY_OUTCOME_SAME,
    Verdict.OLDER: agent_pb2.APPLY_OUTCOME_OLDER,
    Verdict.COLLISION: agent_pb2.APPLY_OUTCOME_COLLISION,
}


def refusal(exc: MeridianError) -> agent_pb2.ReplicateItemResult:
    """One item's answer when it was refused: the code, message and class of `exc`, so
    the pusher rebuilds the same error (`agents.rpc.status.error_from_parts`)."""
    return agent_pb2.ReplicateItemResult(
        error_code=code_of(exc).name, error=str(exc), error_class=type(exc).__name__
    )


async def journal(
    store: ObjectStore,
    policy: PolicySource,
    tally: TransferTally,
    outcome: Outcome,
    version: Version,
    reason: str,
) -> None:
    """Journal the end of a transfer that committed nothing (refused, skipped) on its
    own, beside the version it names. Not counted here (the caller counts, alone or in
    bulk); a journal the store cannot write is not a reason to fail the push."""
    with contextlib.suppress(MeridianError):
        await asyncio.to_thread(
            store.record_transfer,
            tally.dataset,
            tally.key,
            version.hlc.text,
            tally.record(outcome, policy, reason),
        )
