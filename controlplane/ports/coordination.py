"""The coordination port: a linearizable key-value store with leases, transactions and watches.

Meridian's global decisions (region liveness, dataset ownership, locks, the applied
policy, maintenance mode) live behind this port; the only adapter is etcd v3
(`controlplane.adapters.etcd`). Everything above it is written against this
interface so that unit tests may use a fake.

Safety contract every implementation must honour
-------------------------------------------------
* **Linearizable reads and writes.** `get`, `get_prefix`, `put`, `delete` and `txn`
  observe every write acknowledged before they started (no stale follower reads).
* **Revisions.** Every write bumps one store-wide revision that only grows. A key
  carries `create_revision` (revision of its creation) and `mod_revision` (revision
  of its last write). Dataset epochs and lock fencing tokens are these numbers, so
  their monotonicity is the store's, not ours.
* **Compare-and-set.** `txn` evaluates all its comparisons and applies one branch
  atomically at a single new revision. Ownership is only ever written through
  `txn` comparing the `mod_revision` the writer read (see
  `controlplane.coordination.protocols.ownership`); a plain `put` must never be used for it.
* **Leases.** A key put with a lease is deleted when the lease expires or is
  revoked. Expiry is decided by the store's leader, with 1 s granularity, and a
  leader change *resets* every lease to its full TTL: a holder may therefore live
  up to about two TTLs after its last renewal, never less than one. Callers that
  act on "the lease is still mine" must re-check with `lease_ttl` after any wait
  (etcd issue 11456: a lock could be granted on an already expired lease).
* **Keepalive** (`keep_alive`) renews in the background and sets `lost` when the
  store reports the lease gone, or when no renewal succeeded for a whole TTL. Once
  `lost` is set it stays set; the holder must assume it no longer holds anything.
* **Watch** delivers every change after `start_revision` in revision order, with
  no gaps, resuming transparently across reconnects; a compacted start revision
  raises instead of silently skipping events.

Why a lock without fencing is unsafe
------------------------------------
A lease-backed lock (or ownership key) only says who *should* act. A holder that
is paused longer than its lease (GC, SIGSTOP, a VM migration, a slow disk) wakes
up still believing it holds the lock while etcd has already granted it to
someone else: two writers act at once and no check inside the lock can prevent
it, because the paused holder runs no code until its next write. Safety therefore
comes from the resource: each grant carries a token that only grows (the key's
`create_revision` for a lock, the owner key's `mod_revision` for a dataset epoch),
every write presents it, and the resource refuses a token older than the newest
it has seen (`controlplane.coordination.protocols.fencing.FencedResource`).

Timing-critical methods: `keep_alive` (renewal cadence decides failover time) and
`watch` (delivery latency of a liveness key's deletion starts every failover).

Errors: implementations raise `UnavailableError` (retriable) when the store cannot
be reached within the deadline, `OperationTimeoutError` on a deadline, and
`NotFoundError` for an unknown lease; never a transport-specific exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Protocol, Self


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One stored key as read at some revision."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class Target(StrEnum):
    """What a `Compare` looks at."""

    MOD = "mod_revision"
    CREATE = "create_revision"
    VERSION = "version"
    VALUE = "value"


class Cmp(StrEnum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


@dataclass(frozen=True, slots=True)
class Compare:
    """One guard of a transaction: `target(key) cmp operand`.

    A missing key has revisions and version 0, so `Compare(k, Target.CREATE, Cmp.EQUAL, 0)`
    means "k does not exist" and `Compare(k, Target.MOD, Cmp.EQUAL, r)` means "k is
    exactly as I read it at r".
    """

    key: str
    target: Target
    cmp: Cmp
    operand: int | bytes


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of a transaction: which branch ran, at which revision, and its reads."""

    succeeded: bool
    revision: int
    reads: list[list[KeyValue]] = field(default_factory=list)


class EventType(StrEnum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch; `kv.value` is empty for a deletion."""

    type: EventType
    kv: KeyValue
    revision: int


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl_s: int


class KeepAlive(Protocol):
    """Handle on a background lease renewal; see the module docstring for `lost`."""

    lease: Lease

    @property
    def lost(self) -> asyncio.Event: ...

    async def stop(self) -> None:
        """Stop renewing (idempotent); the lease then expires on its own unless revoked."""


class Coordination(Protocol):
    """A linearizable store with leases, transactions and watches (see module docstring)."""

    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        """The key, or None when absent; with `revision`, as it was at that revision
        (`NotFoundError` when the store has compacted that revision away)."""

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix` sorted by key, and the revision they were read at."""

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write unconditionally; returns the new revision. Not for ownership keys."""

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete a key (or every key under a prefix); returns how many were deleted."""

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Apply `success` if every compare holds, else `failure`, atomically."""

    async def grant(self, ttl_s: int) -> Lease:
        """A new lease of `ttl_s` seconds (the store may round it up)."""

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease now, deleting its keys; revoking an unknown lease is not an error."""

    async def lease_ttl(self, lease_id: int) -> int:
        """Remaining seconds of a lease, or -1 when it has expired or never existed."""

    async def refresh(self, lease_id: int) -> int:
        """Renew once; returns the new TTL, or -1 when the lease is already gone."""

    def keep_alive(self, lease: Lease) -> KeepAlive:
        """Start renewing `lease` in the background (see the module docstring)."""

    def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        """Changes to a key or prefix after `start_revision` (0: from now)."""

    async def revision(self) -> int:
        """The store's current revision."""

    async def close(self) -> None:
        """Release connections and stop every keepalive (idempotent)."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
