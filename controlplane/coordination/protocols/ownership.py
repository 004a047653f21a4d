"""Dataset ownership with epochs, written only by compare-and-set transactions.

`/meridian/owners/<dataset>` holds `{"region", "reason", "actor", "at"}`, and for a
move also `{"kind", "from", "epoch_before"}`, so that the journal row of a move can be
rebuilt from the record alone if the mover crashed before writing it. Its
`mod_revision` is the dataset's **epoch**: the etcd revision of the transaction that
last moved ownership. Because etcd revisions only grow, so do epochs, and no two
owners can ever share one. Every write of the key compares the `mod_revision` the
writer read, so two racing writers cannot both win.

A planned switchover first writes `/meridian/handover/<dataset>` (`{"to", "from",
"epoch", "kind", "actor", "at", "deadline"}`, see `Handover`): while it exists,
writes to the dataset are refused with a retriable `HandingOverError` (see
`fencing.FencedResource`); the move itself deletes it in the same transaction that
rewrites the owner, and an abort deletes it alone, leaving owner and epoch
untouched. The mark lives on the runbook's lease, so a runbook that dies (SIGKILL,
a lost host) cannot freeze the dataset for longer than that lease's TTL: etcd
deletes the mark and writes resume under the previous owner. `decode_handover` is
the one parser of the mark.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.coordination.protocols import keys
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.errors import ConflictError, InvalidInputError
from controlplane.logs import get_logger
from controlplane.ports.coordination import (
    Cmp,
    Compare,
    Coordination,
    Delete,
    EventType,
    Get,
    KeyValue,
    Op,
    Put,
    Target,
)

log = get_logger("meridian.coordination.ownership")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns a dataset, since which epoch, and whether a handover is under way."""

    dataset: str
    region: str
    epoch: int
    reason: str = ""
    actor: str = ""
    at: str = ""
    handing_over_to: str | None = None
    kind: str | None = None  # set for a move (not for a home region's first claim)
    from_region: str | None = None
    epoch_before: int = 0


@dataclass(frozen=True, slots=True)
class MoveFacts:
    """What a move writes into the owner record beside the new owner (see the module doc)."""

    kind: str
    from_region: str


@dataclass(frozen=True, slots=True)
class Handover:
    """A switchover in progress: the mark at `/meridian/handover/<dataset>`.

    `epoch` is the owner's epoch the writes are frozen at; `create_revision` tells
    this mark from a later one for the same dataset (every transaction that ends a
    handover compares it); `lease` is the runbook's lease the mark lives on (0 for a
    mark written without one); `deadline` is when its runbook gives up waiting.
    """

    dataset: str
    from_region: str
    to_region: str
    epoch: int
    create_revision: int
    kind: str = "switchover"
    actor: str = ""
    at: str = ""
    deadline: str = ""
    lease: int = 0


class CorruptRecordError(InvalidInputError):
    """A coordination record (an owner or handover value) is not what Meridian writes."""


def handover_value(
    owner: Owner, to_region: str, *, kind: str, actor: str, deadline: datetime | None
) -> bytes:
    doc = {
        "to": to_region,
        "from": owner.region,
        "epoch": owner.epoch,
        "kind": kind,
        "actor": actor,
        "at": rfc3339(utcnow()),
        "deadline": rfc3339(deadline) or "",
    }
    return json.dumps(doc, sort_keys=True).encode()


def decode_handover(kv: KeyValue) -> Handover:
    """The handover mark stored in `kv` (a key under `keys.HANDOVER`)."""
    dataset = kv.key.removeprefix(keys.HANDOVER)
    try:
        doc = json.loads(kv.value)
        return Handover(
            dataset=dataset,
            from_region=str(doc["from"]),
            to_region=str(doc["to"]),
            epoch=int(doc["epoch"]),
            create_revision=kv.create_revision,
            kind=str(doc.get("kind") or "switchover"),
            actor=str(doc.get("actor", "")),
            at=str(doc.get("at", "")),
            deadline=str(doc.get("deadline") or ""),
            lease=kv.lease,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecordError(
            f"the handover mark {kv.key} (revision {kv.mod_revision}) is unreadable "
            f"({type(exc).__name__}: {exc}); end it with "
            f"`meridian switchover --dataset {dataset} --abort`"
        ) from exc


# What an owner is "handing over to" while its handover mark cannot be read: no region.
# Its writes stay frozen (as under any mark) until an operator's `switchover --abort`
# ends the mark (decode_handover's error says so), or a failover's claim, which deletes
# the mark as it moves the dataset.
UNREADABLE_MARK = "(unreadable handover mark)"
_reported: set[tuple[str, int]] = set()  # (key, mod_revision) of marks already logged


def handing_over(kvs: Sequence[KeyValue]) -> dict[str, str]:
    """Dataset -> the region its handover mark hands it to (`UNREADABLE_MARK` for a
    mark that cannot be read), for the marks read under `keys.HANDOVER`. One unreadable
    mark freezes its dataset alone, not every read of the owners (the failover watch,
    claims, runbooks and `dataset list` all read them); it is logged once."""
    out: dict[str, str] = {}
    for kv in kvs:
        dataset = kv.key.removeprefix(keys.HANDOVER)
        try:
            out[dataset] = decode_handover(kv).to_region
        except CorruptRecordError as exc:
            out[dataset] = UNREADABLE_MARK
            if (kv.key, kv.mod_revision) not in _reported:
                _reported.add((kv.key, kv.mod_revision))
                log.error("handover_mark_unreadable", key=kv.key, error=str(exc))
    return out


def decode_owner(dataset: str, value: bytes, epoch: int, handover: str | None) -> Owner:
    """The owner record of `dataset`; CorruptRecordError for a value Meridian did not
    write."""
    try:
        doc = json.loads(value)
        return Owner(
            dataset=dataset,
            region=str(doc["region"]),
            epoch=epoch,
            reason=str(doc.get("reason", "")),
            actor=str(doc.get("actor", "")),
            at=str(doc.get("at", "")),
            handing_over_to=handover,
            kind=str(doc["kind"]) if doc.get("kind") else None,
            from_region=str(doc["from"]) if doc.get("from") else None,
            epoch_before=int(doc.get("epoch_before", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecordError(
            f"the owner record of {dataset} ({keys.owner(dataset)}) is not one Meridian "
            f"writes ({exc!r}); automation leaves it alone: delete it (`etcdctl del "
            f"{keys.owner(dataset)}`) and its home region's controller claims it again"
        ) from None


def decode_owners(kvs: Sequence[KeyValue], marks: dict[str, str]) -> dict[str, Owner]:
    """The owners of the records read under `keys.OWNERS`, by dataset. An unreadable one
    is left out (logged once per revision), so it stops no read of every owner (the
    failover watch, claims, the journal's backfill, runbooks and `dataset list` all
    make one): its dataset alone is left alone, and its agents refuse its writes."""
    out: dict[str, Owner] = {}
    for kv in kvs:
        ds = kv.key.removeprefix(keys.OWNERS)
        try:
            out[ds] = decode_owner(ds, kv.value, kv.mod_revision, marks.get(ds))
        except CorruptRecordError as exc:
            if (kv.key, kv.mod_revision) not in _reported:
                _reported.add((kv.key, kv.mod_revision))
                log.error("owner_record_unreadable", key=kv.key, error=str(exc))
    return out


def owner_value(
    region: str, reason: str, actor: str, move: MoveFacts | None = None, epoch_before: int = 0
) -> bytes:
    doc: dict[str, object] = {
        "region": region,
        "reason": reason,
        "actor": actor,
        "at": rfc3339(utcnow()),
    }
    if move is not None:
        doc.update(kind=move.kind, epoch_before=epoch_before, **{"from": move.from_region})
    return json.dumps(doc, sort_keys=True).encode()


class Ownership:
    """Read, claim, move and watch dataset owners through the coordination port."""

    def __init__(self, coord: Coordination) -> None:
        self.coord = coord

    async def get(self, dataset: str) -> Owner | None:
        return (await self.get_as_of(dataset))[0]

    async def get_as_of(self, dataset: str) -> tuple[Owner | None, int]:
        """The owner (None: released) and the etcd revision the read is as of."""
        # One read for both keys: consistent, and one round trip on a WAN.
        res = await self.coord.txn([], [Get(keys.owner(dataset)), Get(keys.handover(dataset))])
        owner_kvs, handover_kvs = res.reads
        if not owner_kvs:
            return None, res.revision
        kv = owner_kvs[0]
        to = decode_handover(handover_kvs[0]).to_region if handover_kvs else None
        return decode_owner(dataset, kv.value, kv.mod_revision, to), res.revision

    async def handover(self, dataset: str) -> Handover | None:
        """The handover mark of `dataset`, or None when no switchover is in progress."""
        kv = await self.coord.get(keys.handover(dataset))
        return None if kv is None else decode_handover(kv)

    async def list(self) -> dict[str, Owner]:
        """Every owned dataset, as of one consistent read."""
        res = await self.coord.txn(
            [], [Get(keys.OWNERS, prefix=True), Get(keys.HANDOVER, prefix=True)]
        )
        owners_kv, handover_kv = res.reads
        return decode_owners(owners_kv, handing_over(handover_kv))

    async def claim(
        self,
        dataset: str,
        region: str,
        *,
        expect_epoch: int,
        reason: str,
        actor: str,
        guards: Sequence[Compare] = (),
        move: MoveFacts | None = None,
    ) -> int:
        """Make `region` the owner if the key is still at `expect_epoch` (0: unowned).

        Returns the new epoch. Raises `ConflictError` (retriable: re-read first) if
        the key moved or any extra guard (e.g. "the source region is still dead")
        failed. A pending handover is cleared by the same transaction.
        """
        compares = [Compare(keys.owner(dataset), Target.MOD, Cmp.EQUAL, expect_epoch), *guards]
        ops: list[Op] = [
            Put(keys.owner(dataset), owner_value(region, reason, actor, move, expect_epoch)),
            Delete(keys.handover(dataset)),
        ]
        res = await self.coord.txn(compares, ops)
        if not res.succeeded:
            raise ConflictError(
                f"ownership of {dataset} changed since epoch {expect_epoch} was read "
                "(or a guard failed); re-read it and decide again"
            )
        return res.revision

    async def begin_handover(
        self,
        dataset: str,
        owner: Owner,
        to_region: str,
        actor: str,
        *,
        lease: int = 0,
        kind: str = "switchover",
        deadline: datetime | None = None,
    ) -> Handover:
        """Freeze writes: mark `dataset` as handing over from its owner at `owner.epoch`.

        `lease` is the caller's (a runbook's) lease: the mark goes with it, so a dead
        runbook's freeze ends within one TTL. Only tests and tools pass 0."""
        value = handover_value(owner, to_region, kind=kind, actor=actor, deadline=deadline)
        res = await self.coord.txn(
            [
                Compare(keys.owner(dataset), Target.MOD, Cmp.EQUAL, owner.epoch),
                Compare(keys.handover(dataset), Target.CREATE, Cmp.EQUAL, 0),
            ],
            [Put(keys.handover(dataset), value, lease), Get(keys.handover(dataset))],
        )
        if not res.succeeded:
            raise ConflictError(
                f"{dataset} is already handing over, or its owner changed since epoch "
                f"{owner.epoch}; re-read it and try again"
            )
        return decode_handover(res.reads[0][0])

    async def abort_handover(self, handover: Handover) -> bool:
        """Unfreeze without moving; True if our handover mark was still there."""
        res = await self.coord.txn(
            [
                Compare(
                    keys.handover(handover.dataset),
                    Target.CREATE,
                    Cmp.EQUAL,
                    handover.create_revision,
                )
            ],
            [Delete(keys.handover(handover.dataset))],
        )
        return res.succeeded

    async def complete_handover(
        self,
        handover: Handover,
        *,
        reason: str,
        actor: str,
        kind: str = "switchover",
        target_state_revision: int | None = None,
    ) -> int:
        """Move ownership to the handover's target and unfreeze, atomically; the new epoch.

        The target must still be alive when the transaction runs: it was checked when
        the move was planned, but the catch-up wait may have outlived it. With
        `target_state_revision` (the mod revision of its state key when checked, 0:
        none), its state must be unchanged too: one drained or fenced meanwhile takes
        nothing."""
        guards = [
            Compare(
                keys.handover(handover.dataset), Target.CREATE, Cmp.EQUAL, handover.create_revision
            ),
            Compare(keys.alive(handover.to_region), Target.VERSION, Cmp.GREATER, 0),
        ]
        if target_state_revision is not None:
            guards.append(
                Compare(
                    keys.state(handover.to_region), Target.MOD, Cmp.EQUAL, target_state_revision
                )
            )
        return await self.claim(
            handover.dataset,
            handover.to_region,
            expect_epoch=handover.epoch,
            reason=reason,
            actor=actor,
            guards=guards,
            move=MoveFacts(kind, handover.from_region),
        )

    async def watch(self, start_revision: int = 0) -> AsyncIterator[tuple[str, Owner | None]]:
        """(dataset, owner or None when released) for every ownership change after a revision."""
        async for ev in self.coord.watch(keys.OWNERS, prefix=True, start_revision=start_revision):
            ds = ev.kv.key.removeprefix(keys.OWNERS)
            if ev.type is EventType.DELETE:
                yield ds, None
                continue
            found = decode_owners([ev.kv], {})  # an unreadable one is logged and skipped
            if ds in found:
                yield ds, found[ds]
