"""How `policy apply` publishes the compiled policy to `/meridian/policy/current`.

Publishing goes through the coordination port (`controlplane.ports.coordination`)
and its key layout (`controlplane.coordination.protocols.keys`); the value is
`CompiledPolicy.to_json()` and is read back by `controlplane.policy.current`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.coordination.protocols import keys
from controlplane.errors import MeridianError, UnavailableError
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Coordination

POLICY_KEY = keys.POLICY_CURRENT


class PolicyPublisher(Protocol):
    """Publishes the applied revision.

    Guarantees: `publish` replaces the single key with the whole compiled policy in
    one write and returns only once the store acknowledged it; it is idempotent
    (publishing the same revision twice is harmless); on failure it raises
    `UnavailableError` and changes nothing else. It never orders revisions:
    callers publish the catalog's head."""

    async def publish(self, policy: CompiledPolicy) -> None: ...


class CoordinationPolicyPublisher:
    """`PolicyPublisher` over an open coordination port (one put of the key)."""

    def __init__(self, coord: Coordination) -> None:
        self._coord = coord

    async def publish(self, policy: CompiledPolicy) -> None:
        await self._coord.put(POLICY_KEY, policy.to_json())


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
