"""The port through which `policy apply` announces a revision, and its etcd adapter.

Region controllers watch `/meridian/policy/current`, then re-read placements from
the catalog. The value is JSON: `{"digest", "revision", "applied_at"}`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controlplane.errors import UnavailableError

POLICY_KEY = "/meridian/policy/current"


@dataclass(frozen=True)
class PublishedPolicy:
    digest: str
    revision: int
    applied_at: datetime

    def to_json(self) -> str:
        stamp = self.applied_at.isoformat().replace("+00:00", "Z")
        return json.dumps({"digest": self.digest, "revision": self.revision, "applied_at": stamp})


class PolicyPublisher(Protocol):
    """Announces the applied revision.

    Guarantees: `publish` overwrites the single key with the given value and returns
    only once the store acknowledged it; it is idempotent (publishing the same value
    twice is harmless); on failure it raises `UnavailableError` and changes nothing
    else. It never orders revisions: callers publish the catalog's head."""

    async def publish(self, value: PublishedPolicy) -> None: ...


class EtcdPolicyPublisher:
    """`PolicyPublisher` over etcd3aio (one put on `/meridian/policy/current`)."""

    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float = 5.0) -> None:
        self._endpoints = [f"{host}:{port}" for host, port in endpoints]
        self._timeout_s = timeout_s

    async def publish(self, value: PublishedPolicy) -> None:
        from etcd3aio import Etcd3Client

        client = Etcd3Client(self._endpoints, rpc_max_attempts=2)
        try:
            await client.connect()
            if client.kv is None:
                raise RuntimeError("etcd3aio client did not connect")
            await asyncio.wait_for(
                client.kv.put(POLICY_KEY, value.to_json(), timeout=self._timeout_s),
                self._timeout_s * 2,
            )
        except Exception as exc:  # grpc / etcd3aio errors: one sentence at the edge
            raise UnavailableError(
                f"could not publish the policy revision to etcd at {', '.join(self._endpoints)} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); the "
                "revision is recorded in the catalog: re-run `meridian policy apply` to publish it"
            ) from exc
        finally:
            await client.close()
