"""Port of WAN fault injection (Toxiproxy in tests and chaos scenarios).

Guarantees an adapter must give:
- Every call returns within its timeout or raises UnavailableError; a fault
  injector that hangs would turn a chaos test into a hung test.
- A toxic added "in both directions" affects upstream and downstream, so a round
  trip pays it twice.
- `disable` makes the proxy refuse new connections and drops open ones; `enable`
  undoes it. `reset` re-enables every proxy and removes every toxic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ProxyInfo:
    name: str
    listen: str
    upstream: str
    enabled: bool


class WanFaults(Protocol):
    def create_proxy(self, name: str, listen: str, upstream: str) -> ProxyInfo: ...

    def delete_proxy(self, name: str) -> None: ...

    def add_latency(self, proxy: str, latency_ms: int, jitter_ms: int = 0) -> None: ...

    def add_bandwidth(self, proxy: str, rate_kib_s: int) -> None: ...

    def add_timeout(self, proxy: str, timeout_ms: int) -> None: ...

    def remove_toxics(self, proxy: str) -> None: ...

    def disable(self, proxy: str) -> None: ...

    def enable(self, proxy: str) -> None: ...

    def reset(self) -> None: ...
