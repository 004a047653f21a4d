"""How `policy apply` publishes the compiled policy to `/meridian/policy/current`.

Publishing goes through the coordination port (`controlplane.ports.coordination`)
and its key layout (`controlplane.coordination.protocols.keys`); the value is
`CompiledPolicy.to_json()` and is read back by `controlplane.policy.current`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.coordination.protocols import keys
from controlplane.errors import ConflictError, InvalidInputError, MeridianError, UnavailableError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Cmp, Compare, Coordination, Put, Target

POLICY_KEY = keys.POLICY_CURRENT
PUBLISH_ATTEMPTS = 5
log = get_logger(__name__)


class PolicyPublisher(Protocol):
    """Publishes the applied revision.

    Guarantees: `publish` replaces the single key with the whole compiled policy in
    one write and returns only once the store acknowledged it; it is idempotent
    (publishing the same revision twice is harmless); it never replaces a newer
    revision of the same catalog (`CompiledPolicy.supersedes`: two applies racing
    leave the newer published, whichever writes last); on failure it raises
    `UnavailableError` and changes nothing else."""

    async def publish(self, policy: CompiledPolicy) -> None: ...


class CoordinationPolicyPublisher:
    """`PolicyPublisher` over an open coordination port (one put of the key)."""

    def __init__(self, coord: Coordination) -> None:
        self._coord = coord

    async def publish(self, policy: CompiledPolicy) -> None:
        value = policy.to_json()
        for _ in range(PUBLISH_ATTEMPTS):
            held = await self._coord.get(POLICY_KEY)
            if held is not None and held.value == value:
                # Already there: a rewrite would only bump the key's revision, voiding
                # every automatic failover decided on it meanwhile (automatic_guards).
                return
            if held is not None:
                try:
                    current = CompiledPolicy.from_json(held.value)
                except InvalidInputError:
                    current = None  # unreadable: replacing it is the repair
                if current is not None and not policy.supersedes(current):
                    log.warning(
                        "policy_publish_skipped",
                        revision=policy.revision,
                        published=current.revision,
                        reason="a newer revision of this catalog is already published",
                    )
                    return
            seen = held.mod_revision if held is not None else 0
            done = await self._coord.txn(
                [Compare(POLICY_KEY, Target.MOD, Cmp.EQUAL, seen)], [Put(POLICY_KEY, value)]
            )
            if done.succeeded:
                return
        raise ConflictError(
            f"could not publish policy revision {policy.revision}: {POLICY_KEY} kept "
            f"changing under {PUBLISH_ATTEMPTS} attempts; re-run `meridian policy apply`"
        )


class EtcdPolicyPublisher:
    """`PolicyPublisher` that opens the etcd adapter for the one write, then closes it."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], timeout_s: float = 5.0) -> None:
        self._endpoints = [f"{host}:{port}" for host, port in endpoints]
        self._timeout_s = timeout_s

    async def publish(self, policy: CompiledPolicy) -> None:
        from controlplane.adapters.etcd import EtcdCoordination

        policy.to_json()  # a value etcd would refuse fails here, before connecting
        coord = EtcdCoordination(self._endpoints, timeout_s=self._timeout_s)
        try:
            await coord.connect()
            await CoordinationPolicyPublisher(coord).publish(policy)
        except MeridianError as exc:
            raise UnavailableError(
                f"could not publish policy revision {policy.revision} to etcd at "
                f"{', '.join(self._endpoints)} ({exc}); the revision is recorded in the "
                f"catalog: re-run `meridian policy apply` to publish it"
            ) from exc
        finally:
            await coord.close()
