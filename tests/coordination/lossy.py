"""An etcd adapter whose lease answers can be lost on demand (a one-way partition)."""

from __future__ import annotations

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import UnavailableError


class AnswersLost(EtcdCoordination):
    """While `cut`, each call reaches etcd and its answer is lost (a one-way partition):
    `renewals` counts the renewals that reached etcd meanwhile."""

    cut = False
    renewals = 0

    async def refresh(self, lease_id: int) -> int:
        ttl = await super().refresh(lease_id)
        if self.cut:
            self.renewals += 1
            raise UnavailableError("the answer to a renewal was lost (test)")
        return ttl

    async def lease_ttl(self, lease_id: int) -> int:
        ttl = await super().lease_ttl(lease_id)
        if self.cut:
            raise UnavailableError("the answer to a TTL read was lost (test)")
        return ttl
